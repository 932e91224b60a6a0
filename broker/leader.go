package broker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/qbroker/qbroker/api/queuepb"
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

// membership is the broker's standing with ZooKeeper: its primary
// session's state (onZKEvent), which health, metrics and the streams'
// fencing by session read, and its leadership.
type membership struct {
	b *Broker

	hasSession atomic.Bool
	sessions   atomic.Int64 // sessions established so far
	lostAt     atomic.Int64 // unix nanoseconds the session was lost; 0 with a session
	zkState    atomic.Int32 // the last session state seen (zk.State)
	leading    atomic.Bool  // leading the election (sweeping while it has a session)
}

// runMembership campaigns in the brokers' election under every session
// until the broker closes, and leads while elected.
func (mb *membership) runMembership() {
	b := mb.b
	defer b.wg.Done()
	el, err := election.New(b.conn, b.root.Election(), election.WithLogger(b.log), election.WithCreateParents(false), election.WithACL(b.acl))
	if err != nil {
		b.log.Error("election", "err", err) // not with a root that New accepted
		return
	}
	defer el.Close()
	for b.ctx.Err() == nil {
		err := mb.memberOnce(el)
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
func (mb *membership) memberOnce(el *election.Election) error {
	b := mb.b
	if err := el.Campaign(b.ctx, []byte(b.cfg.ID)); err != nil {
		return err
	}
	defer func() {
		// Best effort: on close or expiry the session takes it anyway;
		// when this fails, the next Campaign removes it (an orphan of
		// this session).
		_ = el.Resign(context.Background())
	}()
	return mb.lead(el.Done())
}

// lead runs the catalog's upkeep (zkqueue.Catalog.Maintain: expired
// leases, abandoned deletions, dedup buckets of past windows) every
// SweepInterval, and reaps idle locks and elections (reapCoordination),
// while this broker leads and has a session: without one it cannot know
// whether it still leads (qbroker_leader is 0 meanwhile).
func (mb *membership) lead(lost <-chan struct{}) error {
	b := mb.b
	b.log.Info("leadership acquired")
	mb.leading.Store(true)
	mb.updateLeader()
	defer func() {
		mb.leading.Store(false)
		mb.updateLeader()
		b.log.Info("leadership released")
	}()
	ctx, stop := context.WithCancel(b.ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); mb.reapCoordination(ctx) }()
	go func() {
		defer wg.Done()
		_ = b.catalog.Maintain(ctx, zkqueue.MaintainConfig{
			Interval:       b.cfg.SweepInterval,
			Ready:          mb.hasSession.Load,
			Committer:      b.batcher,
			AbandonedAfter: max(time.Duration(abandonedAfter.Load()), time.Nanosecond), // 0 in tests: at once
			Released:       mb.releasedBySweep,
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
func (mb *membership) releasedBySweep(name string, expired []zkqueue.Expired) {
	b := mb.b
	b.handles.queuesMu.Lock()
	q := b.handles.queues[name]
	b.handles.queuesMu.Unlock()
	if q == nil || q.stale() {
		q = &queue{name: name, label: b.metrics.labels.get(name)}
	}
	requeued := false
	for _, e := range expired {
		b.acks.released(q, e.Message, e.Outcome)
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
func (mb *membership) reapCoordination(ctx context.Context) {
	b := mb.b
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
		if !mb.hasSession.Load() {
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

// updateLeader sets the leader gauge: 1 only while leading with a
// session. Without one the broker cannot know whether it still leads.
func (mb *membership) updateLeader() {
	b := mb.b
	v := 0.0
	if mb.leading.Load() && mb.hasSession.Load() {
		v = 1
	}
	b.metrics.leader.Set(v)
}

func (mb *membership) setServing(ok bool) {
	b := mb.b
	if b.closing() {
		return // closing: stays NOT_SERVING
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	b.health.SetServingStatus("", st)
	b.health.SetServingStatus(pb.Queue_ServiceDesc.ServiceName, st)
	b.health.SetServingStatus(pb.Election_ServiceDesc.ServiceName, st)
	b.health.SetServingStatus(pb.Lock_ServiceDesc.ServiceName, st)
	b.health.SetServingStatus(pb.Counter_ServiceDesc.ServiceName, st)
	b.health.SetServingStatus(pb.Semaphore_ServiceDesc.ServiceName, st)
	b.health.SetServingStatus(pb.Barrier_ServiceDesc.ServiceName, st)
	b.health.SetServingStatus(pb.DoubleBarrier_ServiceDesc.ServiceName, st)
}

// runSessionWatch logs at error once the broker has been without a
// session for longer than the session timeout: by then ZooKeeper has
// expired the session, whatever the client library knows (it learns of
// the expiry only once it reconnects). It repeats every outageRepeat while
// the outage lasts.
func (mb *membership) runSessionWatch() {
	b := mb.b
	defer b.wg.Done()
	t := time.NewTicker(min(b.cfg.SessionTimeout/4, time.Second))
	defer t.Stop()
	var reported int64       // the outage (lostAt) last reported
	var reportedAt time.Time // when
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		lost := mb.lostAt.Load()
		if lost == 0 {
			continue
		}
		down := time.Since(time.Unix(0, lost))
		if down < b.cfg.SessionTimeout || (lost == reported && time.Since(reportedAt) < outageRepeat) {
			continue
		}
		reported, reportedAt = lost, time.Now()
		b.log.Error("no zookeeper session for longer than the session timeout: the session has expired, with this broker's registrations and leadership",
			"down", down.Round(time.Second), "state", zk.State(mb.zkState.Load()).String(),
			"session_timeout", b.cfg.SessionTimeout, "zookeeper", b.cfg.ZooKeeper)
	}
}
