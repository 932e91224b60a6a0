package zkqueue

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// The catalog's upkeep (Maintain), run by one process at a time (the
// brokers' leader).
//
// Maintain keeps one children watch on the catalog and, for every queue,
// a data watch on its metadata (for its policy, and whether it is being
// deleted) and a LeaseSweeper: a children watch on the queue's leases
// parent and the deadlines of its leases, each read once. A sweep visits
// only the queues where something changed or a known deadline passed, so
// while nothing happens it makes no ZooKeeper request: an idle queue
// costs the maintainer a few hundred bytes and two watches. It never
// opens a queue's Handles. Its requests are observed like the handles'
// (CatalogConfig.Observer).
//
// A sweep also finishes deletions that were abandoned: a queue marked for
// deletion (see Catalog.Delete) more than MaintainConfig.AbandonedAfter
// ago. And it deletes the dedup records of past windows (ExpireDedup), a
// whole bucket at a time: a queue is visited for that when its oldest
// bucket is due or a bucket was created (a children watch), never per
// record.
//
// Drained segments are not the maintainer's: the consumers that drain
// them remove them (dispatch.go). Nor are the delayed moves and the TTL
// expiry, which every process with the queue open runs (Handles.Run).

// sweepWorkers visit queues concurrently within one sweep (their requests
// pipeline on the session).
const sweepWorkers = 8

// DefaultAbandonedAfter is how long after its mark a queue still being
// deleted is taken for abandoned (its deleter died) by default. Deleting
// it earlier would only duplicate the deleter's work.
const DefaultAbandonedAfter = 30 * time.Second

// MaintainConfig configures Maintain. Zero fields take the defaults.
type MaintainConfig struct {
	// Interval between sweeps (default 1s).
	Interval time.Duration
	// Ready, when set, is asked before each sweep, which is skipped when
	// it returns false (a process without a session cannot know whether
	// it is still the one to sweep).
	Ready func() bool
	// Committer, when set, carries the releases (see WithCommitter).
	Committer *Committer
	// AbandonedAfter: see DefaultAbandonedAfter.
	AbandonedAfter time.Duration
	// Released, when set, is told of the leases a sweep released from the
	// queue name: requeued (a process consuming the queue may Rescan) or
	// dead-lettered.
	Released func(name string, expired []Expired)
	// Error, when set, is told of a sweep's failure; the next sweep
	// retries.
	Error func(error)
}

// Maintain runs the catalog's upkeep (see above) every cfg.Interval until
// ctx ends, and returns ctx's error. Run it in one process at a time:
// several are safe (every release and deletion is conditional) but
// duplicate the work.
func (c *Catalog) Maintain(ctx context.Context, cfg MaintainConfig) error {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.AbandonedAfter <= 0 {
		cfg.AbandonedAfter = DefaultAbandonedAfter
	}
	m := &maintainer{c: c, cfg: cfg, queues: map[string]*sweptQueue{}}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	early := time.NewTimer(time.Hour)
	defer early.Stop()
	for {
		// A lease a delayed nack (or a backoff) settled is released at
		// its deadline, not at the next interval, once the sweeper
		// knows of it.
		var wake <-chan time.Time
		if next := m.nextDue(); !next.IsZero() {
			early.Reset(max(time.Until(next), minEarlySweep))
			wake = early.C
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		case <-wake:
		}
		if cfg.Ready != nil && !cfg.Ready() {
			continue
		}
		if err := m.sweep(ctx); err != nil && ctx.Err() == nil && cfg.Error != nil {
			cfg.Error(err)
		}
	}
}

// minEarlySweep spaces the sweeps Maintain runs between its intervals
// for the deadlines of nacked leases (see LeaseSweeper.NextDue).
const minEarlySweep = 10 * time.Millisecond

// nextDue returns the earliest deadline of a nacked lease the queues'
// sweepers know of; zero when none.
func (m *maintainer) nextDue() time.Time {
	var next time.Time
	for _, q := range m.queues {
		if !q.nextDue.IsZero() && (next.IsZero() || q.nextDue.Before(next)) {
			next = q.nextDue
		}
	}
	return next
}

// maintainer is Maintain's state, used by one goroutine.
type maintainer struct {
	c      *Catalog
	cfg    MaintainConfig
	watch  <-chan zk.Event // children watch of the catalog; nil when none is armed
	queues map[string]*sweptQueue
}

// sweptQueue is what the maintainer knows of one queue. Within a sweep it
// is used by one worker.
type sweptQueue struct {
	name     string
	meta     <-chan zk.Event // data watch of the metadata; nil: read it (again)
	usable   bool            // metadata read and decoded
	policy   Policy
	deleting bool
	marked   time.Time // when the deletion mark was set
	version  int32     // of the metadata
	leases   *LeaseSweeper
	noLeases bool      // the leases parent is missing: nothing to sweep until the metadata changes
	nextDue  time.Time // leases.NextDue after the last sweep of q

	dedupWindow time.Duration
	dedupRead   bool            // the dedup parent was read (dedupNext, dedupWatch are set)
	dedupNext   time.Time       // when its oldest bucket is due; zero: none
	dedupWatch  <-chan zk.Event // fires when a bucket is created
}

// dedupDue reports whether q's dedup buckets need a visit at now.
func (q *sweptQueue) dedupDue(now time.Time) bool {
	return !q.dedupRead || zkutil.Fired(q.dedupWatch) || !q.dedupNext.IsZero() && !now.Before(q.dedupNext)
}

// due reports whether q needs a visit at now; it makes no request.
func (q *sweptQueue) due(now time.Time, abandonedAfter time.Duration) bool {
	switch {
	case zkutil.Fired(q.meta):
		return true
	case !q.usable:
		return false
	case q.deleting:
		return now.Sub(q.marked) > abandonedAfter
	case q.dedupDue(now):
		return true
	case q.noLeases:
		return false
	}
	return q.leases == nil || q.leases.Due(now)
}

// sweep follows the queues' creations and deletions, then visits the
// queues that are due, sweepWorkers at a time.
func (m *maintainer) sweep(ctx context.Context) error {
	if zkutil.Fired(m.watch) {
		m.watch = nil
		names, w, err := m.c.Names()
		if err != nil {
			return err
		}
		m.watch = w
		// Keep what is known of the queues still listed; forget the rest.
		next := make(map[string]*sweptQueue, len(names))
		for _, n := range names {
			next[n] = m.queues[n]
			if next[n] == nil {
				next[n] = &sweptQueue{name: n}
			}
		}
		m.queues = next
	}
	now := time.Now()
	var due []*sweptQueue
	for _, q := range m.queues {
		if q.due(now, m.cfg.AbandonedAfter) {
			due = append(due, q)
		}
	}
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	work := func() {
		for {
			i := int(next.Add(1)) - 1
			if i >= len(due) || ctx.Err() != nil {
				return
			}
			if err := m.visit(ctx, due[i], now); err != nil {
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
// deletion, expires dedup buckets, or releases q's expired leases.
func (m *maintainer) visit(ctx context.Context, q *sweptQueue, now time.Time) error {
	c := m.c
	p := c.Path(q.name)
	if zkutil.Fired(q.meta) {
		q.meta = nil
		st, w, err := c.Lookup(q.name)
		if errors.Is(err, ErrQueueNotFound) {
			return nil // deleted: the children watch of the catalog drops it
		}
		if err != nil {
			return err
		}
		// Deleted and created anew, or marked: start over.
		*q = sweptQueue{name: q.name, meta: w, usable: st.Err == nil, deleting: st.Spec.Deleting,
			marked: st.Modified, version: st.Version, policy: st.Spec.Policy(), dedupWindow: st.Spec.Dedup()}
		if !q.due(now, m.cfg.AbandonedAfter) {
			return nil
		}
	}
	if !q.usable {
		return nil
	}
	if q.deleting {
		ctx, cancel := context.WithTimeout(ctx, m.cfg.Interval)
		defer cancel()
		c.cfg.Logger.Info("finishing an abandoned queue deletion", "queue", q.name)
		return c.FinishDelete(ctx, q.name, q.version)
	}
	if q.dedupDue(now) {
		if err := m.expireDedup(ctx, q, p, now); err != nil {
			return err
		}
	}
	if q.noLeases {
		return nil
	}
	if q.leases == nil {
		q.leases = NewLeaseSweeper(c.conn, p+"/items", p+"/leases", p+"/dead",
			SweeperConfig{Observer: c.cfg.Observer, Committer: m.cfg.Committer, ACL: c.cfg.ACL, Groups: p + "/groups"})
	}
	if !q.leases.Due(now) {
		return nil
	}
	expired, err := q.leases.Sweep(ctx, now, q.policy)
	q.nextDue = q.leases.NextDue()
	if errors.Is(err, zk.ErrNoNode) {
		q.noLeases = true // being deleted, or left half-deleted by an old release
		return nil
	}
	if len(expired) > 0 && m.cfg.Released != nil {
		m.cfg.Released(q.name, expired)
	}
	return err
}

// expireDedup deletes q's dedup buckets of past windows.
func (m *maintainer) expireDedup(ctx context.Context, q *sweptQueue, p string, now time.Time) error {
	n, next, w, err := ExpireDedup(ctx, m.c.conn, p+"/dedup", q.dedupWindow, now)
	if err != nil {
		return err
	}
	q.dedupRead, q.dedupNext, q.dedupWatch = true, next, w
	if n > 0 {
		m.c.cfg.Logger.Debug("deleted expired dedup records", "queue", q.name, "count", n)
	}
	return nil
}
