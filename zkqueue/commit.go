package zkqueue

import (
	"context"
	"errors"
	"path"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Committer coalesces small write transactions of concurrent callers into
// one ZooKeeper Multi (group commit). ZooKeeper pays per transaction: one
// proposal, one log append and fsync, whatever the number of ops in it, so
// 64 consumers' deletes in one Multi cost about what one delete costs.
//
// Each caller's transaction stays atomic on its own. A combined Multi
// fails as a whole when any one op fails (say, a claim lost to another
// broker). When no other transaction can have caused that failure, its
// transaction gets the answer and the others commit again together
// (failAlone, failStale); otherwise the Committer runs each caller's
// transaction on its own, so every caller gets its own result. While one
// combined Multi is in flight the next batch fills, so batches grow with
// load and a lone caller pays no wait.
//
// Pipelining adapts to the load: as many Multis as there are sessions go
// out at once, however small; further ones overlap them only when full
// enough (pipelineOps). A trickle of small transactions (consumers claiming and
// acking one message at a time) thus shares Multis instead of each
// taking its own, which is what ZooKeeper's CPU pays for, while a heavy
// load still keeps several large Multis in flight per session.
//
// A Committer is safe for concurrent use. Close stops its goroutines.
type Committer struct {
	conns    []observed
	obs      Observer
	reqs     chan *batchReq
	maxOps   int
	maxBytes int
	wg       sync.WaitGroup
	stopOnce sync.Once
	stop     chan struct{}

	mu     sync.RWMutex // held shared while enqueueing; Close takes it
	closed bool

	fillMu   sync.Mutex   // held by the worker filling a batch
	inflight atomic.Int32 // Multis under way
	freedMu  sync.Mutex
	freed    chan struct{} // closed, and replaced, whenever a Multi ends

	// Deferred transactions (WithDeferredCommit), oldest first, and what
	// makes them go: deferDue is signalled when they reach deferOps or
	// the oldest has waited deferWait (deferTimer).
	deferWait  time.Duration // the const deferWait; tests may hold them longer
	deferMu    sync.Mutex
	deferred   []*batchReq
	deferOps   int
	deferTimer *time.Timer
	deferDue   chan struct{}
}

// pipelineOps is the ops a batch needs to go out while every session
// already has a Multi under way; a smaller one waits for more
// transactions or for one of those Multis to end. At 8 rather than 32,
// consumers that wait for each ack's commit drained 5-13% faster and the
// open loop's p99 was no worse (docs/performance.md), while batches of
// 100 and more fill it anyway.
const pipelineOps = 8

// Deferred commit. Some writes have no caller waiting on their latency:
// an ack a client sent on its Consume stream without asking for the
// outcome. Sent the moment a session is free, as every write is, a
// prefetch-1 consumer's acks went out a few at a time, and ZooKeeper pays
// per Multi: a drain of 16 such consumers took 0.13 Multis per message
// against 0.06 at prefetch 100 (docs/performance.md). A deferred
// transaction instead waits, up to deferWait or until deferOps ops of such
// transactions wait, and goes with the first Multi that leaves meanwhile
// (a claim round's, say), or in one of its own then.
const (
	deferWait = 5 * time.Millisecond
	deferOps  = 64
)

type deferKey struct{}

// WithDeferredCommit returns a context whose writes through a Committer
// may wait to share a Multi with later ones: up to 5 ms, or until 64 ops
// of such writes wait, unless another Multi leaves first and takes them
// along. For writes whose callers do not wait on them; the outcome is
// reported as for any write.
func WithDeferredCommit(ctx context.Context) context.Context {
	return context.WithValue(ctx, deferKey{}, true)
}

func isDeferred(ctx context.Context) bool {
	v, _ := ctx.Value(deferKey{}).(bool)
	return v
}

type batchReq struct {
	ops   []any
	bytes int
	done  chan batchResult
}

type batchResult struct {
	res []zk.MultiResponse
	err error
}

// ErrCommitterClosed is returned by Do after Close.
var ErrCommitterClosed = errors.New("zkqueue: committer closed")

// CommitterConfig tunes a Committer. Zero fields take the defaults.
type CommitterConfig struct {
	// Workers is the number of Multis in flight per session
	// (pipelining); default 4.
	Workers int
	// MaxOps bounds the ops of one combined Multi; default 256.
	MaxOps int
	// MaxBytes bounds a combined Multi's size, about; default 400 KiB,
	// which with one transaction more stays below jute.maxbuffer.
	MaxBytes int
	// Observer, when set, sees every Multi, and every Do as op "commit"
	// (its wait for a batch and a session included).
	Observer Observer
}

// NewCommitter starts a Committer over conns (sessions to the same
// ensemble). Close stops it.
func NewCommitter(conns []*zk.Conn, cfg CommitterConfig) *Committer {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.MaxOps <= 0 {
		cfg.MaxOps = 256
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 400 << 10
	}
	workers, maxOps, maxBytes, obs := cfg.Workers, cfg.MaxOps, cfg.MaxBytes, cfg.Observer
	b := &Committer{
		obs:       obs,
		reqs:      make(chan *batchReq, 4*maxOps),
		maxOps:    maxOps,
		maxBytes:  maxBytes,
		stop:      make(chan struct{}),
		freed:     make(chan struct{}),
		deferDue:  make(chan struct{}, 1),
		deferWait: deferWait,
	}
	for _, c := range conns {
		b.conns = append(b.conns, observed{c, obs})
	}
	b.wg.Add(workers * len(conns))
	for i := 0; i < workers*len(conns); i++ {
		go b.run(b.conns[i%len(conns)])
	}
	return b
}

// Close stops the Committer once the requests already queued are done.
func (c *Committer) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.stopOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
	c.deferMu.Lock()
	if c.deferTimer != nil {
		c.deferTimer.Stop()
	}
	c.deferMu.Unlock()
}

func opBytes(op any) int {
	switch o := op.(type) {
	case *zk.CreateRequest:
		return len(o.Path) + len(o.Data) + opOverhead
	case *zk.SetDataRequest:
		return len(o.Path) + len(o.Data) + opOverhead
	case *zk.DeleteRequest:
		return len(o.Path) + opOverhead
	case *zk.CheckVersionRequest:
		return len(o.Path) + opOverhead
	}
	return opOverhead
}

// Do runs ops as one atomic transaction, possibly inside a larger Multi
// with other callers' transactions. The result is as conn.Multi's for ops
// alone: per-op responses, and an error naming the failing op's cause.
//
// When ctx ends first, Do returns ctx.Err(): before the transaction was
// queued nothing was written; after, its outcome is unknown, as with a
// connection lost before the answer.
func (c *Committer) Do(ctx context.Context, ops ...any) (res []zk.MultiResponse, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if c.obs != nil {
		start := time.Now()
		defer func() { c.obs("commit", time.Since(start), err) }()
	}
	r := &batchReq{ops: ops, done: make(chan batchResult, 1)}
	for _, op := range ops {
		r.bytes += opBytes(op)
	}
	if r.bytes > c.maxBytes {
		res, err := c.conns[0].Multi(ops...)
		return res, zkutil.MultiError(res, err)
	}
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return nil, ErrCommitterClosed
	}
	if isDeferred(ctx) {
		c.deferLocked(r) // the workers serve it before they stop
	} else {
		select {
		case c.reqs <- r: // the workers run until Close, which waits for this send
		case <-ctx.Done():
			c.mu.RUnlock()
			return nil, ctx.Err()
		}
	}
	c.mu.RUnlock()
	select {
	case out := <-r.done:
		return out.res, out.err
	case <-ctx.Done():
		return nil, ctx.Err() // r.done is buffered: the worker never blocks on it
	}
}

func (c *Committer) run(conn observed) {
	defer c.wg.Done()
	for {
		// One worker at a time fills a batch: the transactions waiting
		// go into one Multi, not into a fragment each.
		c.fillMu.Lock()
		batch, nops, ok := c.fill()
		if ok {
			c.inflight.Add(1)
		}
		c.fillMu.Unlock()
		if !ok {
			return
		}
		c.commit(conn, batch, nops)
		c.inflight.Add(-1)
		c.freedMu.Lock()
		close(c.freed)
		c.freed = make(chan struct{})
		c.freedMu.Unlock()
	}
}

// deferLocked, called with c.mu held shared, adds r to the deferred
// transactions and signals deferDue once they are due.
func (c *Committer) deferLocked(r *batchReq) {
	c.deferMu.Lock()
	defer c.deferMu.Unlock()
	c.deferred = append(c.deferred, r)
	c.deferOps += len(r.ops)
	switch {
	case c.deferOps >= deferOps:
		c.signalDeferred()
	case len(c.deferred) > 1:
	case c.deferTimer == nil:
		c.deferTimer = time.AfterFunc(c.deferWait, c.signalDeferred)
	default:
		c.deferTimer.Reset(c.deferWait)
	}
}

func (c *Committer) signalDeferred() {
	select {
	case c.deferDue <- struct{}{}:
	default: // already signalled
	}
}

// takeDeferred takes the oldest deferred transactions that fit in ops
// and bytes more; for a batch of their own (first), at least one.
func (c *Committer) takeDeferred(ops, bytes int, first bool) []*batchReq {
	c.deferMu.Lock()
	defer c.deferMu.Unlock()
	n := 0
	for _, r := range c.deferred {
		if (len(r.ops) > ops || r.bytes > bytes) && !(first && n == 0) {
			break
		}
		ops, bytes = ops-len(r.ops), bytes-r.bytes
		c.deferOps -= len(r.ops)
		n++
	}
	taken := c.deferred[:n:n]
	c.deferred = c.deferred[n:]
	switch {
	case len(c.deferred) == 0:
		c.deferred = nil
		if c.deferTimer != nil {
			c.deferTimer.Stop()
		}
	case n > 0:
		c.signalDeferred() // the rest did not fit: another batch takes them
	}
	return taken
}

// fill waits for a transaction, or deferred ones due, and adds those
// queued behind it, up to the bounds. ok is false when the Committer
// stopped with nothing queued.
func (c *Committer) fill() (batch []*batchReq, nops int, ok bool) {
	for len(batch) == 0 {
		select {
		case r := <-c.reqs:
			batch = []*batchReq{r}
		case <-c.deferDue:
			batch = c.takeDeferred(c.maxOps, c.maxBytes, true)
		case <-c.stop:
			// Serve what is queued, then stop.
			select {
			case r := <-c.reqs:
				batch = []*batchReq{r}
			default:
				if batch = c.takeDeferred(c.maxOps, c.maxBytes, true); len(batch) == 0 {
					return nil, 0, false
				}
			}
		}
	}
	nbytes := 0
	for _, r := range batch {
		nops, nbytes = nops+len(r.ops), nbytes+r.bytes
	}
fill:
	for nops < c.maxOps {
		select {
		case r := <-c.reqs:
			batch = append(batch, r)
			nops += len(r.ops)
			nbytes += r.bytes
			if nbytes >= c.maxBytes {
				break fill
			}
		default:
			break fill
		}
	}
	batch, nops, nbytes = c.fillWhileBusy(batch, nops, nbytes)
	// Deferred transactions go along with any batch.
	for _, r := range c.takeDeferred(c.maxOps-nops, c.maxBytes-nbytes, false) {
		batch = append(batch, r)
		nops += len(r.ops)
	}
	return batch, nops, true
}

// fillWhileBusy adds to a small batch while every session has a Multi
// under way: it returns when the batch reaches pipelineOps (or a bound),
// or when one of those Multis ends.
func (c *Committer) fillWhileBusy(batch []*batchReq, nops, nbytes int) ([]*batchReq, int, int) {
	for nops < min(pipelineOps, c.maxOps) && nbytes < c.maxBytes {
		c.freedMu.Lock()
		freed := c.freed // taken before the check, so no end is missed
		c.freedMu.Unlock()
		if int(c.inflight.Load()) < len(c.conns) {
			return batch, nops, nbytes
		}
		select {
		case r := <-c.reqs:
			batch = append(batch, r)
			nops += len(r.ops)
			nbytes += r.bytes
		case <-freed:
		}
	}
	return batch, nops, nbytes
}

func (c *Committer) commit(conn observed, batch []*batchReq, nops int) {
	if len(batch) == 1 {
		res, err := conn.Multi(batch[0].ops...)
		if err != nil {
			err = zkutil.MultiError(res, err)
		}
		batch[0].done <- batchResult{res, err}
		return
	}
	ops := make([]any, 0, nops)
	for _, r := range batch {
		ops = append(ops, r.ops...)
	}
	res, err := conn.Multi(ops...)
	if err == nil {
		i := 0
		for _, r := range batch {
			r.done <- batchResult{res: res[i : i+len(r.ops)]}
			i += len(r.ops)
		}
		return
	}
	if len(res) == 0 {
		// The request did not get an answer (connection lost): the
		// outcome is unknown for everyone.
		for _, r := range batch {
			r.done <- batchResult{err: err}
		}
		return
	}
	rest, ok := failStale(batch, ops, res)
	if !ok {
		rest, ok = failAlone(batch, ops, res)
	}
	if ok {
		if len(rest) > 0 {
			n := 0
			for _, r := range rest {
				n += len(r.ops)
			}
			c.commit(conn, rest, n)
		}
		return
	}
	// One transaction spoiled the batch: run each on its own.
	var wg sync.WaitGroup
	for _, r := range batch {
		wg.Add(1)
		go func(r *batchReq) {
			defer wg.Done()
			res, err := conn.Multi(r.ops...)
			r.done <- batchResult{res, zkutil.MultiError(res, err)}
		}(r)
	}
	wg.Wait()
}

// failStale handles a combined Multi that failed on a version check, the
// way a publish into a sealed (or removed) segment fails (producer.go): every
// transaction of the batch carrying the same check would fail alone for
// the same reason at the same point, so each gets that answer at once, and
// the others commit again together. A batch straddling a seal costs two
// Multis, not one per transaction. ok is false when the failing op is not
// such a check.
func failStale(batch []*batchReq, ops []any, res []zk.MultiResponse) (rest []*batchReq, ok bool) {
	i, cause := failedIndex(res)
	if i < 0 || i >= len(ops) || !errors.Is(cause, zk.ErrBadVersion) && !errors.Is(cause, zk.ErrNoNode) {
		return nil, false
	}
	check, isCheck := ops[i].(*zk.CheckVersionRequest)
	if !isCheck || touches(ops[:i], check.Path) {
		// Not a check, or one an earlier op of the same Multi (another
		// caller's) may have failed: only running each alone tells.
		return nil, false
	}
	for _, r := range batch {
		j := slices.IndexFunc(r.ops, func(op any) bool {
			c, ok := op.(*zk.CheckVersionRequest)
			return ok && c.Path == check.Path && c.Version == check.Version
		})
		if j < 0 {
			rest = append(rest, r)
			continue
		}
		r.failAt(j, cause)
	}
	return rest, true
}

// failAt answers r as a Multi of its ops alone that failed at op j.
func (r *batchReq) failAt(j int, cause error) {
	out := make([]zk.MultiResponse, len(r.ops))
	for k := range out {
		out[k].Error = zk.ErrAPIError // not executed, as ZooKeeper reports the ops around a failure
	}
	out[j].Error = cause
	r.done <- batchResult{out, cause}
}

// failAlone handles a combined Multi that failed on an op no other
// transaction's earlier op could have changed the outcome of: a claim's
// delete of a message another broker took (NoNode), an ack of a lease
// that changed (BadVersion), a duplicate's dedup record (NodeExists). No
// op of the transactions before the failing one's writes the failing
// op's node, its parent or a child of it, so that transaction would fail
// alone at the same op: it gets that answer at once and the others
// commit again together. A lost claim costs one Multi more, not one per
// transaction of its batch. ok is false when another transaction may be
// the cause (then only running each alone tells).
func failAlone(batch []*batchReq, ops []any, res []zk.MultiResponse) (rest []*batchReq, ok bool) {
	i, cause := failedIndex(res)
	if i < 0 || i >= len(ops) {
		return nil, false
	}
	p := opPath(ops[i])
	if c, isCreate := ops[i].(*zk.CreateRequest); p == "" || isCreate && c.Flags&zk.FlagSequence != 0 {
		// A sequential create's name depends on every create and delete
		// under its parent before it.
		return nil, false
	}
	// The transaction holding op i, and where its ops begin.
	k, start := 0, 0
	for ; i-start >= len(batch[k].ops); k++ {
		start += len(batch[k].ops)
	}
	if touches(ops[:start], p) {
		return nil, false
	}
	batch[k].failAt(i-start, cause)
	return slices.Delete(slices.Clone(batch), k, k+1), true
}

// opPath returns the node an op names, "" for an op of another kind.
func opPath(op any) string {
	switch o := op.(type) {
	case *zk.CreateRequest:
		return o.Path
	case *zk.SetDataRequest:
		return o.Path
	case *zk.DeleteRequest:
		return o.Path
	case *zk.CheckVersionRequest:
		return o.Path
	}
	return ""
}

// touches reports whether one of ops changes node p, its parent, or its
// children (which a delete of p depends on).
func touches(ops []any, p string) bool {
	for _, op := range ops {
		if _, isCheck := op.(*zk.CheckVersionRequest); isCheck {
			continue
		}
		q := opPath(op)
		if q == p || q == path.Dir(p) || path.Dir(q) == p {
			return true
		}
	}
	return false
}

// failedIndex returns the index and error of the op that failed a Multi,
// -1 when none says. Ops after the failing one report an error too
// (runtime inconsistency), so the first one is it.
func failedIndex(res []zk.MultiResponse) (int, error) {
	for i, r := range res {
		if r.Error != nil && !errors.Is(r.Error, zk.ErrAPIError) {
			return i, r.Error
		}
	}
	return -1, nil
}

// write runs ops as one transaction: through the Committer when there is
// one, else as a plain request (one op) or a Multi. Errors name the
// failing op's cause.
func (c *core) write(ctx context.Context, ops ...any) ([]zk.MultiResponse, error) {
	if c.opt.committer != nil {
		return c.opt.committer.Do(ctx, ops...)
	}
	if len(ops) == 1 {
		switch o := ops[0].(type) {
		case *zk.CreateRequest:
			p, err := c.zk.Create(o.Path, o.Data, o.Flags, o.Acl)
			return []zk.MultiResponse{{String: p, Error: err}}, err
		case *zk.DeleteRequest:
			err := c.zk.Delete(o.Path, o.Version)
			return []zk.MultiResponse{{Error: err}}, err
		}
	}
	res, err := c.zk.Multi(ops...)
	return res, zkutil.MultiError(res, err)
}

// multi runs ops as one Multi on the queue's own session, never through
// the Committer.
func (c *core) multi(ctx context.Context, ops ...any) ([]zk.MultiResponse, error) {
	res, err := c.zk.Multi(ops...)
	return res, zkutil.MultiError(res, err)
}
