package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/zkqueue"
)

// The queues live in a zkqueue.Catalog under /<root>/queues: its layout,
// creation and two-step deletion are there, and it opens a queue's parts
// (zkqueue.Catalog.Open). Handles only read: a handle opened while its
// queue is being deleted cannot bring parts of it back.

// queue is this broker's handle on one queue: its metadata and the shared
// zkqueue.Queue through which all local consumers take messages (the queue's
// dispatcher in this process). Handles are cached; a metadata watch
// evicts a handle when the queue is deleted or changed elsewhere (not
// when the broker's session is lost: zkqueue.Handles.Stale).
type queue struct {
	name   string
	h      *zkqueue.Handles // what the catalog opened: the parts below, and the queue's jobs (Run)
	path   string           // the queue's node (quota.go)
	meta   zkqueue.Spec
	label  string // metrics label
	items  *zkqueue.Queue
	leases *zkqueue.Leases
	sync   *syncGate // nil unless kind sync
	policy zkqueue.Policy
	used   atomic.Int64 // when a call or a scan last used the handle, unix ns

	depthMu   sync.Mutex
	depthN    int       // ready messages at depthRead
	depthRead time.Time // when depthN was read

	dataMu   sync.Mutex
	dataN    int64     // data bytes under the queue's node at dataRead (quota.go)
	dataRead time.Time // when dataN was read

	consumers *zkqueue.ConsumerGroup // the Consume streams on all brokers: registrations, rank

	delayed *zkqueue.Scheduled // the messages published with a delay (schedule.go)

	streams atomic.Int32 // this broker's Consume streams of the queue (packStream)

	aheadMu   sync.Mutex
	ahead     *ahead          // the messages claimed ahead for this broker's streams (ahead.go); nil without streams
	aheadGone <-chan struct{} // closed once the last ended buffer gave back its messages; nil: none yet
}

// published counts n messages this broker added into the cached depth.
func (q *queue) published(n int) {
	q.depthMu.Lock()
	q.depthN += n
	q.depthMu.Unlock()
}

// depthTTL is how long a read queue depth serves publishes. The limit is
// thereby approximate by what a queue takes in that time.
const depthTTL = 100 * time.Millisecond

// depth returns the queue's ready and delayed messages, read from the
// parents' Stats at most every depthTTL, plus what this broker published
// since.
func (q *queue) depth(ctx context.Context) (int, error) {
	q.depthMu.Lock()
	defer q.depthMu.Unlock()
	if time.Since(q.depthRead) < depthTTL {
		return q.depthN, nil
	}
	n, err := q.items.Len(ctx)
	if err != nil {
		return 0, err
	}
	delayed, err := q.delayed.Len(ctx)
	if err != nil {
		return 0, err
	}
	n += delayed
	q.depthN, q.depthRead = n, time.Now()
	return n, nil
}

// touch notes that the queue is in use on this broker (see runStats).
func (q *queue) touch() { q.used.Store(time.Now().UnixNano()) }

// idle reports whether the handle went unused for d.
func (q *queue) idle(d time.Duration) bool {
	return time.Since(time.Unix(0, q.used.Load())) > d
}

// stale reports whether the queue was deleted or changed under the
// handle (zkqueue.Handles.Stale): a lost session alone keeps it, so the
// Consume streams holding it and later calls share one handle.
func (q *queue) stale() bool { return q.h.Stale() }

// queue returns the handle of an existing queue; errQueueNotFound when
// there is none.
func (b *Broker) queue(ctx context.Context, name string) (*queue, error) {
	b.queuesMu.Lock()
	q := b.queues[name]
	b.queuesMu.Unlock()
	if q != nil && !q.stale() {
		q.touch() // only valid names are ever cached
		return q, nil
	}
	if err := validName("queue name", name); err != nil {
		return nil, err
	}
	q, err := b.loadQueue(name)
	if err != nil {
		return nil, err
	}
	q.touch()
	b.queuesMu.Lock()
	defer b.queuesMu.Unlock()
	if cur := b.queues[name]; cur != nil && !cur.stale() {
		cur.touch()
		return cur, nil // another call loaded it first: share its Queue
	}
	b.queues[name] = q
	b.startSchedulers(q)
	return q, nil
}

// spec returns a queue's configuration: from its handle when this broker
// has one, else read, without opening a handle (listing many queues must
// not leave a handle and a watch per queue behind).
func (b *Broker) spec(name string) (zkqueue.Spec, error) {
	b.queuesMu.Lock()
	q := b.queues[name]
	b.queuesMu.Unlock()
	if q != nil && !q.stale() {
		return q.meta, nil
	}
	return b.catalog.Info(name)
}

func (b *Broker) loadQueue(name string) (*queue, error) {
	label := b.metrics.labels.get(name)
	b.metrics.initQueue(label)
	conflicts := b.metrics.conflicts.WithLabelValues(label)
	bad := b.metrics.badNodes.WithLabelValues(label)
	expired := b.metrics.expired.WithLabelValues(label)
	packs := b.metrics.packSize.WithLabelValues(label)
	q := &queue{name: name, label: label}
	h, err := b.catalog.Open(name, zkqueue.OpenConfig{
		ProcessID: b.cfg.ID,
		Registry:  b.registry,
		Expired:   func(n int) { expired.Add(float64(n)) },
	},
		zkqueue.WithLimits(zkqueue.Limits{MaxPayload: b.cfg.MaxPayload, MaxBatchBytes: b.cfg.MaxBatchBytes, MaxBatchCount: b.cfg.MaxBatchCount}),
		zkqueue.WithConflictHook(conflicts.Inc),
		zkqueue.WithBadDataHook(func(string) { bad.Inc() }),
		zkqueue.WithPackHook(func(n int) { packs.Observe(float64(n)) }),
		zkqueue.WithCommitter(b.batcher),
		zkqueue.WithSegmentSize(b.cfg.SegmentSize),
		zkqueue.WithMemory(b.recent),
		zkqueue.WithReaders(b.readers...),
		// Every scan is a use: a queue whose consumers wait here is
		// served here. q.consumers and q.meta are set before q is shared.
		// A single-active queue has one consumer at a time: its whole
		// queue, in order, is the active stream's (active.go).
		zkqueue.WithOwners(func() zkqueue.Share {
			q.touch()
			if q.meta.SingleActive {
				return zkqueue.Share{Rank: 0, N: 1}
			}
			return q.consumers.Share()
		}),
		zkqueue.WithPublisher(b.cfg.ID),
		zkqueue.WithLogger(b.log.With("queue", name)),
	)
	if err != nil {
		return nil, err
	}
	q.h, q.path, q.meta, q.policy = h, h.Path, h.Spec, h.Spec.Policy()
	q.items, q.leases, q.delayed, q.consumers = h.Items, h.Leases, h.Delayed, h.Consumers
	if q.meta.Kind == kindSync {
		if q.sync, err = b.newSyncGate(h); err != nil {
			return nil, err
		}
	}
	return q, nil
}

// gone turns a NoNode from a queue's own nodes (lost races never get
// here) into errQueueNotFound: the queue was deleted under the handle.
func (b *Broker) gone(q *queue, err error) error {
	if errors.Is(err, zk.ErrNoNode) {
		b.evict(q.name)
		return fmt.Errorf("%w: %s (deleted)", errQueueNotFound, q.name)
	}
	return err
}

func (b *Broker) evict(name string) {
	b.queuesMu.Lock()
	delete(b.queues, name)
	b.queuesMu.Unlock()
}

// A handle unused for statsIdleAfter (no call, no scan by a local
// consumer) has its gauges refreshed only every statsIdleEvery-th
// interval: a broker that once served many queues does not keep reading
// all of them, while a backlog nobody consumes still shows.
const (
	statsIdleAfter = 5 * time.Minute
	statsIdleEvery = 10
)

// packHoldIdle: a packed queue without Consume streams here, unused this
// long, gets what its takes buffered given back at the next stats tick.
const packHoldIdle = time.Second

// runStats refreshes the queue gauges of the queues this broker has
// served, every StatsInterval (see statsIdleAfter). Reads only: Stats of
// two parents, and the head message of a queue that has one.
func (b *Broker) runStats() {
	defer b.wg.Done()
	t := time.NewTicker(b.cfg.StatsInterval)
	defer t.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		b.queuesMu.Lock()
		qs := make([]*queue, 0, len(b.queues))
		for name, q := range b.queues {
			if q.stale() {
				delete(b.queues, name) // deleted or changed: reloaded when used
				continue
			}
			qs = append(qs, q)
		}
		b.queuesMu.Unlock()
		for _, q := range qs {
			if q.meta.Packed && q.streams.Load() == 0 && q.idle(packHoldIdle) {
				b.givePacksBack(q) // what Receive calls claimed and did not take
			}
			if q.label == OtherQueue || (q.idle(statsIdleAfter) && tick%statsIdleEvery != 0) {
				continue
			}
			n, err := q.items.Len(b.ctx)
			if err == nil {
				b.metrics.depth.WithLabelValues(q.label).Set(float64(n))
			}
			if n, err := q.leases.InFlight(b.ctx); err == nil {
				b.metrics.inFlight.WithLabelValues(q.label).Set(float64(n))
			}
			if n, err := q.leases.DeadCount(b.ctx); err == nil {
				b.metrics.dead.WithLabelValues(q.label).Set(float64(n))
			}
			if n == 0 && err == nil {
				b.metrics.oldestAge.WithLabelValues(q.label).Set(0)
			} else if age, err := q.items.OldestAge(b.ctx); err == nil {
				b.metrics.oldestAge.WithLabelValues(q.label).Set(age.Seconds())
			}
		}
	}
}
