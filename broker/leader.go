package broker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/lock"
	"github.com/qbroker/qbroker/lockdelay"
	"github.com/qbroker/qbroker/semaphore"
	"github.com/qbroker/qbroker/syncqueue"
	"github.com/qbroker/qbroker/zkqueue"
)

// Membership and leadership.
//
// Each broker registers an EPHEMERAL node /<root>/brokers/<id> (kept by
// its zkqueue.Registry: created again under every new session, and taken
// over from an earlier session of the same id) and takes part in the
// election under /<root>/election (package election: EPHEMERAL_SEQUENTIAL
// nodes n-<seq>, the lowest leads, every other broker watches only its
// predecessor; this session's orphaned nodes are removed). The leader
// runs the catalog's upkeep (zkqueue.Catalog.Maintain), while it has a
// session. When the session
// expires, the election node vanishes and the broker campaigns again with
// its new session.

func (b *Broker) runMembership() {
	defer b.wg.Done()
	el, err := election.New(b.conn, b.root.Election(), election.WithLogger(b.log), election.WithCreateParents(false), election.WithACL(b.acl))
	if err != nil {
		b.log.Error("election", "err", err) // not with a root that New accepted
		return
	}
	defer el.Close()
	for b.ctx.Err() == nil {
		err := b.memberOnce(el)
		if b.ctx.Err() != nil {
			return
		}
		if err != nil {
			b.log.Debug("membership", "err", err)
		}
		select {
		case <-b.ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// memberOnce campaigns and, when leading, sweeps, until the leadership
// ends (the session expired, the node was deleted) or the broker closes.
func (b *Broker) memberOnce(el *election.Election) error {
	if err := el.Campaign(b.ctx, []byte(b.cfg.ID)); err != nil {
		return err
	}
	defer func() {
		// Best effort: on close or expiry the session takes it anyway;
		// when this fails, the next Campaign removes it (an orphan of
		// this session).
		_ = el.Resign(context.Background())
	}()
	return b.lead(el.Done())
}

// lead runs the catalog's upkeep (zkqueue.Catalog.Maintain: expired
// leases, abandoned deletions, dedup buckets of past windows) every
// SweepInterval, and reaps idle locks and elections (reapCoordination),
// while this broker leads and has a session: without one it cannot know
// whether it still leads (qbroker_leader is 0 meanwhile).
func (b *Broker) lead(lost <-chan struct{}) error {
	b.log.Info("leadership acquired")
	b.leading.Store(true)
	b.updateLeader()
	defer func() {
		b.leading.Store(false)
		b.updateLeader()
		b.log.Info("leadership released")
	}()
	ctx, stop := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); b.reapCoordination(ctx) }()
	go func() {
		defer wg.Done()
		_ = b.catalog.Maintain(ctx, zkqueue.MaintainConfig{
			Interval:       b.cfg.SweepInterval,
			Ready:          b.hasSession.Load,
			Committer:      b.batcher,
			AbandonedAfter: max(time.Duration(abandonedAfter.Load()), time.Nanosecond), // 0 in tests: at once
			Released:       b.releasedBySweep,
			Error:          func(err error) { b.log.Debug("sweep", "err", err) },
		})
	}()
	defer func() { stop(); wg.Wait() }()
	select {
	case <-b.ctx.Done():
		return nil
	case <-lost:
		return errors.New("leadership lost")
	}
}

// abandonedAfter is zkqueue.MaintainConfig.AbandonedAfter; a variable for
// tests.
var abandonedAfter atomic.Int64

func init() { abandonedAfter.Store(int64(zkqueue.DefaultAbandonedAfter)) }

// releasedBySweep accounts for the leases the leader's sweep released
// from the queue name (metrics, events). A queue this broker consumes also
// gets its snapshot dropped, so the requeued messages are seen at once.
func (b *Broker) releasedBySweep(name string, expired []zkqueue.Expired) {
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

// coordReapInterval is how often the leader looks for idle locks and
// elections: one that had no contender for a whole interval is deleted
// at the next pass. It is a variable for tests.
var coordReapInterval atomic.Int64

func init() { coordReapInterval.Store(int64(30 * time.Second)) }

// reapCoordination deletes the nodes of idle locks (locks/<name>),
// elections (elections/<name>), semaphores (semaphores/<name>) and double
// barriers (doublebarriers/<name>) every coordReapInterval until ctx ends,
// with the recipes' Reapers: otherwise every name ever used would stay in
// ZooKeeper. A contender that finds its name's node gone makes it again.
// Before that it ends the lock-delays of lost holders, leaders and leases
// that nobody contends for (lockdelay.Sweeper): their markers go once their
// delay has passed, and the names can then be reaped.
func (b *Broker) reapCoordination(ctx context.Context) {
	lr, err := lock.NewReaper(b.conn, b.root.Locks())
	if err != nil {
		b.log.Error("lock reaper", "err", err) // not with a root that New accepted
		return
	}
	er, err := election.NewReaper(b.conn, b.root.Elections())
	if err != nil {
		b.log.Error("election reaper", "err", err)
		return
	}
	sr, err := semaphore.NewReaper(b.conn, b.root.Semaphores())
	if err != nil {
		b.log.Error("semaphore reaper", "err", err)
		return
	}
	dr, err := syncqueue.NewDoubleBarrierReaper(b.conn, b.root.DoubleBarriers())
	if err != nil {
		b.log.Error("double barrier reaper", "err", err)
		return
	}
	sweepers := []*lockdelay.Sweeper{
		lockdelay.NewSweeper(b.conn, b.root.Locks()),
		lockdelay.NewSweeper(b.conn, b.root.Elections()),
		lockdelay.NewSubSweeper(b.conn, b.root.Semaphores(), "leases"),
	}
	t := time.NewTicker(time.Duration(coordReapInterval.Load()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !b.hasSession.Load() {
			continue
		}
		for _, s := range sweepers {
			if n, err := s.Pass(ctx); err != nil && ctx.Err() == nil {
				b.log.Debug("ending lock-delays", "err", err)
			} else if n > 0 {
				b.log.Debug("ended lock-delays", "count", n)
			}
		}
		if n, err := lr.Reap(ctx); err != nil && ctx.Err() == nil {
			b.log.Debug("reaping idle locks", "err", err)
		} else if n > 0 {
			b.log.Debug("deleted idle locks", "count", n)
		}
		if n, err := er.Reap(ctx); err != nil && ctx.Err() == nil {
			b.log.Debug("reaping idle elections", "err", err)
		} else if n > 0 {
			b.log.Debug("deleted idle elections", "count", n)
		}
		if n, err := sr.Reap(ctx); err != nil && ctx.Err() == nil {
			b.log.Debug("reaping idle semaphores", "err", err)
		} else if n > 0 {
			b.log.Debug("deleted idle semaphores", "count", n)
		}
		if n, err := dr.Reap(ctx); err != nil && ctx.Err() == nil {
			b.log.Debug("reaping idle double barriers", "err", err)
		} else if n > 0 {
			b.log.Debug("deleted idle double barriers", "count", n)
		}
	}
}
