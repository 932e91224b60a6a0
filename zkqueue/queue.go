package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
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
// A Queue is the public face of its parts, each with its own state (and
// lock, where it has state that changes): the producer (producer.go: tail
// segments, rolls, publish encoding), the dispatcher (dispatch.go, over
// the chain of segments, with the claims), the group reads (readGroup,
// below) and the inspector (inspect.go: Peek, Len, Purge).
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
	reads  *readGroup        // concurrent claims' reads (readGroup)
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
		q.buf = newPackBuf(minClaim(o), Message.size, nil)
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
		ms, err := takePacked(ctx, q.disp, t, q.buf, q.claims.takeNode, nil)
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

// Handles are what a process opens of one queue of a Catalog (Open): its
// parts, each at the node the Catalog's layout gives it, and the watch of
// its metadata. They serve until Stale (the queue was marked for
// deletion, deleted or changed; not a lost session alone): then open the
// queue again. Handles are safe for concurrent use.
type Handles struct {
	Name string
	// Spec is the queue's configuration as Open read it.
	Spec Spec
	// Items are the ready messages (items/).
	Items *Queue
	// Leases are the deliveries in flight (leases/, dead letters in
	// dead/).
	Leases *Leases
	// Delayed are the messages published with a delay (delayed/).
	Delayed *Scheduled
	// Consumers are the queue's consumer registrations on all processes
	// (consumers/).
	Consumers *ConsumerGroup
	// Path is the queue's node (Catalog.Path), for recipes built on the
	// queue (package syncqueue).
	Path string
	// Active is the node of the election among the queue's consumers
	// when Spec.SingleActive (see active.go), "" otherwise.
	Active string

	catalog *Catalog
	meta    zk.Stat // of the metadata node, as Open read it

	mu    sync.Mutex
	watch <-chan zk.Event // the metadata watch (Catalog.Load)
	stale bool            // the watch fired for a change: open again
}

// OpenConfig configures the Handles Open returns.
type OpenConfig struct {
	// ProcessID names this process among the queue's consumers
	// (NewConsumerGroup); required.
	ProcessID string
	// Registry keeps the consumer registrations of this process through
	// session changes (ConsumerGroupConfig.Registry); share one among
	// the queues of a process.
	Registry *Registry
	// Expired, when set, is told of the messages this process expired
	// (Expiry.Hook).
	Expired func(n int)
	// MaxDelayed bounds the delayed messages (NewScheduled); 0: the
	// default.
	MaxDelayed int
}

// Open opens the queue name: it reads its metadata with a watch (Load)
// and returns its Handles, built on the Catalog's layout. opts configure
// its Queue (limits, hooks, committer, readers, memory, publisher,
// logger, ...); Open adds, after them, what the layout and the metadata
// decide: WithoutCreate (opening never writes, so a process opening a
// queue while it is being deleted cannot bring parts of it back),
// WithDedup, WithExpiry, WithGroups and, for a KindPriority queue,
// WithPriorities. Before them it adds what opts may replace: the
// Catalog's ACL and Observer, and WithOwners of the queue's ConsumerGroup.
// It makes one request. Errors: ErrQueueNotFound, ErrBadName, and those
// of New.
func (c *Catalog) Open(name string, cfg OpenConfig, opts ...Option) (*Handles, error) {
	spec, stat, watch, err := c.load(name)
	if err != nil {
		return nil, err
	}
	p := c.Path(name)
	reg := cfg.Registry
	if reg == nil {
		reg = NewRegistry(c.conn, RegistryConfig{ACL: c.cfg.ACL, Logger: c.cfg.Logger})
	}
	group, err := NewConsumerGroup(c.conn, p+"/consumers", cfg.ProcessID,
		ConsumerGroupConfig{Registry: reg, ACL: c.cfg.ACL, WithoutCreate: true})
	if err != nil {
		return nil, err
	}
	e := c.Expiry(name, spec)
	e.Hook = cfg.Expired
	all := make([]Option, 0, len(opts)+8)
	all = append(all, WithACL(c.cfg.ACL), WithObserver(c.cfg.Observer), WithOwners(group.Share))
	all = append(all, opts...)
	all = append(all, WithoutCreate(), WithDedup(p+"/dedup", spec.Dedup()), WithExpiry(e), WithGroups(p+"/groups"))
	if spec.Kind == KindPriority {
		all = append(all, WithPriorities())
	}
	if spec.Fairness.Key != "" {
		all = append(all, WithFairness(spec.Fairness))
	}
	if spec.Packed {
		all = append(all, WithPacking(PackLimits{}))
	}
	items, err := New(c.conn, p+"/items", all...)
	if err != nil {
		return nil, err
	}
	leases, err := NewLeases(items, p+"/leases", p+"/dead")
	if err != nil {
		return nil, err
	}
	delayed, err := NewScheduled(items, p+"/delayed", cfg.MaxDelayed)
	if err != nil {
		return nil, err
	}
	h := &Handles{Name: name, Spec: spec, Items: items, Leases: leases,
		Delayed: delayed, Consumers: group, Path: p, catalog: c, meta: *stat, watch: watch}
	if spec.SingleActive {
		h.Active = p + "/" + activeParent
	}
	return h, nil
}

// Stale reports whether the queue was marked for deletion, deleted,
// changed or created again since Open: then open it again. A metadata
// watch that fired only because the session was lost
// (zk.EventNotWatching) is armed again when the queue's node is still the
// one Open read (same creation and version), and the Handles serve on: a
// process keeps one set of Handles per queue through session changes,
// and with them one dispatcher and one pack buffer. That takes one read,
// tried again for up to a second while the connection is down; when it
// fails (ZooKeeper away, the queue gone), the Handles are stale.
func (h *Handles) Stale() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.watch
	select {
	case ev, ok := <-w:
		return h.fired(w, ev, ok)
	default:
		return h.stale
	}
}

// Watch returns the metadata watch the Handles serve under. When it
// fires, Stale says whether the Handles are done or serve on under a new
// watch.
func (h *Handles) Watch() <-chan zk.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.watch
}

// fired decides on watch w, which fired with ev (ok false: w was closed,
// its event taken by an earlier caller): true when the Handles are stale,
// false when they serve on under a watch armed again. h.mu is held.
func (h *Handles) fired(w <-chan zk.Event, ev zk.Event, ok bool) bool {
	switch {
	case h.stale || w != h.watch:
		return h.stale // decided when the event was taken
	case ok && ev.Type == zk.EventNotWatching:
		// The read can fail while the client replaces the lost session
		// (requests of the old one end with it): try again, briefly.
		for try := 0; ; try++ {
			_, stat, watch, err := h.catalog.load(h.Name)
			if err == nil && stat.Czxid == h.meta.Czxid && stat.Version == h.meta.Version {
				h.watch = watch
				return false
			}
			if err == nil || !connectionLoss(err) || errors.Is(err, zk.ErrClosing) || try == staleRetries {
				break
			}
			time.Sleep(staleRetryWait)
		}
	}
	h.stale = true
	return true
}

// A lost session's metadata watch is armed again with up to staleRetries
// more reads, staleRetryWait apart, while the connection is down.
const (
	staleRetries   = 10
	staleRetryWait = 100 * time.Millisecond
)

// Run runs the queue's jobs of this process until ctx ends or the Handles
// go stale, and returns once they stopped: the mover of due delayed
// messages (Scheduled.Run) and, when the queue has a message TTL, the
// expiry timer of its heads (Queue.RunExpiry). Every process with the
// queue open may run them: several movers of one queue are safe (a move
// is a versioned delete of the delayed node in the same transaction as
// the message's create, and exactly one commits), and running them
// wherever the queue is open keeps delayed delivery going while the
// leader changes. An idle queue costs two sleeping goroutines and one
// watch. Errors of a pass go to onErr (when set); the pass is retried.
func (h *Handles) Run(ctx context.Context, onErr func(error)) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	report := func(what string) func(error) {
		return func(err error) {
			if onErr != nil {
				onErr(fmt.Errorf("zkqueue: %s of %s: %w", what, h.Name, err))
			}
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = h.Delayed.Run(ctx, nil, report("moving due delayed messages"))
	}()
	if h.Spec.MessageTTL > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = h.Items.RunExpiry(ctx, report("expiring messages"))
		}()
	}
	for {
		w := h.Watch()
		select {
		case <-ctx.Done():
		case ev, ok := <-w:
			h.mu.Lock()
			stale := h.fired(w, ev, ok)
			h.mu.Unlock()
			if !stale {
				continue // a lost session; the queue as it was
			}
		}
		break
	}
	cancel()
	wg.Wait()
}

// Observer receives the latency and outcome of every ZooKeeper request a
// Queue makes (op is "get", "create", "delete", "multi", "children",
// "exists", "set" or "sync"), for metrics. A Committer also reports each
// transaction given to Do as op "commit": from Do's call to its answer,
// the wait for a batch and a session included.
type Observer func(op string, d time.Duration, err error)

// observed wraps a connection, reporting each request to an Observer.
type observed struct {
	conn *zk.Conn
	obs  Observer
}

func (o observed) done(op string, start time.Time, err error) {
	if o.obs != nil {
		o.obs(op, time.Since(start), err)
	}
}

func (o observed) Get(p string) ([]byte, *zk.Stat, error) {
	start := time.Now()
	data, stat, err := o.conn.Get(p)
	o.done("get", start, err)
	return data, stat, err
}

func (o observed) GetW(p string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	start := time.Now()
	data, stat, w, err := o.conn.GetW(p)
	o.done("get", start, err)
	return data, stat, w, err
}

func (o observed) Create(p string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	start := time.Now()
	s, err := o.conn.Create(p, data, flags, acl)
	o.done("create", start, err)
	return s, err
}

func (o observed) Delete(p string, version int32) error {
	start := time.Now()
	err := o.conn.Delete(p, version)
	o.done("delete", start, err)
	return err
}

func (o observed) Set(p string, data []byte, version int32) (*zk.Stat, error) {
	start := time.Now()
	stat, err := o.conn.Set(p, data, version)
	o.done("set", start, err)
	return stat, err
}

func (o observed) Multi(ops ...any) ([]zk.MultiResponse, error) {
	start := time.Now()
	res, err := o.conn.Multi(ops...)
	o.done("multi", start, err)
	return res, err
}

func (o observed) Children(p string) ([]string, *zk.Stat, error) {
	start := time.Now()
	c, stat, err := o.conn.Children(p)
	o.done("children", start, err)
	return c, stat, err
}

func (o observed) ChildrenW(p string) ([]string, *zk.Stat, <-chan zk.Event, error) {
	start := time.Now()
	c, stat, w, err := o.conn.ChildrenW(p)
	o.done("children", start, err)
	return c, stat, w, err
}

func (o observed) Sync(p string) (string, error) {
	start := time.Now()
	s, err := o.conn.Sync(p)
	o.done("sync", start, err)
	return s, err
}

func (o observed) Exists(p string) (bool, *zk.Stat, error) {
	start := time.Now()
	ok, stat, err := o.conn.Exists(p)
	o.done("exists", start, err)
	return ok, stat, err
}

// Group read. A claim must read the message it claims unless this process
// remembers it from publishing it (producer.go), and ZooKeeper's cost is per
// request far more than per byte: measured on this machine, a getData cost
// the server 110-185 µs of CPU, a read inside a multiRead of 8 paths 24 µs
// and of 64 paths 4-7 µs. So concurrent claims of a Queue (a claim round's,
// and those of separate consumers taking one message each) read together:
// a read that finds fewer than maxReadsInFlight requests of its Queue in
// flight sends itself with the reads queued meanwhile, up to maxReadBatch,
// as one request (a multiRead when more than one, given ZooKeeper 3.6 or
// later and a client that has multiRead, multiReader);
// otherwise it queues, and whichever waiting read finds a request slot
// free sends the oldest queued ones. As with the group commit, a lone read
// goes at once and only reads that would have waited anyway share a
// request.
//
// Read-ahead. A consumer of a backlog it did not publish also reads the
// candidates its next claims will take: the dispatcher hands the next
// candidates of its snapshot to readAhead, their reads fill up the
// requests of the claims' own reads to maxReadBatch paths (or go in a
// request of their own alongside a claim round when a slot is free), and
// what they read is remembered as if this process had published it
// (producer.go, within the same memory budget). The claims then find their
// data at hand, as on a shallow queue, and a deep backlog drains without
// waiting for reads. Claims take candidates in queue order, so a claim that
// reads its message itself drops the reads ahead still queued up to it.
//
// The reads are not atomic with the claims: a claim still deletes (or
// leases) at the version it read, so a message claimed elsewhere in
// between is a lost race, as before.

// maxReadBatch bounds the paths of one multiRead: its answer must stay
// below what the session accepts even if every node holds the largest
// data a message may have (HardMaxPayload), since sizes are unknown before
// the read. Sessions of zkutil.Connect accept zkutil.MaxAnswer;
// go-zookeeper's default accepts any size.
const (
	maxReadAnswer = zkutil.MaxAnswer - zkutil.MaxBuffer
	maxReadBatch  = maxReadAnswer / (HardMaxPayload + HeaderMax + 64)
	// maxReadsInFlight bounds a Queue's read requests in flight, and
	// maxReadAhead the candidates queued for reading ahead. A drain of a
	// backlog reads at most maxReadsInFlight * maxReadBatch messages per
	// round trip: measured draining 300,000 messages with 64 consumers
	// (the README's deep-queue command), 2 requests and 64 ahead drained
	// at 0.51 of the shallow rate, 4 and 256 at 0.67, 8 and 512 at 0.83.
	// The memory of read messages stays within the Budget (WithMemory).
	maxReadsInFlight = 8
	maxReadAhead     = 32 * maxReadBatch
)

// readResult is one read's answer.
type readResult struct {
	data    []byte
	version int32
	stat    *zk.Stat
	err     error
}

// readGroup is a Queue's part for reads: it queues concurrent claims'
// reads for group read and reads ahead what the dispatcher offers,
// filling the memory of messages. It is safe for concurrent use.
type readGroup struct {
	*core
	readers []observed // the queue's session and WithReaders's, used round-robin
	next    atomic.Uint32
	recent  *recent
	pubs    *publishes

	off      atomic.Bool // no multiRead: the client has none, or the server refused it
	mu       sync.Mutex
	queued   []*readCall
	inFlight int
	ahead    []Name          // candidates to read ahead, next first
	aheadSet map[string]bool // names in ahead or in a request for it
}

func newReadGroup(c *core, r *recent, p *publishes) *readGroup {
	g := &readGroup{core: c, recent: r, pubs: p}
	for _, conn := range c.opt.readers {
		g.readers = append(g.readers, observed{conn, c.opt.observer})
	}
	if len(g.readers) == 0 {
		g.readers = []observed{c.zk}
	}
	// Readers are sessions of one client type: all have multiRead or none.
	g.off.Store(!hasMultiRead(c.conn))
	return g
}

type readCall struct {
	path string
	// ahead is the candidate read ahead (nobody waits for the call; its
	// data goes to the memory of messages); zero for a claim's read.
	ahead Name
	res   readResult
	done  chan struct{} // closed once res is set
	// turn is signalled when the call is first in the queue and a request
	// slot is free: the caller sends the next batch. Only the first
	// waiting call is woken, not every waiter.
	turn chan struct{}
}

// read reads the data of p, the node of candidate n, sharing a request
// with concurrent reads of the Queue. The candidates queued for reading
// ahead up to n are dropped: claims take candidates in queue order, so
// those are claimed or being claimed already, and a read ahead of them
// would find them gone or read what a claim reads anyway.
func (g *readGroup) read(p string, n Name) readResult {
	c := &readCall{path: p, done: make(chan struct{}), turn: make(chan struct{}, 1)}
	g.mu.Lock()
	for len(g.ahead) > 0 && Compare(g.ahead[0], n) <= 0 {
		delete(g.aheadSet, g.ahead[0].Raw)
		g.ahead[0] = Name{}
		g.ahead = g.ahead[1:]
	}
	g.queued = append(g.queued, c)
	g.sendLocked()
	for {
		select {
		case <-c.done:
			return c.res
		case <-c.turn:
			g.mu.Lock()
			g.sendLocked()
		}
	}
}

// sendLocked, called with reads.mu held, sends the oldest queued reads
// as one request if a request slot is free, and releases the lock. When
// the request ends it hands the slot to the call first in the queue.
func (g *readGroup) sendLocked() {
	if g.inFlight >= maxReadsInFlight || len(g.queued) == 0 {
		g.mu.Unlock()
		return
	}
	batch := g.queued[:min(len(g.queued), maxReadBatch)]
	g.queued = g.queued[len(batch):]
	batch = append(batch[:len(batch):len(batch)], g.aheadCallsLocked(maxReadBatch-len(batch))...)
	g.inFlight++
	g.mu.Unlock()
	g.sendBatch(batch)
}

// sendBatch sends calls as one request, which holds a slot, answers the
// calls and hands the slot on (see sendLocked).
func (g *readGroup) sendBatch(batch []*readCall) {
	g.readCalls(batch)
	for _, b := range batch {
		if b.done != nil {
			close(b.done)
		}
	}

	g.mu.Lock()
	for _, b := range batch {
		if b.ahead.Raw != "" {
			delete(g.aheadSet, b.ahead.Raw)
			// A message node is never rewritten: data at version 0 is
			// what it was published with, as for the memory of own
			// messages (whose claims delete at version 0).
			if b.res.err == nil && b.res.version == 0 {
				g.recent.put(b.ahead, b.res.data)
			}
		}
	}
	g.inFlight--
	if len(g.queued) > 0 {
		select {
		case g.queued[0].turn <- struct{}{}:
		default: // already signalled
		}
	}
	g.mu.Unlock()
}

// aheadCallsLocked takes up to n candidates queued for reading ahead.
func (g *readGroup) aheadCallsLocked(n int) []*readCall {
	n = min(n, len(g.ahead))
	calls := make([]*readCall, n)
	for i, a := range g.ahead[:n] {
		calls[i] = &readCall{path: itemPath(g.path, a), ahead: a}
	}
	g.ahead = g.ahead[n:]
	return calls
}

// readAhead queues names, the candidates next in line, for reading ahead,
// but those remembered already or queued, while fewer than maxReadAhead
// are queued. listedPubs is the dispatcher's mark of the publishes begun
// before its snapshot's listing. It returns how many of names it looked
// at.
func (g *readGroup) readAhead(names []Name, listedPubs uint64) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.aheadSet == nil {
		g.aheadSet = make(map[string]bool)
	}
	// A message of this process's own that it does not remember may be
	// one whose publish has not returned yet, while a publish begun
	// before the snapshot's listing came back is under way: reading
	// ahead stops there until it ends (a round trip), and goes on then,
	// through the messages remembered meanwhile and those an earlier
	// process with the same tag left.
	answering := g.pubs.openSince(listedPubs)
	for i, n := range names {
		if len(g.ahead) >= maxReadAhead {
			return i
		}
		if answering && ownTag(n, g.opt.publisher) && !g.recent.has(n.Raw) {
			return i
		}
		if !g.aheadSet[n.Raw] && !g.recent.has(n.Raw) {
			g.ahead = append(g.ahead, n)
			g.aheadSet[n.Raw] = true
		}
	}
	return len(names)
}

// aheadDue reports whether a request of reads ahead alone should go now:
// a full batch is queued, no claim's read waits, and a slot is free.
func (g *readGroup) aheadDue() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.ahead) >= maxReadBatch && len(g.queued) == 0 && g.inFlight < maxReadsInFlight
}

// sendAhead sends a request of reads ahead alone, if a slot is free.
func (g *readGroup) sendAhead() {
	g.mu.Lock()
	if g.inFlight >= maxReadsInFlight || len(g.ahead) == 0 {
		g.mu.Unlock()
		return
	}
	batch := g.aheadCallsLocked(maxReadBatch)
	g.inFlight++
	g.mu.Unlock()
	g.sendBatch(batch)
}

// readCalls answers calls with one request (readBatch).
func (g *readGroup) readCalls(calls []*readCall) {
	paths := make([]string, len(calls))
	for i, c := range calls {
		paths[i] = c.path
	}
	for i, r := range g.readBatch(paths) {
		calls[i].res = r
	}
}

// readBatch reads paths (at most maxReadBatch) with one request: a
// getData for one, else a multiRead, or a getData each where the client
// has no multiRead or the server refuses it. A failure is each path's
// readResult error.
func (g *readGroup) readBatch(paths []string) []readResult {
	if len(paths) > 1 && !g.off.Load() {
		rs, err := g.multiGet(paths)
		if err == nil {
			return rs
		}
		if connectionLoss(err) {
			out := make([]readResult, len(paths))
			for i, p := range paths {
				out[i].err = fmt.Errorf("get %s: %w", p, err)
			}
			return out
		}
	}
	// One getData each, all in flight at once: the session pipelines
	// them, so the batch still costs one round trip of waiting.
	out := make([]readResult, len(paths))
	if len(paths) == 1 {
		out[0] = g.get(paths[0])
		return out
	}
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Go(func() { out[i] = g.get(p) })
	}
	wg.Wait()
	return out
}

func (g *readGroup) get(p string) readResult {
	data, stat, err := g.reader().Get(p)
	if err != nil {
		return readResult{err: fmt.Errorf("get %s: %w", p, err)}
	}
	return readResult{data: data, version: stat.Version, stat: stat}
}

// connectionLoss reports errors of the connection rather than of the
// request.
func connectionLoss(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrSessionExpired) ||
		errors.Is(err, zk.ErrClosing) || errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrSessionMoved)
}

// multiGet reads paths (at most maxReadBatch) in one multiRead. A
// refusal other than the connection's turns multiRead off for the Queue.
func (g *readGroup) multiGet(paths []string) ([]readResult, error) {
	rs, err := g.reader().MultiGet(paths...)
	if err != nil {
		if !connectionLoss(err) && g.off.CompareAndSwap(false, true) {
			// ZooKeeper before 3.6 has no multiRead: read one by one.
			g.opt.logger.Warn("multiRead refused; claims read each message on its own", "queue", g.path, "err", err)
		}
		return nil, err
	}
	out := make([]readResult, len(rs))
	for i, r := range rs {
		if r.Error != nil {
			out[i].err = fmt.Errorf("get %s: %w", paths[i], r.Error)
			continue
		}
		out[i] = readResult{data: r.Data, version: r.Stat.Version, stat: r.Stat}
	}
	return out, nil
}

// readPaths reads the data of paths, maxReadBatch at a time
// (readBatch). A missing node is an error of its readResult; the error
// returned is the connection's.
func (g *readGroup) readPaths(paths []string) ([]readResult, error) {
	out := make([]readResult, 0, len(paths))
	for i := 0; i < len(paths); i += maxReadBatch {
		for _, r := range g.readBatch(paths[i:min(i+maxReadBatch, len(paths))]) {
			if connectionLoss(r.err) {
				return out, r.err
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// multiReader is a client that reads many nodes in one request
// (ZooKeeper's multiRead): the go-zookeeper that this module's go.mod puts
// in place of the release (third_party/go-zookeeper, Conn.MultiGet). The
// release has no such method, and a replace in go.mod applies only to this
// module, so the engine builds against the release and asks the
// connection at run time (hasMultiRead): a program built with the release
// reads one getData per node, one built with the patched client (qbroker's
// own, or any module that replaces go-zookeeper with it) reads in
// multiRead requests. The signature names only types the release has too:
// the patched client's zk.ReadResponse is an alias of readResponse's
// struct type.
type multiReader interface {
	MultiGet(paths ...string) ([]readResponse, error)
}

// readResponse is the answer to one read of a multiRead.
type readResponse = struct {
	Data  []byte
	Stat  *zk.Stat
	Error error
}

// errNoMultiRead is returned by observed.MultiGet where the client has no
// multiRead; Queues check hasMultiRead first.
var errNoMultiRead = errors.New("zkqueue: the ZooKeeper client has no multiRead")

// hasMultiRead reports whether conn reads in multiRead requests.
func hasMultiRead(conn *zk.Conn) bool {
	_, ok := any(conn).(multiReader)
	return ok
}

// MultiGet is the observed multiRead ("multiread" to the Observer).
func (o observed) MultiGet(paths ...string) ([]readResponse, error) {
	m, ok := any(o.conn).(multiReader)
	if !ok {
		return nil, errNoMultiRead
	}
	start := time.Now()
	rs, err := m.MultiGet(paths...)
	o.done("multiread", start, err)
	return rs, err
}

// reader returns the session for a claim's read, round-robin.
func (g *readGroup) reader() observed {
	if len(g.readers) == 1 {
		return g.readers[0]
	}
	return g.readers[int(g.next.Add(1))%len(g.readers)]
}
