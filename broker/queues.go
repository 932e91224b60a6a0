package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// Per-queue layout under /<root>/queues/<name> (whose data is queueMeta):
//
//	items/      ready messages (qn-... or pNNN-..., PERSISTENT_SEQUENTIAL)
//	leases/     at-least-once deliveries in flight (<item>~<nonce>)
//	dead/       dead letters (<item>)
//	consumers/  one EPHEMERAL node per open Consume stream (<broker id>~<nonce>)
//	members/    synchronizing queues: one EPHEMERAL node per member
//	start       synchronizing queues: exists once the group is complete
//
// CreateQueue creates the node and its five parents in one Multi. Nothing
// else creates them: handles only read, so a handle opened while its
// queue is being deleted cannot bring parts of it back.

// queue is this broker's handle on one queue: its metadata and the shared
// Store through which all local consumers take messages (the queue's
// dispatcher in this process). Handles are cached; a metadata watch
// evicts a handle when the queue is deleted or changed elsewhere.
type queue struct {
	name   string
	path   string
	meta   queueMeta
	label  string // metrics label
	items  *zkqueue.Queue
	leases *zkqueue.Leases
	sync   *syncGate // nil unless kind sync
	policy zkqueue.Policy
	gone   <-chan zk.Event // the metadata watch; fires on delete/change
	used   atomic.Int64    // when a call or a scan last used the handle, unix ns

	depthMu   sync.Mutex
	depthN    int       // ready messages at depthRead
	depthRead time.Time // when depthN was read

	consumers *zkqueue.ConsumerGroup // the Consume streams on all brokers: registrations, rank
}

// published counts n messages this broker added into the cached depth.
func (q *queue) published(n int) {
	q.depthMu.Lock()
	q.depthN += n
	q.depthMu.Unlock()
}

// depthTTL is how long a read queue depth serves publishes. The limit is
// thereby approximate by what a queue takes in that time, far below the
// margin between MaxDepth's ceiling and what a getChildren answer holds.
const depthTTL = 100 * time.Millisecond

// depth returns the queue's ready messages, read from the parent's Stat at
// most every depthTTL, plus what this broker published since.
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
	q.depthN, q.depthRead = n, time.Now()
	return n, nil
}

// touch notes that the queue is in use on this broker (see runStats).
func (q *queue) touch() { q.used.Store(time.Now().UnixNano()) }

// idle reports whether the handle went unused for d.
func (q *queue) idle(d time.Duration) bool {
	return time.Since(time.Unix(0, q.used.Load())) > d
}

func (q *queue) stale() bool { return zkutil.Fired(q.gone) }

// queue returns the handle of an existing queue; errQueueNotFound when
// there is none.
func (b *Broker) queue(ctx context.Context, name string) (*queue, error) {
	if err := validName("queue name", name); err != nil {
		return nil, err
	}
	b.queuesMu.Lock()
	q := b.queues[name]
	b.queuesMu.Unlock()
	if q != nil && !q.stale() {
		q.touch()
		return q, nil
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
		return cur, nil // another call loaded it first: share its Store
	}
	b.queues[name] = q
	return q, nil
}

// queueInfo returns a queue's configuration: from its handle when this
// broker has one, else read, without opening a handle (listing many
// queues must not leave a handle and a watch per queue behind).
func (b *Broker) queueInfo(name string) (queueMeta, error) {
	b.queuesMu.Lock()
	q := b.queues[name]
	b.queuesMu.Unlock()
	if q != nil && !q.stale() {
		return q.meta, nil
	}
	data, _, err := b.conn.Get(b.queuePath(name))
	if errors.Is(err, zk.ErrNoNode) {
		return queueMeta{}, fmt.Errorf("%w: %s", errQueueNotFound, name)
	}
	if err != nil {
		return queueMeta{}, fmt.Errorf("get %s: %w", b.queuePath(name), err)
	}
	m, err := decodeMeta(data)
	if err != nil || m.Deleting {
		return queueMeta{}, fmt.Errorf("%w: %s", errQueueNotFound, name)
	}
	return m, nil
}

func (b *Broker) loadQueue(name string) (*queue, error) {
	p := b.queuePath(name)
	data, _, watch, err := b.conn.GetW(p)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, fmt.Errorf("%w: %s", errQueueNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", p, err)
	}
	meta, err := decodeMeta(data)
	if err != nil {
		// Unreadable metadata: treat as absent.
		return nil, fmt.Errorf("%w: %s (%v)", errQueueNotFound, name, err)
	}
	if meta.Deleting {
		return nil, fmt.Errorf("%w: %s (being deleted)", errQueueNotFound, name)
	}
	label := b.metrics.labels.get(name)
	conflicts := b.metrics.conflicts.WithLabelValues(label)
	q := &queue{name: name, path: p, meta: meta, label: label, gone: watch,
		policy: zkqueue.Policy{MaxDeliveries: meta.MaxDeliveries, DeadLetter: meta.DeadLetter}}
	if q.consumers, err = b.consumerGroup(p); err != nil {
		return nil, err
	}
	opts := []zkqueue.Option{
		zkqueue.WithLimits(zkqueue.Limits{MaxPayload: b.cfg.MaxPayload, MaxBatchBytes: b.cfg.MaxBatchBytes, MaxBatchCount: b.cfg.MaxBatchCount}),
		zkqueue.WithConflictHook(conflicts.Inc),
		zkqueue.WithObserver(b.observeZK),
		zkqueue.WithCommitter(b.batcher),
		zkqueue.WithMemory(b.recent),
		zkqueue.WithReaders(b.readers...),
		// Every scan is a use: a queue whose consumers wait here is
		// served here.
		zkqueue.WithShare(func() (int, int) { q.touch(); return q.consumers.Rank() }),
		zkqueue.WithLogger(b.log.With("queue", name)),
		zkqueue.WithoutCreate(), // loading never writes (see the layout above)
	}
	if meta.Kind == kindPriority {
		opts = append(opts, zkqueue.WithPriorities())
	}
	items, err := zkqueue.New(b.conn, p+"/items", opts...)
	if err != nil {
		return nil, err
	}
	leases, err := zkqueue.NewLeases(items, p+"/leases", p+"/dead")
	if err != nil {
		return nil, err
	}
	q.items, q.leases = items, leases
	if meta.Kind == kindSync {
		if q.sync, err = b.newSyncGate(q); err != nil {
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

// queueParents are the parents created with every queue, in the order
// a deletion removes them: the ready messages first, so consumers stop
// finding any, then the rest.
var queueParents = []string{"items", "leases", "dead", "consumers", "members"}

// createAttempts bounds the rounds of a CreateQueue that keeps meeting a
// queue of the same name deleted or being deleted concurrently.
const createAttempts = 8

// createQueue creates the queue's nodes in one Multi. An existing queue
// with the same configuration is returned as is (after creating any of its
// parents that are missing). A queue of that name being deleted is
// deleted first, then created anew. Beyond MaxQueues queues it fails with
// errLimit.
func (b *Broker) createQueue(ctx context.Context, name string, m queueMeta) (queueMeta, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return m, err
	}
	p := b.queuePath(name)
	acl := zk.WorldACL(zk.PermAll)
	ops := []any{&zk.CreateRequest{Path: p, Data: data, Acl: acl}}
	for _, c := range queueParents {
		ops = append(ops, &zk.CreateRequest{Path: p + "/" + c, Acl: acl})
	}
	for attempt := 0; attempt < createAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		n, err := b.queueCount()
		if err != nil {
			return m, err
		}
		if n < b.cfg.MaxQueues {
			res, err := b.conn.Multi(ops...)
			if err == nil {
				return m, nil
			}
			if err = firstError(res, err); !errors.Is(err, zk.ErrNodeExists) {
				return m, fmt.Errorf("create queue %s: %w", name, err)
			}
		}
		// The queue exists, or there is no room for another.
		cur, stat, err := b.conn.Get(p)
		if errors.Is(err, zk.ErrNoNode) {
			if n >= b.cfg.MaxQueues {
				return m, fmt.Errorf("%w: %d queues exist, at most %d (--max-queues)", errLimit, n, b.cfg.MaxQueues)
			}
			continue // deleted meanwhile
		}
		if err != nil {
			return m, fmt.Errorf("get %s: %w", p, err)
		}
		old, err := decodeMeta(cur)
		if err != nil {
			return m, fmt.Errorf("%w: %s exists with unreadable metadata", errQueueExists, name)
		}
		if old.Deleting {
			if err := b.removeQueue(ctx, name, stat.Version); err != nil {
				return m, b.deletingErr(name, err)
			}
			continue
		}
		if !old.sameConfig(m) {
			return old, fmt.Errorf("%w: %s is a %s queue", errQueueExists, name, old.Kind)
		}
		if err := b.repairQueue(p, stat.Version); errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNodeExists) {
			continue // marked for deletion, or repaired, meanwhile: look again
		} else if err != nil {
			return m, err
		}
		return old, nil
	}
	return m, fmt.Errorf("%w: %s is being deleted and created concurrently", errQueueDeleting, name)
}

// repairQueue creates the parents missing under an existing queue's node
// p (left so by an interrupted deletion of an earlier release), checking
// in the same Multi that p is still at version: a queue marked for
// deletion meanwhile is left alone (zk.ErrBadVersion).
func (b *Broker) repairQueue(p string, version int32) error {
	children, _, err := b.conn.Children(p)
	if err != nil {
		return fmt.Errorf("children %s: %w", p, err)
	}
	ops := []any{&zk.CheckVersionRequest{Path: p, Version: version}}
	for _, c := range queueParents {
		if !slices.Contains(children, c) {
			ops = append(ops, &zk.CreateRequest{Path: p + "/" + c, Acl: zk.WorldACL(zk.PermAll)})
		}
	}
	if len(ops) == 1 {
		return nil
	}
	res, err := b.conn.Multi(ops...)
	if err != nil {
		return fmt.Errorf("repair %s: %w", p, firstError(res, err))
	}
	return nil
}

// queueCount returns the number of queue nodes (those being deleted
// included), from the parent's Stat.
func (b *Broker) queueCount() (int, error) {
	_, stat, err := b.conn.Exists(b.queuesPath())
	if err != nil {
		return 0, fmt.Errorf("exists %s: %w", b.queuesPath(), err)
	}
	return int(stat.NumChildren), nil
}

func firstError(res []zk.MultiResponse, err error) error {
	for _, r := range res {
		if r.Error != nil && !errors.Is(r.Error, zk.ErrAPIError) {
			return r.Error
		}
	}
	return err
}

// listQueues returns the names of all queues with prefix, sorted.
func (b *Broker) listQueues(prefix string) ([]string, error) {
	children, _, err := b.conn.Children(b.queuesPath())
	if err != nil {
		return nil, fmt.Errorf("children %s: %w", b.queuesPath(), err)
	}
	var out []string
	for _, c := range children {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	sort.Strings(out)
	return out, nil
}

// markAttempts bounds the rounds of a DeleteQueue whose mark meets
// concurrent writes of the metadata (another DeleteQueue's mark).
const markAttempts = 4

// deleteQueue deletes a queue in two steps. It marks the metadata
// Deleting with a versioned setData: from then on no broker opens the
// queue, every broker's handle is dropped (its metadata watch fires), and
// CreateQueue finishes the deletion before creating the queue anew. Then
// it deletes the queue's nodes bottom-up (removeQueue). A DeleteQueue
// that meets a queue already marked (a concurrent DeleteQueue, or one
// interrupted by a crash) does the same deletion and answers OK once the
// queue is gone; of two concurrent calls, one may answer NotFound when the
// other removed the queue before it looked.
func (b *Broker) deleteQueue(ctx context.Context, name string) error {
	p := b.queuePath(name)
	for attempt := 0; attempt < markAttempts; attempt++ {
		data, stat, err := b.conn.Get(p)
		if errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("%w: %s", errQueueNotFound, name)
		}
		if err != nil {
			return fmt.Errorf("get %s: %w", p, err)
		}
		version := stat.Version
		m, err := decodeMeta(data)
		if err != nil {
			m = queueMeta{V: metaVersion} // unreadable: the mark is all it keeps
		}
		if !m.Deleting {
			m.Deleting = true
			mark, err := json.Marshal(m)
			if err != nil {
				return err
			}
			st, err := b.conn.Set(p, mark, version)
			switch {
			case errors.Is(err, zk.ErrBadVersion):
				continue // marked by another call meanwhile: look again
			case errors.Is(err, zk.ErrNoNode):
				return fmt.Errorf("%w: %s", errQueueNotFound, name)
			case err != nil:
				return fmt.Errorf("mark %s: %w", p, err)
			}
			version = st.Version
		}
		b.evict(name)
		if err := b.removeQueue(ctx, name, version); err != nil {
			return b.deletingErr(name, err)
		}
		return nil
	}
	return fmt.Errorf("%w: %s: its metadata keeps changing; retry", errQueueDeleting, name)
}

// deletingErr is the error of a call that could not finish deleting a
// queue marked for deletion: the caller's context and ZooKeeper's
// unavailability as such, anything else as errQueueDeleting (the details
// are logged). The queue stays marked; the next DeleteQueue or
// CreateQueue of that name, or the leader, finishes the deletion.
func (b *Broker) deletingErr(name string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || zkutil.IsUnavailable(err) {
		return err
	}
	b.log.Warn("deleting a queue failed", "queue", name, "err", err)
	return fmt.Errorf("%w: %s; retry", errQueueDeleting, name)
}

// removeQueue deletes the nodes of a queue marked for deletion at version
// (the version of its marked metadata), parents in queueParents order,
// then whatever else is there (a sync queue's start), then the queue's
// node at that version. Each delete checks the version in the same
// transaction, so nodes created concurrently by publishers, releases or
// consumers are deleted too, while a queue created anew under the same
// name after the deletion is never touched. It returns nil once that
// incarnation of the queue is gone, whoever removed it.
func (b *Broker) removeQueue(ctx context.Context, name string, version int32) error {
	p := b.queuePath(name)
	guard := &zkutil.Guard{Path: p, Version: version}
	targets := make([]string, 0, len(queueParents)+1)
	for _, c := range queueParents {
		targets = append(targets, p+"/"+c)
	}
	for _, t := range append(targets, p) {
		err := zkutil.DeleteTree(ctx, b.conn, t, guard)
		if errors.Is(err, zkutil.ErrGuardChanged) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// A handle unused for statsIdleAfter (no call, no scan by a local
// consumer) has its gauges refreshed only every statsIdleEvery-th
// interval: a broker that once served many queues does not keep reading
// all of them, while a backlog nobody consumes still shows.
const (
	statsIdleAfter = 5 * time.Minute
	statsIdleEvery = 10
)

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
			if n == 0 && err == nil {
				b.metrics.oldestAge.WithLabelValues(q.label).Set(0)
			} else if age, err := q.items.OldestAge(b.ctx); err == nil {
				b.metrics.oldestAge.WithLabelValues(q.label).Set(age.Seconds())
			}
		}
	}
}
