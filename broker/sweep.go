package broker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// The leader's lease sweep.
//
// The leader keeps one children watch on the catalog (queues/) and, for
// every queue, a
// data watch on its metadata (for its policy, and whether it is being
// deleted) and a zkqueue.LeaseSweeper: a children watch on the queue's
// leases parent and the deadlines of its leases, each read once. A sweep
// visits only the queues where something changed or a known deadline
// passed, so while nothing happens it makes no ZooKeeper request: an idle
// queue costs the leader a few hundred bytes and two watches. It never
// opens a queue's handle (zkqueue.Queue). Its requests are observed like the
// handles' (qbroker_zk_request_duration_seconds).
//
// The sweep also finishes deletions that were abandoned: a queue marked
// for deletion (see zkqueue.Catalog.Delete) more than abandonedAfter ago.
// And it deletes the dedup records of past windows (dedup.go), a whole
// bucket at a time: a queue is visited for that when its oldest bucket
// is due or a bucket was created (a children watch), never per record.

// sweepWorkers visit queues concurrently within one sweep (their requests
// pipeline on the session).
const sweepWorkers = 8

// abandonedAfter is how long after its mark a queue still being deleted
// is taken for abandoned (its deleter died) and deleted by the leader.
// Deleting it earlier would only duplicate the deleter's work. It is a
// variable for tests.
var abandonedAfter atomic.Int64

func init() { abandonedAfter.Store(int64(30 * time.Second)) }

// leaseSweep is the leader's sweep state; it lives while this broker
// leads and is used by one goroutine.
type leaseSweep struct {
	b      *Broker
	watch  <-chan zk.Event // children watch of queues/; nil when none is armed
	queues map[string]*sweptQueue
}

// sweptQueue is what the leader knows of one queue. Within a sweep it is
// used by one worker.
type sweptQueue struct {
	name     string
	meta     <-chan zk.Event // data watch of the metadata; nil: read it (again)
	usable   bool            // metadata read and decoded
	policy   zkqueue.Policy
	deleting bool
	marked   time.Time // when the deletion mark was set
	version  int32     // of the metadata
	leases   *zkqueue.LeaseSweeper
	noLeases bool // the leases parent is missing: nothing to sweep until the metadata changes

	dedupWindow time.Duration
	dedupRead   bool            // the dedup parent was read (dedupNext, dedupWatch are set)
	dedupNext   time.Time       // when its oldest bucket is due; zero: none
	dedupWatch  <-chan zk.Event // fires when a bucket is created
}

// dedupDue reports whether q's dedup buckets need a visit at now.
func (q *sweptQueue) dedupDue(now time.Time) bool {
	return !q.dedupRead || zkutil.Fired(q.dedupWatch) || !q.dedupNext.IsZero() && !now.Before(q.dedupNext)
}

func (b *Broker) newLeaseSweep() *leaseSweep {
	return &leaseSweep{b: b, queues: map[string]*sweptQueue{}}
}

// due reports whether q needs a visit at now; it makes no request.
func (q *sweptQueue) due(now time.Time) bool {
	switch {
	case zkutil.Fired(q.meta):
		return true
	case !q.usable:
		return false
	case q.deleting:
		return now.Sub(q.marked) > time.Duration(abandonedAfter.Load())
	case q.dedupDue(now):
		return true
	case q.noLeases:
		return false
	}
	return q.leases == nil || q.leases.Due(now)
}

// run is one sweep: it follows the queues' creations and deletions, then
// visits the queues that are due, sweepWorkers at a time.
func (s *leaseSweep) run() error {
	if zkutil.Fired(s.watch) {
		s.watch = nil
		names, w, err := s.b.catalog.Names()
		if err != nil {
			return err
		}
		s.watch = w
		// Keep what is known of the queues still listed; forget the rest.
		next := make(map[string]*sweptQueue, len(names))
		for _, n := range names {
			next[n] = s.queues[n]
			if next[n] == nil {
				next[n] = &sweptQueue{name: n}
			}
		}
		s.queues = next
	}
	now := time.Now()
	var due []*sweptQueue
	for _, q := range s.queues {
		if q.due(now) {
			due = append(due, q)
		}
	}
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	work := func() {
		for {
			i := int(next.Add(1)) - 1
			if i >= len(due) || s.b.ctx.Err() != nil {
				return
			}
			if err := s.visit(due[i], now); err != nil {
				errOnce.Do(func() { firstErr = err })
			}
		}
	}
	var wg sync.WaitGroup
	for i := 1; i < min(sweepWorkers, len(due)); i++ {
		wg.Add(1)
		go func() { defer wg.Done(); work() }()
	}
	work()
	wg.Wait()
	return firstErr
}

// visit reads q's metadata when it changed, finishes an abandoned
// deletion, or releases q's expired leases.
func (s *leaseSweep) visit(q *sweptQueue, now time.Time) error {
	b := s.b
	p := b.queuePath(q.name)
	if zkutil.Fired(q.meta) {
		q.meta = nil
		st, w, err := b.catalog.Lookup(q.name)
		if errors.Is(err, zkqueue.ErrQueueNotFound) {
			return nil // deleted: the children watch of queues/ drops it
		}
		if err != nil {
			return err
		}
		// Deleted and created anew, or marked: start over.
		*q = sweptQueue{name: q.name, meta: w, usable: st.Err == nil, deleting: st.Spec.Deleting,
			marked: st.Modified, version: st.Version, policy: st.Spec.Policy(), dedupWindow: st.Spec.Dedup()}
		if !q.due(now) {
			return nil
		}
	}
	if !q.usable {
		return nil
	}
	if q.deleting {
		ctx, cancel := context.WithTimeout(b.ctx, b.cfg.SweepInterval)
		defer cancel()
		b.log.Info("finishing an abandoned queue deletion", "queue", q.name)
		return b.catalog.FinishDelete(ctx, q.name, q.version)
	}
	if q.dedupDue(now) {
		if err := s.expireDedup(q, p, now); err != nil {
			return err
		}
	}
	if q.noLeases {
		return nil
	}
	if q.leases == nil {
		q.leases = zkqueue.NewLeaseSweeper(b.conn, p+"/items", p+"/leases", p+"/dead",
			zkqueue.SweeperConfig{Observer: b.observeZK, Committer: b.batcher, ACL: b.acl, Groups: p + "/groups"})
	}
	if !q.leases.Due(now) {
		return nil
	}
	expired, err := q.leases.Sweep(b.ctx, now, q.policy)
	if errors.Is(err, zk.ErrNoNode) {
		q.noLeases = true // being deleted, or left half-deleted by an old release
		return nil
	}
	if len(expired) > 0 {
		s.released(q.name, expired)
	}
	return err
}

// expireDedup deletes q's dedup buckets of past windows.
func (s *leaseSweep) expireDedup(q *sweptQueue, p string, now time.Time) error {
	n, next, w, err := zkqueue.ExpireDedup(s.b.ctx, s.b.conn, p+"/dedup", q.dedupWindow, now)
	if err != nil {
		return err
	}
	q.dedupRead, q.dedupNext, q.dedupWatch = true, next, w
	if n > 0 {
		s.b.log.Debug("deleted expired dedup records", "queue", q.name, "count", n)
	}
	return nil
}

// released accounts for the leases a sweep released. A queue this broker
// consumes also gets its snapshot dropped, so the requeued messages are
// seen at once.
func (s *leaseSweep) released(name string, expired []zkqueue.Expired) {
	b := s.b
	b.queuesMu.Lock()
	q := b.queues[name]
	b.queuesMu.Unlock()
	if q == nil || q.stale() {
		q = &queue{name: name, label: b.metrics.labels.get(name)}
	}
	requeued := false
	for _, e := range expired {
		b.released(q, e.Message, e.Outcome)
		requeued = requeued || e.Outcome == zkqueue.Requeued
	}
	if requeued && q.items != nil {
		q.items.Rescan()
	}
	b.log.Debug("released expired leases", "queue", name, "count", len(expired))
}
