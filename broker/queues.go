package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/qcore"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// Per-queue layout under /<root>/queues/<name> (whose data is queueMeta):
//
//	items/      ready messages (qn-... or pNNN-..., PERSISTENT_SEQUENTIAL)
//	leases/     at-least-once deliveries in flight (<item>~<nonce>)
//	dead/       dead letters (<item>)
//	consumers/  one EPHEMERAL_SEQUENTIAL node per open Consume stream
//	members/    synchronizing queues: one EPHEMERAL node per member
//	start       synchronizing queues: exists once the group is complete

// queue is this broker's handle on one queue: its metadata and the shared
// Store through which all local consumers take messages (the queue's
// dispatcher in this process). Handles are cached; a metadata watch
// evicts a handle when the queue is deleted or changed elsewhere.
type queue struct {
	name   string
	path   string
	meta   queueMeta
	label  string // metrics label
	items  *qcore.Store
	leases *qcore.Leases
	sync   *syncGate // nil unless kind sync
	policy qcore.Policy
	gone   <-chan zk.Event // the metadata watch; fires on delete/change

	depthMu   sync.Mutex
	depthN    int       // ready messages at depthRead
	depthRead time.Time // when depthN was read

	shareMu   sync.Mutex
	shareRank int       // this broker's rank among the queue's consuming brokers
	shareN    int       // how many brokers consume the queue
	shareRead time.Time // when the two were read
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

func (q *queue) stale() bool {
	select {
	case <-q.gone:
		return true
	default:
		return false
	}
}

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
		return q, nil
	}
	q, err := b.loadQueue(name)
	if err != nil {
		return nil, err
	}
	b.queuesMu.Lock()
	defer b.queuesMu.Unlock()
	if cur := b.queues[name]; cur != nil && !cur.stale() {
		return cur, nil // another call loaded it first: share its Store
	}
	b.queues[name] = q
	return q, nil
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
		// Half-created or half-deleted: treat as absent.
		return nil, fmt.Errorf("%w: %s (%v)", errQueueNotFound, name, err)
	}
	label := b.metrics.labels.get(name)
	conflicts := b.metrics.conflicts.WithLabelValues(label)
	q := &queue{name: name, path: p, meta: meta, label: label, gone: watch,
		policy: qcore.Policy{MaxDeliveries: meta.MaxDeliveries, DeadLetter: meta.DeadLetter}}
	items, err := qcore.NewStore(b.conn, p+"/items", qcore.Config{
		MaxPayload:    b.cfg.MaxPayload,
		MaxBatchBytes: b.cfg.MaxBatchBytes,
		MaxBatchCount: b.cfg.MaxBatchCount,
		Strict:        meta.Kind == kindPriority,
		ConflictHook:  conflicts.Inc,
		Observer:      b.observeZK,
		Batcher:       b.batcher,
		Recent:        b.recent,
		Readers:       b.readers,
		Share:         q.share(b),
		Logger:        b.log.With("queue", name),
	})
	if err != nil {
		return nil, err
	}
	leases, err := qcore.NewLeases(items, p+"/leases", p+"/dead")
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

// createQueue creates the queue's nodes in one Multi. An existing queue
// with the same configuration is returned as is.
func (b *Broker) createQueue(ctx context.Context, name string, m queueMeta) (queueMeta, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return m, err
	}
	p := b.queuePath(name)
	acl := zk.WorldACL(zk.PermAll)
	ops := []any{&zk.CreateRequest{Path: p, Data: data, Acl: acl}}
	for _, c := range []string{"items", "leases", "dead", "consumers", "members"} {
		ops = append(ops, &zk.CreateRequest{Path: p + "/" + c, Acl: acl})
	}
	res, err := b.conn.Multi(ops...)
	if err == nil {
		return m, nil
	}
	if err = firstError(res, err); !errors.Is(err, zk.ErrNodeExists) {
		return m, fmt.Errorf("create queue %s: %w", name, err)
	}
	cur, _, err := b.conn.Get(p)
	if err != nil {
		return m, fmt.Errorf("get %s: %w", p, err)
	}
	old, err := decodeMeta(cur)
	if err != nil {
		return m, fmt.Errorf("%w: %s exists with unreadable metadata", errQueueExists, name)
	}
	if !old.sameConfig(m) {
		return old, fmt.Errorf("%w: %s is a %s queue", errQueueExists, name, old.Kind)
	}
	return old, nil
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

func (b *Broker) deleteQueue(ctx context.Context, name string) error {
	p := b.queuePath(name)
	if ok, _, err := b.conn.Exists(p); err != nil {
		return fmt.Errorf("exists %s: %w", p, err)
	} else if !ok {
		return fmt.Errorf("%w: %s", errQueueNotFound, name)
	}
	b.evict(name)
	return zkutil.DeleteTree(ctx, b.conn, p, nil)
}

// runStats refreshes the queue gauges of the queues this broker has
// served, every StatsInterval. Reads only (Stat of three parents).
func (b *Broker) runStats() {
	defer b.wg.Done()
	t := time.NewTicker(b.cfg.StatsInterval)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		b.queuesMu.Lock()
		qs := make([]*queue, 0, len(b.queues))
		for _, q := range b.queues {
			qs = append(qs, q)
		}
		b.queuesMu.Unlock()
		for _, q := range qs {
			if q.label == OtherQueue || q.stale() {
				continue
			}
			if n, err := q.items.Len(b.ctx); err == nil {
				b.metrics.depth.WithLabelValues(q.label).Set(float64(n))
			}
			if n, err := q.leases.InFlight(b.ctx); err == nil {
				b.metrics.inFlight.WithLabelValues(q.label).Set(float64(n))
			}
			if age, err := q.items.OldestAge(b.ctx); err == nil {
				b.metrics.oldestAge.WithLabelValues(q.label).Set(age.Seconds())
			}
		}
	}
}
