package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
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
// A Queue is the public face of its parts, each with its own state (and
// lock, where it has state that changes): the producer (producer.go: tail
// segments, rolls, publish encoding), the dispatcher (dispatch.go, over
// the chain of segments, heads.go), the group reads (reads.go), the
// claims (claims.go) and the inspector (inspect.go: Peek, Len, Purge).
// The optional features are parts too, each nil unless the queue has it:
// deduplication (dedup.go), message groups (groups.go) and a TTL
// (ttl.go); the nodes that do not decode (baddata.go) are asked about
// only once one is known. A message that uses no feature goes through
// none of their code.
//
// A Queue is safe for concurrent use.
type Queue struct {
	*core
	recent *recent           // data of messages published here, for read-free claims
	pubs   *publishes        // publishes under way, for claims of what they create
	prod   *producer         // the publish side
	disp   *dispatcher       // the consume side: snapshot, candidates, claims' ends
	reads  *readGroup        // concurrent claims' reads (reads.go)
	insp   *inspector        // Peek, Len, Purge, Browse: reading without consuming
	dedup  *dedup            // nil without WithDedup
	groups *groups           // nil without WithGroups
	ttl    *expiry           // nil without a TTL
	claims *claims           // reading and deciding on a candidate
	buf    *packBuf[Message] // claimed, not yet handed out; nil without WithPacking
}

// core is what every part of a Queue shares, set by New and never
// changed: the session, the queue's node and its options.
type core struct {
	conn *zk.Conn
	zk   observed
	path string
	opt  options
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
	c := &core{conn: conn, zk: observed{conn, o.observer}, path: p, opt: o}
	q := &Queue{core: c, recent: newRecent(o.memory), pubs: &publishes{},
		insp: &inspector{core: c, n: map[segment]int{}}}
	q.reads = newReadGroup(c, q.recent, q.pubs)
	if o.groupsDir != "" {
		q.groups = &groups{core: c}
	}
	q.prod = &producer{core: c, tails: tails{k: map[int]int64{}}, recent: q.recent, pubs: q.pubs, groups: q.groups}
	if o.packing != nil {
		q.prod.packer = &packer{p: q.prod, limits: *o.packing, levels: map[int]*packLevel{}}
		q.buf = newPackBuf[Message](minClaim(o))
	}
	q.disp = newDispatcher(c, q.recent, q.pubs, q.reads, q.groups)
	q.prod.fresh = q.disp.fresh
	if q.groups != nil {
		q.groups.disp = q.disp
	}
	if o.dedupDir != "" {
		q.dedup = &dedup{core: c, prod: q.prod, dir: o.dedupDir, window: o.dedupWindow}
	}
	if o.expiry.TTL > 0 {
		q.ttl = &expiry{core: c}
	}
	q.claims = &claims{core: c, recent: q.recent, pubs: q.pubs, reads: q.reads, disp: q.disp, groups: q.groups, ttl: q.ttl}
	return q, nil
}

// Path returns the parent node of the messages.
func (q *Queue) Path() string { return q.path }

// CheckPayload returns ErrTooLarge when payload exceeds the limit.
func (q *Queue) CheckPayload(payload []byte) error {
	return q.checkSize(len(payload))
}

func (q *Queue) checkSize(n int) error {
	if n > q.opt.limits.MaxPayload {
		return fmt.Errorf("%w: %d bytes > %d", ErrTooLarge, n, q.opt.limits.MaxPayload)
	}
	return nil
}

// CheckDraft returns ErrBadPriority, ErrBadAttributes, ErrBadDedupID,
// ErrBadGroup or ErrTooLarge for a draft that cannot be published. Attributes count
// against the payload limit.
func (q *Queue) CheckDraft(d Draft) error {
	if _, err := q.prefix(d.Priority); err != nil {
		return err
	}
	if d.DedupID != "" {
		if err := q.checkDedup(d.DedupID); err != nil {
			return err
		}
	}
	if d.Group != "" {
		if err := q.checkGroup(d.Group); err != nil {
			return err
		}
	}
	if err := d.Attributes.Validate(); err != nil {
		return err
	}
	return q.checkSize(d.Size())
}

// Check checks each of drafts as CheckDraft does and marks it checked
// by q, in place: a publish of the marked drafts to q (Publish*,
// Scheduled.Publish*) does not check them again, so a caller that must
// refuse a batch before it spends anything on it (the broker charges its
// quotas first) has the queue check each message once. A refusal is a
// *DraftError naming the draft. A draft changed after Check is the
// caller's error: its mark vouches for what was checked.
func (q *Queue) Check(drafts []Draft) error {
	for i := range drafts {
		if err := q.CheckDraft(drafts[i]); err != nil {
			return &DraftError{Index: i, Err: err}
		}
		drafts[i].checked = q
	}
	return nil
}

// checkDrafts checks the drafts that Check has not marked.
func (q *Queue) checkDrafts(drafts []Draft) error {
	for i, d := range drafts {
		if d.checked == q {
			continue
		}
		if err := q.CheckDraft(d); err != nil {
			return &DraftError{Index: i, Err: err}
		}
	}
	return nil
}

// DraftError is the refusal of one draft of a publish (see CheckDraft):
// Index is its place among the drafts.
type DraftError struct {
	Index int
	Err   error
}

func (e *DraftError) Error() string {
	return fmt.Sprintf("zkqueue: message %d: %s", e.Index, strings.TrimPrefix(e.Err.Error(), "zkqueue: "))
}

func (e *DraftError) Unwrap() error { return e.Err }

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

	checked *Queue // the Queue whose Check passed it
}

// Size is what the draft counts against the payload limit: its payload
// and its attributes.
func (d Draft) Size() int { return len(d.Payload) + d.Attributes.Size() }

// hasDedup reports whether a draft has a dedup id.
func hasDedup(drafts []Draft) bool {
	for _, d := range drafts {
		if d.DedupID != "" {
			return true
		}
	}
	return false
}

// Publish appends payload (at priority 0 in a priority queue) and returns
// the message id (its node name). Errors: ErrTooLarge, or a ZooKeeper
// error.
func (q *Queue) Publish(ctx context.Context, payload []byte) (string, error) {
	return q.PublishDraft(ctx, Draft{Payload: payload})
}

// PublishPriority appends payload with priority p (see Draft).
func (q *Queue) PublishPriority(ctx context.Context, p int, payload []byte) (string, error) {
	return q.PublishDraft(ctx, Draft{Payload: payload, Priority: p})
}

// PublishDraft appends one message with its priority and attributes.
// Errors: a *DraftError wrapping a refusal of CheckDraft, or a ZooKeeper
// error.
func (q *Queue) PublishDraft(ctx context.Context, d Draft) (string, error) {
	drafts := []Draft{d}
	if err := q.checkDrafts(drafts); err != nil {
		return "", err
	}
	if d.DedupID != "" {
		rs, err := q.dedup.publishReceipts(ctx, drafts, nil, nil)
		if err != nil {
			return "", q.wrap("publish", err)
		}
		return rs[0].ID, nil
	}
	paths, err := q.prod.publish(ctx, drafts)
	if err != nil {
		return "", q.wrap("publish", fmt.Errorf("create in %s: %w", q.path, err))
	}
	return paths[0], nil
}

// prefix returns the name prefix of a message of priority p.
func (q *Queue) prefix(p int) (string, error) {
	switch {
	case p < 0 || p > MaxPriority:
		return "", fmt.Errorf("%w: %d not in [0, %d]", ErrBadPriority, p, MaxPriority)
	case q.opt.priorities:
		return PriorityPrefix(p), nil
	case p != 0:
		return "", fmt.Errorf("%w: %d in a FIFO queue", ErrBadPriority, p)
	}
	return FIFOPrefix, nil
}

// wrap names the operation and the queue in err; context errors are
// returned as they are.
func (c *core) wrap(op string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return &opError{op: op, path: c.path, err: err}
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

// PublishBatch appends all payloads (at priority 0 in a priority queue)
// atomically, in order, in one Multi transaction: either all are
// published or none. Errors: ErrEmptyBatch, ErrTooLarge, ErrBatchTooLarge
// (nothing written), or a ZooKeeper error (nothing written).
func (q *Queue) PublishBatch(ctx context.Context, payloads [][]byte) ([]string, error) {
	drafts := make([]Draft, len(payloads))
	for i, p := range payloads {
		drafts[i].Payload = p
	}
	return q.PublishAll(ctx, drafts)
}

// PublishAll is PublishBatch for messages with priorities, attributes and
// dedup ids (a duplicate's id is the first publish's; PublishReceipts
// tells them apart). A refused draft is a *DraftError naming it.
func (q *Queue) PublishAll(ctx context.Context, drafts []Draft) ([]string, error) {
	if err := q.checkDrafts(drafts); err != nil {
		return nil, err
	}
	if err := q.checkBatch(drafts); err != nil {
		return nil, q.wrap("publish batch", err)
	}
	if hasDedup(drafts) {
		rs, err := q.dedup.publishReceipts(ctx, drafts, nil, nil)
		if err != nil {
			return nil, q.wrap("publish batch", err)
		}
		ids := make([]string, len(rs))
		for i, r := range rs {
			ids[i] = r.ID
		}
		return ids, nil
	}
	ids, err := q.prod.publish(ctx, drafts)
	if err != nil {
		return nil, q.wrap("publish batch", fmt.Errorf("multi create in %s: %w", q.path, err))
	}
	return ids, nil
}

// checkBatch checks a batch of checked drafts against the limits: a
// batch over the count or byte limits is rejected before anything is
// written.
func (q *Queue) checkBatch(drafts []Draft) error {
	if len(drafts) == 0 {
		return ErrEmptyBatch
	}
	if len(drafts) > q.opt.limits.MaxBatchCount {
		return fmt.Errorf("%w: %d messages > %d", ErrBatchTooLarge, len(drafts), q.opt.limits.MaxBatchCount)
	}
	// The byte limit bounds the Multi request, so it counts what each
	// message adds to it besides its payload (MessageOverhead), not the
	// payloads alone: with MaxBatchBytes <= HardMaxPayload a batch is one
	// request below jute.maxbuffer.
	total, overhead, now := 0, 0, time.Now()
	for _, d := range drafts {
		total += d.Size()
		overhead += q.MessageOverhead() + q.featureBytes(d, now, time.Time{})
	}
	if total+overhead > q.opt.limits.MaxBatchBytes {
		return fmt.Errorf("%w: %d messages are %d bytes including %d bytes of per-message overhead > %d",
			ErrBatchTooLarge, len(drafts), total+overhead, overhead, q.opt.limits.MaxBatchBytes)
	}
	return nil
}

// featureBytes is what a checked draft's dedup records and group entry
// add to its publish transaction at now, due at due (zero: at once).
func (q *Queue) featureBytes(d Draft, now, due time.Time) int {
	n := 0
	if d.DedupID != "" {
		n += q.dedup.bytes(d.DedupID, now, due)
	}
	if d.Group != "" {
		n += q.groups.bytes(d.Group)
	}
	return n
}

// MessageOverhead is what each message of a batch counts against
// MaxBatchBytes besides its payload: its header (HeaderMax), its node path
// (the parent's path, "/" + the segment's name, "/" + the longest name
// prefix with the segment's number, the publisher tag and 10 digits) and
// the framing and ACL of its create op. For a broker's queue (items under
// /qbroker, tagged) it is 207 bytes plus the length of the queue name.
func (q *Queue) MessageOverhead() int {
	o := HeaderMax + len(q.path) + 2*segDigits + 23 + opOverhead
	if q.opt.publisher != "" {
		o += tagLen + 1
	}
	return o
}

// Take claims up to max messages from the head, at most once (see
// claims.take), within room; otherwise as Leases.Take.
func (q *Queue) Take(ctx context.Context, max int, room Room, block bool) ([]Message, error) {
	t := takeReq{max: max, room: room, block: block}
	if q.buf != nil {
		t.weigh = true
		ms, err := takePacked(ctx, q.disp, t, q.buf, q.claims.takeNode, Message.size, nil, nil)
		return ms, q.wrap("take", err)
	}
	ms, err := takeWithin(ctx, q.disp, t, q.claims.take)
	return ms, q.wrap("take", err)
}

// size is what m counts against a Room.
func (m Message) size() int { return m.wireSize() }

// TryDequeue claims the head message (at-most-once) or returns ErrEmpty.
func (q *Queue) TryDequeue(ctx context.Context) (Message, error) {
	if q.buf != nil {
		return q.takeOne(ctx, false)
	}
	m, err := take(ctx, q.disp, false, q.claims.takeAll)
	return m, q.wrap("dequeue", err)
}

// Dequeue claims the head message (at-most-once), waiting for one until
// ctx ends.
func (q *Queue) Dequeue(ctx context.Context) (Message, error) {
	if q.buf != nil {
		return q.takeOne(ctx, true)
	}
	m, err := take(ctx, q.disp, true, q.claims.takeAll)
	return m, q.wrap("dequeue", err)
}

// takeOne is Dequeue (block) or TryDequeue of a packed queue.
func (q *Queue) takeOne(ctx context.Context, block bool) (Message, error) {
	ms, err := q.Take(ctx, 1, Room{}, block)
	if err != nil {
		return Message{}, err
	}
	return ms[0], nil
}

// Flush puts back the messages a packed queue's takes claimed and did
// not hand out (packbuf.go), each at its place: a process stopping
// consuming calls it. Without packing it does nothing.
func (q *Queue) Flush(ctx context.Context) error {
	if q.buf == nil {
		return nil
	}
	ms := q.buf.drain()
	err := putBackMessages(ctx, q.core, ms)
	if len(ms) > 0 {
		q.Rescan()
	}
	return q.wrap("flush", err)
}

// OldestAge returns the age of the head message (0 when empty). It reads
// the head of the cached snapshot when it still exists, without listing
// the children (an approximation: a message put back at the head since the
// last scan is not seen), else the head of a fresh listing.
func (q *Queue) OldestAge(ctx context.Context) (time.Duration, error) {
	// The head of the cached snapshot, when there is one, saves listing
	// the children; if it is gone, Peek lists them.
	head := q.disp.head()
	if head.Raw != "" {
		data, _, err := q.zk.Get(itemPath(q.path, head))
		if err == nil {
			if ms, _, err := decodeNode(head, data, 0); err == nil {
				return time.Since(ms[0].Published), nil
			}
		}
	}
	m, err := q.Peek(ctx)
	if errors.Is(err, ErrEmpty) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return time.Since(m.Published), nil
}
