package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Queue is a queue of messages under one parent node: FIFO, or by
// priority with WithPriorities. One Queue per queue per process serves any
// number of local consumers: they share one dispatcher (dispatch.go), one
// sorted snapshot of the children and one children watch, take distinct
// candidates from it, and so never race each other for the head. An idle
// Queue costs no ZooKeeper traffic: waiting consumers sleep on the watch.
//
// A Queue is safe for concurrent use.
type Queue struct {
	conn    *zk.Conn
	zk      observed
	readers []observed // zk and WithReaders's, used round-robin by claims
	next    atomic.Uint32
	path    string
	opt     options
	recent  *recent   // data of messages published here, for read-free claims
	pubs    publishes // publishes under way, for claims of what they create
	reads   readGroup // concurrent claims' reads (reads.go)
	tails   tails     // the tail segment of each level, for producers
	chain   chain     // the segments, for consumers
	counts  segmentCounts
	dedup   *dedup // nil without WithDedup
	groups  groupWaits

	dispatcher
}

// New returns the queue whose messages are the children of p, creating p
// and its parents when missing (unless WithoutCreate).
func New(conn *zk.Conn, p string, opts ...Option) (*Queue, error) {
	if conn == nil {
		return nil, errors.New("zkqueue: nil zk conn")
	}
	if p == "" || p[0] != '/' || path.Clean(p) != p || p == "/" {
		return nil, fmt.Errorf("zkqueue: bad queue path %q", p)
	}
	var o options
	for _, f := range opts {
		f(&o)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if !o.noCreate {
		if err := zkutil.EnsurePath(conn, p, o.acl); err != nil {
			return nil, fmt.Errorf("zkqueue: %w", err)
		}
	}
	s := &Queue{conn: conn, zk: observed{conn, o.observer}, path: p, opt: o,
		recent: newRecent(o.memory), dispatcher: newDispatcher(),
		tails: tails{k: map[int]int64{}}, chain: newChain(),
		counts: segmentCounts{n: map[segment]int{}}}
	if o.dedupDir != "" {
		s.dedup = &dedup{dir: o.dedupDir, window: o.dedupWindow}
	}
	for _, r := range o.readers {
		s.readers = append(s.readers, observed{r, o.observer})
	}
	if len(s.readers) == 0 {
		s.readers = []observed{s.zk}
	}
	// Readers are sessions of one client type: all have multiRead or none.
	s.reads.off.Store(!hasMultiRead(conn))
	return s, nil
}

// Path returns the parent node of the messages.
func (s *Queue) Path() string { return s.path }

// CheckPayload returns ErrTooLarge when payload exceeds the limit.
func (s *Queue) CheckPayload(payload []byte) error {
	return s.checkSize(len(payload))
}

func (s *Queue) checkSize(n int) error {
	if n > s.opt.limits.MaxPayload {
		return fmt.Errorf("%w: %d bytes > %d", ErrTooLarge, n, s.opt.limits.MaxPayload)
	}
	return nil
}

// CheckDraft returns ErrBadPriority, ErrBadAttributes, ErrBadDedupID,
// ErrBadGroup or ErrTooLarge for a draft that cannot be published. Attributes count
// against the payload limit.
func (s *Queue) CheckDraft(d Draft) error {
	if _, err := s.prefix(d.Priority); err != nil {
		return err
	}
	if err := s.checkDedup(d.DedupID); err != nil {
		return err
	}
	if err := s.checkGroup(d.Group); err != nil {
		return err
	}
	if err := d.Attributes.Validate(); err != nil {
		return err
	}
	return s.checkSize(d.Size())
}

// Draft is a message to publish.
type Draft struct {
	Payload []byte
	// Priority, in [0, MaxPriority], 0 the most urgent; 0 in a FIFO
	// queue.
	Priority int
	// Attributes are stored and delivered with the message.
	Attributes
	// DedupID, when set, makes the publish idempotent within the
	// queue's window (WithDedup, dedup.go); see CheckDedupID.
	DedupID string
}

// Size is what the draft counts against the payload limit: its payload
// and its attributes.
func (d Draft) Size() int { return len(d.Payload) + d.Attributes.Size() }

// Publish appends payload (at priority 0 in a priority queue) and returns
// the message id (its node name). Errors: ErrTooLarge, or a ZooKeeper
// error.
func (s *Queue) Publish(ctx context.Context, payload []byte) (string, error) {
	return s.PublishDraft(ctx, Draft{Payload: payload})
}

// PublishPriority appends payload with priority p (see Draft).
func (s *Queue) PublishPriority(ctx context.Context, p int, payload []byte) (string, error) {
	return s.PublishDraft(ctx, Draft{Payload: payload, Priority: p})
}

// PublishDraft appends one message with its priority and attributes.
// Errors: see CheckDraft, or a ZooKeeper error.
func (s *Queue) PublishDraft(ctx context.Context, d Draft) (string, error) {
	if err := s.CheckDraft(d); err != nil {
		return "", err
	}
	if d.DedupID != "" {
		rs, err := s.publishReceipts(ctx, []Draft{d}, nil, nil)
		if err != nil {
			return "", s.wrap("publish", err)
		}
		return rs[0].ID, nil
	}
	id, err := s.publish(ctx, d)
	return id, s.wrap("publish", err)
}

// prefix returns the name prefix of a message of priority p.
func (s *Queue) prefix(p int) (string, error) {
	switch {
	case p < 0 || p > MaxPriority:
		return "", fmt.Errorf("%w: %d not in [0, %d]", ErrBadPriority, p, MaxPriority)
	case s.opt.priorities:
		return PriorityPrefix(p), nil
	case p != 0:
		return "", fmt.Errorf("%w: %d in a FIFO queue", ErrBadPriority, p)
	}
	return FIFOPrefix, nil
}

// wrap names the operation and the queue in err; context errors are
// returned as they are.
func (s *Queue) wrap(op string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return &opError{op: op, path: s.path, err: err}
}

// opError is an error of a Queue operation: "zkqueue: <op> <path>: " and
// the cause, whose own "zkqueue: " prefix (a sentinel's) is not repeated.
type opError struct {
	op, path string
	err      error
}

func (e *opError) Error() string {
	return "zkqueue: " + e.op + " " + e.path + ": " + strings.TrimPrefix(e.err.Error(), "zkqueue: ")
}

func (e *opError) Unwrap() error { return e.err }

// publish creates one checked message node and returns its name.
func (s *Queue) publish(ctx context.Context, d Draft) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	d = withGroupTokens([]Draft{d})[0]
	data := EncodeData(Message{Payload: d.Payload, Attributes: d.Attributes, Published: time.Now()})
	paths, err := s.appendGrouped(ctx, []int{d.Priority}, [][]byte{data}, []Attributes{d.Attributes})
	if err != nil {
		return "", fmt.Errorf("create in %s: %w", s.path, err)
	}
	return path.Base(paths[0]), nil
}

// PublishBatch appends all payloads (at priority 0 in a priority queue)
// atomically, in order, in one Multi transaction: either all are
// published or none. Errors: ErrEmptyBatch, ErrTooLarge, ErrBatchTooLarge
// (nothing written), or a ZooKeeper error (nothing written).
func (s *Queue) PublishBatch(ctx context.Context, payloads [][]byte) ([]string, error) {
	drafts := make([]Draft, len(payloads))
	for i, p := range payloads {
		drafts[i].Payload = p
	}
	return s.PublishAll(ctx, drafts)
}

// PublishAll is PublishBatch for messages with priorities, attributes and
// dedup ids (a duplicate's id is the first publish's; PublishReceipts
// tells them apart).
func (s *Queue) PublishAll(ctx context.Context, drafts []Draft) ([]string, error) {
	for _, d := range drafts {
		if err := s.CheckDraft(d); err != nil {
			return nil, err
		}
	}
	if err := s.checkBatch(drafts); err != nil {
		return nil, s.wrap("publish batch", err)
	}
	if hasDedup(drafts) {
		rs, err := s.publishReceipts(ctx, drafts, nil, nil)
		if err != nil {
			return nil, s.wrap("publish batch", err)
		}
		ids := make([]string, len(rs))
		for i, r := range rs {
			ids[i] = r.ID
		}
		return ids, nil
	}
	ids, err := s.publishBatch(ctx, drafts)
	return ids, s.wrap("publish batch", err)
}

// checkBatch checks a batch of checked drafts against the limits: a
// batch over the count or byte limits is rejected before anything is
// written.
func (s *Queue) checkBatch(drafts []Draft) error {
	if len(drafts) == 0 {
		return ErrEmptyBatch
	}
	if len(drafts) > s.opt.limits.MaxBatchCount {
		return fmt.Errorf("%w: %d messages > %d", ErrBatchTooLarge, len(drafts), s.opt.limits.MaxBatchCount)
	}
	// The byte limit bounds the Multi request, so it counts what each
	// message adds to it besides its payload (MessageOverhead), not the
	// payloads alone: with MaxBatchBytes <= HardMaxPayload a batch is one
	// request below jute.maxbuffer.
	total, overhead, now := 0, 0, time.Now()
	for _, d := range drafts {
		total += d.Size()
		overhead += s.MessageOverhead() + s.dedupBytes(d.DedupID, now, time.Time{}) + s.groupBytes(d.Group)
	}
	if total+overhead > s.opt.limits.MaxBatchBytes {
		return fmt.Errorf("%w: %d messages are %d bytes including %d bytes of per-message overhead > %d",
			ErrBatchTooLarge, len(drafts), total+overhead, overhead, s.opt.limits.MaxBatchBytes)
	}
	return nil
}

// publishBatch creates all checked drafts (see checkBatch) in one Multi
// transaction: all or none.
func (s *Queue) publishBatch(ctx context.Context, drafts []Draft) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := time.Now()
	drafts = withGroupTokens(drafts)
	levels := make([]int, len(drafts))
	datas := make([][]byte, len(drafts))
	attrs := make([]Attributes, len(drafts))
	for i, d := range drafts {
		levels[i] = d.Priority
		datas[i] = EncodeData(Message{Payload: d.Payload, Attributes: d.Attributes, Published: now})
		attrs[i] = d.Attributes
	}
	paths, err := s.appendGrouped(ctx, levels, datas, attrs)
	if err != nil {
		return nil, fmt.Errorf("multi create in %s: %w", s.path, err)
	}
	ids := make([]string, len(paths))
	for i, p := range paths {
		ids[i] = path.Base(p)
	}
	return ids, nil
}

// MessageOverhead is what each message of a batch counts against
// MaxBatchBytes besides its payload: its header (HeaderMax), its node path
// (the parent's path, "/" + the segment's name, "/" + the longest name
// prefix with the segment's number, the publisher tag and 10 digits) and
// the framing and ACL of its create op. For a broker's queue (items under
// /qbroker, tagged) it is 207 bytes plus the length of the queue name.
func (s *Queue) MessageOverhead() int {
	o := HeaderMax + len(s.path) + 2*segDigits + 23 + opOverhead
	if s.opt.publisher != "" {
		o += tagLen + 1
	}
	return o
}

// publisherTag is the tag new messages carry in their names: this
// process's (WithPublisher) while it consumes the queue and so remembers
// what it publishes, else none, and they are shared by sequence number.
func (s *Queue) publisherTag() string {
	if s.opt.publisher == "" || !s.recent.consumed() {
		return ""
	}
	return s.opt.publisher
}

// remember notes the messages this process created at paths with datas,
// for read-free claims.
func (s *Queue) remember(paths []string, datas [][]byte) {
	for i, p := range paths {
		if n, ok := ParseName(path.Base(p)); ok {
			s.recent.put(n, datas[i])
		}
	}
}

// listingPubs returns the publishes begun before the current snapshot's
// listing came back (publishes.mark): a candidate's, or a later one's,
// which only counts more.
func (s *Queue) listingPubs() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listedPubs
}

// ownTag reports whether n carries this process's publisher tag.
func (s *Queue) ownTag(n Name) bool {
	return n.Tag != "" && n.Tag == s.opt.publisher
}

// reader returns the session for a claim's read, round-robin.
func (s *Queue) reader() observed {
	if len(s.readers) == 1 {
		return s.readers[0]
	}
	return s.readers[int(s.next.Add(1))%len(s.readers)]
}

// write runs ops as one transaction: through the Committer when there is
// one, else as a plain request (one op) or a Multi. Errors name the
// failing op's cause.
func (s *Queue) write(ctx context.Context, ops ...any) ([]zk.MultiResponse, error) {
	if s.opt.committer != nil {
		return s.opt.committer.Do(ctx, ops...)
	}
	if len(ops) == 1 {
		switch o := ops[0].(type) {
		case *zk.CreateRequest:
			p, err := s.zk.Create(o.Path, o.Data, o.Flags, o.Acl)
			return []zk.MultiResponse{{String: p, Error: err}}, err
		case *zk.DeleteRequest:
			err := s.zk.Delete(o.Path, o.Version)
			return []zk.MultiResponse{{Error: err}}, err
		}
	}
	res, err := s.zk.Multi(ops...)
	return res, zkutil.MultiError(res, err)
}

// multi runs ops as one Multi on the queue's own session, never through
// the Committer.
func (s *Queue) multi(ctx context.Context, ops ...any) ([]zk.MultiResponse, error) {
	res, err := s.zk.Multi(ops...)
	return res, zkutil.MultiError(res, err)
}

// claimDelete is the at-most-once claim: getData, then delete at the read
// version. Whoever deletes the node owns the message. If the delete's
// outcome is unknown (connection lost), the message is not returned: it
// may be lost, never delivered twice. A message that does not fit the
// caller's room (see fitClaimFunc) is not deleted.
func (s *Queue) claimDelete(ctx context.Context, n Name, fit fitFunc) (Message, error) {
	p := itemPath(s.path, n)
	data, version, err := s.readItem(ctx, p, n)
	if err != nil {
		return Message{}, err
	}
	// Undecodable data is never delivered: the claim fails with
	// ErrBadData, and the node stays, skipped, until a purge
	// (baddata.go).
	m, err := decodeMessage(n, data, 1)
	if err != nil {
		return Message{}, err
	}
	if s.expired(m, time.Now()) {
		return Message{}, s.expireClaimed(ctx, n, data, version)
	}
	var gops []any
	if m.Group != "" {
		entry, err := s.groupGate(m)
		if err != nil {
			s.unread(n, data, version)
			return Message{}, err
		}
		if entry != "" {
			gops = s.groupClaimOps(m.Group, entry, false)
		}
	}
	if !fit.admits(m.wireSize()) {
		s.unread(n, data, version)
		return Message{}, fmt.Errorf("%s: %w", n.Raw, ErrNoRoom)
	}
	if _, err := s.write(ctx, append([]any{&zk.DeleteRequest{Path: p, Version: version}}, gops...)...); err != nil {
		return Message{}, fmt.Errorf("delete %s: %w", p, err)
	}
	if gops != nil {
		_ = s.zk.Delete(s.groupPath(m.Group), -1) // idle now unless more wait
	}
	return m, nil
}

// Take claims up to max messages from the head, at most once (see
// claimDelete), within room; otherwise as Leases.Take.
func (s *Queue) Take(ctx context.Context, max int, room Room, block bool) ([]Message, error) {
	ms, err := takeWithin(ctx, s, max, room, block, s.claimDelete)
	return ms, s.wrap("take", err)
}

func (s *Queue) claimDeleteAll(ctx context.Context, n Name) (Message, error) {
	return s.claimDelete(ctx, n, nil)
}

// readItem returns the data and version of candidate n at p for its
// claim: remembered when this process published it, else read (group
// read, reads.go). A message with this process's publisher tag may be
// listed before its publish returned here: the claim waits for the
// publishes under way at the listing before it reads (publishes).
func (s *Queue) readItem(ctx context.Context, p string, n Name) (data []byte, version int32, err error) {
	if data, ok := s.recent.take(n.Raw); ok {
		return data, 0, nil
	}
	if s.ownTag(n) && s.pubs.settle(ctx, s.listingPubs()) {
		if data, ok := s.recent.take(n.Raw); ok {
			return data, 0, nil
		}
	}
	r := s.groupRead(p)
	return r.data, r.version, r.err
}

// unread puts back what readItem took from the memory of published
// messages, for a candidate given back unclaimed. Data at version 0 is
// what the message was created with, whoever read it.
func (s *Queue) unread(n Name, data []byte, version int32) {
	if version == 0 {
		s.recent.put(n, data)
	}
}

func decodeMessage(n Name, data []byte, addDeliveries int) (Message, error) {
	m, err := DecodeData(data)
	if err != nil {
		return Message{}, fmt.Errorf("%s: %w", n.Raw, ErrBadData)
	}
	m.ID, m.Priority = n.Base, n.Priority
	m.Deliveries += addDeliveries
	return m, nil
}

// TryDequeue claims the head message (at-most-once) or returns ErrEmpty.
func (s *Queue) TryDequeue(ctx context.Context) (Message, error) {
	m, err := take(ctx, s, false, s.claimDeleteAll)
	return m, s.wrap("dequeue", err)
}

// Dequeue claims the head message (at-most-once), waiting for one until
// ctx ends.
func (s *Queue) Dequeue(ctx context.Context) (Message, error) {
	m, err := take(ctx, s, true, s.claimDeleteAll)
	return m, s.wrap("dequeue", err)
}

// OldestAge returns the age of the head message (0 when empty). It reads
// the head of the cached snapshot when it still exists, without listing
// the children (an approximation: a message put back at the head since the
// last scan is not seen), else the head of a fresh listing.
func (s *Queue) OldestAge(ctx context.Context) (time.Duration, error) {
	// The head of the cached snapshot, when there is one, saves listing
	// the children; if it is gone, Peek lists them.
	s.mu.Lock()
	var head Name
	switch {
	case len(s.pending) > 0 && (len(s.others) == 0 || Compare(s.pending[0], s.others[0]) < 0):
		head = s.pending[0]
	case len(s.others) > 0:
		head = s.others[0]
	}
	s.mu.Unlock()
	if head.Raw != "" {
		data, _, err := s.zk.Get(itemPath(s.path, head))
		if err == nil {
			if m, err := decodeMessage(head, data, 0); err == nil {
				return time.Since(m.Published), nil
			}
		}
	}
	m, err := s.Peek(ctx)
	if errors.Is(err, ErrEmpty) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return time.Since(m.Published), nil
}
