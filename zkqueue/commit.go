package zkqueue

import (
	"context"
	"errors"
	"slices"
	"sync"

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
// broker); the Committer then runs each caller's transaction on its own, so
// every caller gets its own result. While one combined Multi is in flight
// the next batch fills, so batches grow with load and a lone caller pays
// no wait.
//
// A Committer is safe for concurrent use. Close stops its goroutines.
type Committer struct {
	conns    []observed
	reqs     chan *batchReq
	maxOps   int
	maxBytes int
	wg       sync.WaitGroup
	stopOnce sync.Once
	stop     chan struct{}

	mu     sync.RWMutex // held shared while enqueueing; Close takes it
	closed bool
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
	// Observer, when set, sees every Multi.
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
		reqs:     make(chan *batchReq, 4*maxOps),
		maxOps:   maxOps,
		maxBytes: maxBytes,
		stop:     make(chan struct{}),
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
func (b *Committer) Close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.stopOnce.Do(func() { close(b.stop) })
	b.wg.Wait()
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
func (b *Committer) Do(ctx context.Context, ops ...any) ([]zk.MultiResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := &batchReq{ops: ops, done: make(chan batchResult, 1)}
	for _, op := range ops {
		r.bytes += opBytes(op)
	}
	if r.bytes > b.maxBytes {
		res, err := b.conns[0].Multi(ops...)
		return res, zkutil.MultiError(res, err)
	}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return nil, ErrCommitterClosed
	}
	select {
	case b.reqs <- r: // the workers run until Close, which waits for this send
	case <-ctx.Done():
		b.mu.RUnlock()
		return nil, ctx.Err()
	}
	b.mu.RUnlock()
	select {
	case out := <-r.done:
		return out.res, out.err
	case <-ctx.Done():
		return nil, ctx.Err() // r.done is buffered: the worker never blocks on it
	}
}

func (b *Committer) run(conn observed) {
	defer b.wg.Done()
	for {
		var first *batchReq
		select {
		case first = <-b.reqs:
		case <-b.stop:
			// Serve what is queued, then stop.
			select {
			case first = <-b.reqs:
			default:
				return
			}
		}
		batch := []*batchReq{first}
		nops, nbytes := len(first.ops), first.bytes
	fill:
		for nops < b.maxOps {
			select {
			case r := <-b.reqs:
				batch = append(batch, r)
				nops += len(r.ops)
				nbytes += r.bytes
				if nbytes >= b.maxBytes {
					break fill
				}
			default:
				break fill
			}
		}
		b.commit(conn, batch, nops)
	}
}

func (b *Committer) commit(conn observed, batch []*batchReq, nops int) {
	if len(batch) == 1 {
		res, err := conn.Multi(batch[0].ops...)
		batch[0].done <- batchResult{res, zkutil.MultiError(res, err)}
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
		rest, ok = failExisting(batch, ops, res)
	}
	if ok {
		if len(rest) > 0 {
			n := 0
			for _, r := range rest {
				n += len(r.ops)
			}
			b.commit(conn, rest, n)
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
// way a publish into a sealed (or removed) segment fails (roll.go): every
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
	if !isCheck || writes(ops[:i], check.Path) {
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
		out := make([]zk.MultiResponse, len(r.ops))
		for k := range out {
			out[k].Error = zk.ErrAPIError // not executed, as ZooKeeper reports the ops around a failure
		}
		out[j].Error = cause
		r.done <- batchResult{out, cause}
	}
	return rest, true
}

// failExisting handles a combined Multi that failed creating a node that
// existed before it (no earlier op of the Multi writes that path), the
// way a repeated publish fails on its dedup record (dedup.go): the
// transaction holding that create would fail alone at the same op, so it
// gets that answer at once and the others commit again together. One
// duplicate costs one Multi more, not one per transaction. ok is false
// when the failing op is not such a create.
func failExisting(batch []*batchReq, ops []any, res []zk.MultiResponse) (rest []*batchReq, ok bool) {
	i, cause := failedIndex(res)
	if i < 0 || i >= len(ops) || !errors.Is(cause, zk.ErrNodeExists) {
		return nil, false
	}
	c, isCreate := ops[i].(*zk.CreateRequest)
	if !isCreate || c.Flags&zk.FlagSequence != 0 || writes(ops[:i], c.Path) {
		return nil, false
	}
	start := 0
	for _, r := range batch {
		j := i - start
		start += len(r.ops)
		if j < 0 || j >= len(r.ops) {
			rest = append(rest, r)
			continue
		}
		out := make([]zk.MultiResponse, len(r.ops))
		for k := range out {
			out[k].Error = zk.ErrAPIError
		}
		out[j].Error = cause
		r.done <- batchResult{out, cause}
	}
	return rest, true
}

// writes reports whether one of ops changes node p.
func writes(ops []any, p string) bool {
	for _, op := range ops {
		switch o := op.(type) {
		case *zk.CreateRequest:
			if o.Path == p {
				return true
			}
		case *zk.SetDataRequest:
			if o.Path == p {
				return true
			}
		case *zk.DeleteRequest:
			if o.Path == p {
				return true
			}
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
