package zkqueue

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-zookeeper/zk"
)

// Handles are what a process opens of one queue of a Catalog (Open): its
// parts, each at the node the Catalog's layout gives it, and the watch of
// its metadata. They serve until Stale (the queue was marked for
// deletion, deleted or changed; not a lost session alone): then open the
// queue again. Handles are safe for concurrent use.
type Handles struct {
	Name string
	// Spec is the queue's configuration as Open read it.
	Spec Spec
	// Items are the ready messages (items/).
	Items *Queue
	// Leases are the deliveries in flight (leases/, dead letters in
	// dead/).
	Leases *Leases
	// Delayed are the messages published with a delay (delayed/).
	Delayed *Scheduled
	// Consumers are the queue's consumer registrations on all processes
	// (consumers/).
	Consumers *ConsumerGroup
	// Path is the queue's node (Catalog.Path), for recipes built on the
	// queue (package syncqueue).
	Path string
	// Active is the node of the election among the queue's consumers
	// when Spec.SingleActive (see active.go), "" otherwise.
	Active string

	catalog *Catalog
	meta    zk.Stat // of the metadata node, as Open read it

	mu    sync.Mutex
	watch <-chan zk.Event // the metadata watch (Catalog.Load)
	stale bool            // the watch fired for a change: open again
}

// OpenConfig configures the Handles Open returns.
type OpenConfig struct {
	// ProcessID names this process among the queue's consumers
	// (NewConsumerGroup); required.
	ProcessID string
	// Registry keeps the consumer registrations of this process through
	// session changes (ConsumerGroupConfig.Registry); share one among
	// the queues of a process.
	Registry *Registry
	// Expired, when set, is told of the messages this process expired
	// (Expiry.Hook).
	Expired func(n int)
	// MaxDelayed bounds the delayed messages (NewScheduled); 0: the
	// default.
	MaxDelayed int
}

// Open opens the queue name: it reads its metadata with a watch (Load)
// and returns its Handles, built on the Catalog's layout. opts configure
// its Queue (limits, hooks, committer, readers, memory, publisher,
// logger, ...); Open adds, after them, what the layout and the metadata
// decide: WithoutCreate (opening never writes, so a process opening a
// queue while it is being deleted cannot bring parts of it back),
// WithDedup, WithExpiry, WithGroups and, for a KindPriority queue,
// WithPriorities. Before them it adds what opts may replace: the
// Catalog's ACL and Observer, and WithOwners of the queue's ConsumerGroup.
// It makes one request. Errors: ErrQueueNotFound, ErrBadName, and those
// of New.
func (c *Catalog) Open(name string, cfg OpenConfig, opts ...Option) (*Handles, error) {
	spec, stat, watch, err := c.load(name)
	if err != nil {
		return nil, err
	}
	p := c.Path(name)
	reg := cfg.Registry
	if reg == nil {
		reg = NewRegistry(c.conn, RegistryConfig{ACL: c.cfg.ACL, Logger: c.cfg.Logger})
	}
	group, err := NewConsumerGroup(c.conn, p+"/consumers", cfg.ProcessID,
		ConsumerGroupConfig{Registry: reg, ACL: c.cfg.ACL, WithoutCreate: true})
	if err != nil {
		return nil, err
	}
	e := c.Expiry(name, spec)
	e.Hook = cfg.Expired
	all := make([]Option, 0, len(opts)+8)
	all = append(all, WithACL(c.cfg.ACL), WithObserver(c.cfg.Observer), WithOwners(group.Share))
	all = append(all, opts...)
	all = append(all, WithoutCreate(), WithDedup(p+"/dedup", spec.Dedup()), WithExpiry(e), WithGroups(p+"/groups"))
	if spec.Kind == KindPriority {
		all = append(all, WithPriorities())
	}
	if spec.Fairness.Key != "" {
		all = append(all, WithFairness(spec.Fairness))
	}
	if spec.Packed {
		all = append(all, WithPacking(PackLimits{}))
	}
	items, err := New(c.conn, p+"/items", all...)
	if err != nil {
		return nil, err
	}
	leases, err := NewLeases(items, p+"/leases", p+"/dead")
	if err != nil {
		return nil, err
	}
	delayed, err := NewScheduled(items, p+"/delayed", cfg.MaxDelayed)
	if err != nil {
		return nil, err
	}
	h := &Handles{Name: name, Spec: spec, Items: items, Leases: leases,
		Delayed: delayed, Consumers: group, Path: p, catalog: c, meta: *stat, watch: watch}
	if spec.SingleActive {
		h.Active = p + "/" + activeParent
	}
	return h, nil
}

// Stale reports whether the queue was marked for deletion, deleted,
// changed or created again since Open: then open it again. A metadata
// watch that fired only because the session was lost
// (zk.EventNotWatching) is armed again when the queue's node is still the
// one Open read (same creation and version), and the Handles serve on: a
// process keeps one set of Handles per queue through session changes,
// and with them one dispatcher and one pack buffer. That takes one read;
// when it fails (ZooKeeper away, the queue gone), the Handles are stale.
func (h *Handles) Stale() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.watch
	select {
	case ev, ok := <-w:
		return h.fired(w, ev, ok)
	default:
		return h.stale
	}
}

// Watch returns the metadata watch the Handles serve under. When it
// fires, Stale says whether the Handles are done or serve on under a new
// watch.
func (h *Handles) Watch() <-chan zk.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.watch
}

// fired decides on watch w, which fired with ev (ok false: w was closed,
// its event taken by an earlier caller): true when the Handles are stale,
// false when they serve on under a watch armed again. h.mu is held.
func (h *Handles) fired(w <-chan zk.Event, ev zk.Event, ok bool) bool {
	switch {
	case h.stale || w != h.watch:
		return h.stale // decided when the event was taken
	case ok && ev.Type == zk.EventNotWatching:
		_, stat, watch, err := h.catalog.load(h.Name)
		if err == nil && stat.Czxid == h.meta.Czxid && stat.Version == h.meta.Version {
			h.watch = watch
			return false
		}
	}
	h.stale = true
	return true
}

// Run runs the queue's jobs of this process until ctx ends or the Handles
// go stale, and returns once they stopped: the mover of due delayed
// messages (Scheduled.Run) and, when the queue has a message TTL, the
// expiry timer of its heads (Queue.RunExpiry). Every process with the
// queue open may run them: several movers of one queue are safe (a move
// is a versioned delete of the delayed node in the same transaction as
// the message's create, and exactly one commits), and running them
// wherever the queue is open keeps delayed delivery going while the
// leader changes. An idle queue costs two sleeping goroutines and one
// watch. Errors of a pass go to onErr (when set); the pass is retried.
func (h *Handles) Run(ctx context.Context, onErr func(error)) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	report := func(what string) func(error) {
		return func(err error) {
			if onErr != nil {
				onErr(fmt.Errorf("zkqueue: %s of %s: %w", what, h.Name, err))
			}
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = h.Delayed.Run(ctx, nil, report("moving due delayed messages"))
	}()
	if h.Spec.MessageTTL > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = h.Items.RunExpiry(ctx, report("expiring messages"))
		}()
	}
	for {
		w := h.Watch()
		select {
		case <-ctx.Done():
		case ev, ok := <-w:
			h.mu.Lock()
			stale := h.fired(w, ev, ok)
			h.mu.Unlock()
			if !stale {
				continue // a lost session; the queue as it was
			}
		}
		break
	}
	cancel()
	wg.Wait()
}
