package qcore

import (
	"errors"
	"sync"

	"github.com/go-zookeeper/zk"
)

// Batcher coalesces small write transactions of concurrent callers into
// one ZooKeeper Multi (group commit). ZooKeeper pays per transaction: one
// proposal, one log append and fsync, whatever the number of ops in it, so
// 64 consumers' deletes in one Multi cost about what one delete costs.
//
// Each caller's transaction stays atomic on its own. A combined Multi
// fails as a whole when any one op fails (say, a claim lost to another
// broker); the Batcher then runs each caller's transaction on its own, so
// every caller gets its own result. While one combined Multi is in flight
// the next batch fills, so batches grow with load and a lone caller pays
// no wait.
//
// A Batcher is safe for concurrent use. Close stops its goroutines.
type Batcher struct {
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

// ErrBatcherClosed is returned by Do after Close.
var ErrBatcherClosed = errors.New("batcher closed")

// NewBatcher starts a Batcher over conns (sessions to the same ensemble)
// with workers concurrent Multis in flight per session (pipelining), each
// of at most maxOps ops and about maxBytes.
func NewBatcher(conns []*zk.Conn, workers, maxOps, maxBytes int, obs Observer) *Batcher {
	b := &Batcher{
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

// Close stops the Batcher once the requests already queued are done.
func (b *Batcher) Close() {
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
func (b *Batcher) Do(ops ...any) ([]zk.MultiResponse, error) {
	r := &batchReq{ops: ops, done: make(chan batchResult, 1)}
	for _, op := range ops {
		r.bytes += opBytes(op)
	}
	if r.bytes > b.maxBytes {
		res, err := b.conns[0].Multi(ops...)
		return res, multiErr(res, err)
	}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return nil, ErrBatcherClosed
	}
	b.reqs <- r // the workers run until Close, which waits for this send
	b.mu.RUnlock()
	out := <-r.done
	return out.res, out.err
}

func (b *Batcher) run(conn observed) {
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

func (b *Batcher) commit(conn observed, batch []*batchReq, nops int) {
	if len(batch) == 1 {
		res, err := conn.Multi(batch[0].ops...)
		batch[0].done <- batchResult{res, multiErr(res, err)}
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
	// One transaction spoiled the batch: run each on its own.
	var wg sync.WaitGroup
	for _, r := range batch {
		wg.Add(1)
		go func(r *batchReq) {
			defer wg.Done()
			res, err := conn.Multi(r.ops...)
			r.done <- batchResult{res, multiErr(res, err)}
		}(r)
	}
	wg.Wait()
}

// multiErr returns the cause of a failed Multi: the failing op's error
// rather than the transaction's generic one.
func multiErr(res []zk.MultiResponse, err error) error {
	if err == nil {
		return nil
	}
	return firstMultiError(res, err)
}
