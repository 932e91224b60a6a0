package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Catalog is the set of named queues under one parent node. Layout of
// one queue, <parent>/<name>, whose data is its Spec:
//
//	items/      ready messages (a Queue)
//	leases/     at-least-once deliveries in flight (Leases)
//	dead/       dead letters
//	consumers/  one EPHEMERAL node per consumer, for the share split
//	members/    KindSync: one EPHEMERAL node per member
//	delayed/    messages published with a delay, until due (Scheduled)
//	expired     a counter: its version counts the expired messages (ttl.go)
//	start       KindSync: exists once the group is complete
//	dedup/      the records of dedup ids (WithDedup), created when first used
//	groups/     message groups' order and state (WithGroups), created when first used
//	active/     Spec.SingleActive: the election of the consumer that receives (active.go)
//
// Create makes the node and its parents in one Multi. Nothing else
// creates them: open a queue's Queue and Leases WithoutCreate, so that a
// process opening a queue while it is being deleted cannot bring parts of
// it back.
//
// Delete works in two steps: it marks the Spec Deleting (one versioned
// setData, which fires every metadata watch), then deletes the queue's
// nodes, each delete guarded by the version the mark produced. A deletion
// interrupted after its mark is finished by the next Delete or Create of
// that name, or by FinishDelete (a leader's sweep of abandoned
// deletions).
//
// A Catalog is safe for concurrent use.
type Catalog struct {
	conn   *zk.Conn
	zk     observed
	path   string
	cfg    CatalogConfig
	badMu  sync.Mutex
	bad    map[string]bool // queues whose bad metadata was logged
	listed func(p string)  // set by tests only: see DeleteTreeHooked
}

// CatalogConfig configures a Catalog.
type CatalogConfig struct {
	// MaxQueues bounds the number of queues Create makes (those being
	// deleted count); 0: no bound.
	MaxQueues int
	// Observer sees every request but a deletion's (metrics).
	Observer Observer
	// Logger receives the failures of deletions (default: discarded).
	Logger *slog.Logger
	// ACL of every node the catalog creates (see WithACL); default open.
	ACL []zk.ACL
}

// queueParents are the parents created with every queue, in the order a
// deletion removes them: the ready messages first, so consumers stop
// finding any, then the rest.
var queueParents = []string{"items", "leases", "dead", "consumers", "members", "delayed", "expired"}

// createAttempts bounds the rounds of a Create that keeps meeting a queue
// of the same name deleted or being deleted concurrently; markAttempts,
// those of a Delete whose mark meets concurrent writes of the metadata
// (another Delete's mark).
const (
	createAttempts = 8
	markAttempts   = 4
)

// NewCatalog returns the catalog of the queues under p, creating p and its
// parents when missing.
func NewCatalog(conn *zk.Conn, p string, cfg CatalogConfig) (*Catalog, error) {
	if conn == nil {
		return nil, errors.New("zkqueue: nil zk conn")
	}
	if p == "" || p[0] != '/' || path.Clean(p) != p || p == "/" {
		return nil, fmt.Errorf("zkqueue: bad catalog path %q", p)
	}
	if cfg.MaxQueues < 0 {
		return nil, fmt.Errorf("zkqueue: max queues %d < 0", cfg.MaxQueues)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.ACL = zkutil.ACLOr(cfg.ACL)
	if err := zkutil.EnsurePath(conn, p, cfg.ACL); err != nil {
		return nil, fmt.Errorf("zkqueue: %w", err)
	}
	return &Catalog{conn: conn, zk: observed{conn, cfg.Observer}, path: p, cfg: cfg, bad: map[string]bool{}}, nil
}

// badSpec logs, once per queue (up to 1000), metadata that does not
// decode or validate: the queue is refused (absent) rather than served
// with a configuration no Catalog wrote.
func (c *Catalog) badSpec(name string, err error) {
	c.badMu.Lock()
	first := !c.bad[name] && len(c.bad) < 1000
	if first {
		c.bad[name] = true
	}
	c.badMu.Unlock()
	if first {
		c.cfg.Logger.Warn("refusing a queue whose metadata is not valid; delete the queue or restore its metadata",
			"queue", name, "znode", c.Path(name), "err", err)
	}
}

// Path returns the node of the queue name: the parent of its items/,
// leases/, dead/, consumers/ and members/.
func (c *Catalog) Path(name string) string { return c.path + "/" + name }

// Expiry returns the expiry settings (WithExpiry) of the queue name with
// spec s: its TTL, its expired counter and, when s.ExpireToDeadLetter, its
// dead letters' parent; the zero Expiry (never expire) without a TTL. The
// caller may set Hook.
func (c *Catalog) Expiry(name string, s Spec) Expiry {
	if s.MessageTTL <= 0 {
		return Expiry{}
	}
	p := c.Path(name)
	e := Expiry{TTL: s.MessageTTL, Counter: p + "/expired"}
	if s.ExpireToDeadLetter {
		e.Dead = p + "/dead"
	}
	return e
}

// checkName accepts a queue name that is one path element
// (zkutil.CheckName: [A-Za-z0-9._-]{1,200}, not "." or "..").
func checkName(name string) error {
	if err := zkutil.CheckName(name); err != nil {
		return fmt.Errorf("%w: queue name %v", ErrBadName, err)
	}
	return nil
}

// Create creates the queue name with spec s and returns its spec. An
// existing queue with the same configuration (Created aside) is returned
// as is, after creating any of its parents that are missing (left so by an
// interrupted deletion of an earlier release). A queue of that name being
// deleted is deleted first, then created anew. Errors: ErrQueueExists (the
// existing queue's spec is returned with it), ErrTooManyQueues beyond
// MaxQueues, ErrQueueDeleting when the name keeps being deleted and
// created concurrently, ErrBadName, ErrBadSpec.
func (c *Catalog) Create(ctx context.Context, name string, s Spec) (Spec, error) {
	if err := checkName(name); err != nil {
		return s, err
	}
	s.Visibility = s.Visibility.Truncate(time.Millisecond) // as stored
	s.DedupWindow = s.DedupWindow.Truncate(time.Millisecond)
	s.MessageTTL = s.MessageTTL.Truncate(time.Millisecond)
	if err := s.Validate(); err != nil {
		return s, err
	}
	data, err := s.Encode()
	if err != nil {
		return s, err
	}
	p := c.Path(name)
	acl := c.cfg.ACL
	ops := []any{&zk.CreateRequest{Path: p, Data: data, Acl: acl}}
	for _, sub := range queueParents {
		ops = append(ops, &zk.CreateRequest{Path: p + "/" + sub, Acl: acl})
	}
	if s.SingleActive {
		ops = append(ops, &zk.CreateRequest{Path: p + "/" + activeParent, Acl: acl})
	}
	for attempt := 0; attempt < createAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return s, err
		}
		n, err := c.Count()
		if err != nil {
			return s, err
		}
		room := c.cfg.MaxQueues == 0 || n < c.cfg.MaxQueues
		if room {
			res, err := c.zk.Multi(ops...)
			if err == nil {
				return s, nil
			}
			if err = zkutil.MultiError(res, err); !errors.Is(err, zk.ErrNodeExists) {
				return s, fmt.Errorf("zkqueue: create queue %s: %w", name, err)
			}
		}
		// The queue exists, or there is no room for another.
		old, again, err := c.meetExisting(ctx, name, s)
		switch {
		case errors.Is(err, zk.ErrNoNode) && !room:
			return s, fmt.Errorf("%w: %d queues exist, at most %d", ErrTooManyQueues, n, c.cfg.MaxQueues)
		case errors.Is(err, zk.ErrNoNode), again:
			continue // deleted, marked or repaired meanwhile: look again
		case err != nil:
			return old, err
		}
		return old, nil
	}
	return s, fmt.Errorf("%w: %s is being deleted and created concurrently", ErrQueueDeleting, name)
}

// meetExisting handles a Create of name that found a node there: it
// finishes the deletion of a queue marked for deletion (again: look
// again), and repairs a queue with the same configuration (returned as
// old). zk.ErrNoNode: there is no node (any more).
func (c *Catalog) meetExisting(ctx context.Context, name string, s Spec) (old Spec, again bool, err error) {
	p := c.Path(name)
	cur, stat, err := c.zk.Get(p)
	if errors.Is(err, zk.ErrNoNode) {
		return s, false, err
	}
	if err != nil {
		return s, false, fmt.Errorf("get %s: %w", p, err)
	}
	old, err = DecodeSpec(cur)
	if err != nil {
		return s, false, fmt.Errorf("%w: %s exists with unreadable metadata", ErrQueueExists, name)
	}
	if old.Deleting {
		if err := c.remove(ctx, name, stat.Version); err != nil {
			return s, false, c.deletingErr(name, err)
		}
		return s, true, nil
	}
	if !old.sameConfig(s) {
		return old, false, fmt.Errorf("%w: %s is a %s queue", ErrQueueExists, name, old.Kind)
	}
	err = c.repair(p, stat.Version)
	switch {
	case errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNodeExists):
		return s, true, nil // marked for deletion, or repaired, meanwhile
	case err != nil:
		return s, false, err
	}
	return old, false, nil
}

// Repair creates those of parents (names of the queue's parents, such as
// "delayed") that are missing under the queue name, a queue created
// before they existed, unless it is being deleted. Errors:
// ErrQueueNotFound.
func (c *Catalog) Repair(ctx context.Context, name string, parents ...string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p := c.Path(name)
	data, stat, err := c.zk.Get(p)
	if errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("%w: %s", ErrQueueNotFound, name)
	}
	if err != nil {
		return fmt.Errorf("get %s: %w", p, err)
	}
	if s, err := DecodeSpec(data); err != nil || s.Deleting {
		return fmt.Errorf("%w: %s", ErrQueueNotFound, name)
	}
	err = c.repair(p, stat.Version, parents...)
	if errors.Is(err, zk.ErrBadVersion) {
		return fmt.Errorf("%w: %s (being deleted)", ErrQueueNotFound, name)
	}
	if errors.Is(err, zk.ErrNodeExists) {
		return nil // repaired meanwhile
	}
	return err
}

// repair creates the parents missing under an existing queue's node p,
// checking in the same Multi that p is still at version: a queue marked
// for deletion meanwhile is left alone (zk.ErrBadVersion).
// With only, it creates only those of them.
func (c *Catalog) repair(p string, version int32, only ...string) error {
	children, _, err := c.zk.Children(p)
	if err != nil {
		return fmt.Errorf("children %s: %w", p, err)
	}
	ops := []any{&zk.CheckVersionRequest{Path: p, Version: version}}
	for _, sub := range queueParents {
		if !slices.Contains(children, sub) && (len(only) == 0 || slices.Contains(only, sub)) {
			ops = append(ops, &zk.CreateRequest{Path: p + "/" + sub, Acl: c.cfg.ACL})
		}
	}
	if len(ops) == 1 {
		return nil
	}
	res, err := c.zk.Multi(ops...)
	if err != nil {
		return fmt.Errorf("repair %s: %w", p, zkutil.MultiError(res, err))
	}
	return nil
}

// Count returns the number of queue nodes (those being deleted included),
// from the parent's Stat.
func (c *Catalog) Count() (int, error) { return zkutil.NumChildren(c.conn, c.path) }

// List returns the names of the queues with prefix, sorted; those being
// deleted included (Info tells them apart).
func (c *Catalog) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	children, _, err := c.zk.Children(c.path)
	if err != nil {
		return nil, fmt.Errorf("children %s: %w", c.path, err)
	}
	var out []string
	for _, n := range children {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Info returns the spec of the queue name; ErrQueueNotFound when it does
// not exist, is being deleted or has unreadable metadata.
func (c *Catalog) Info(name string) (Spec, error) {
	if err := checkName(name); err != nil {
		return Spec{}, err
	}
	data, _, err := c.zk.Get(c.Path(name))
	if errors.Is(err, zk.ErrNoNode) && c.synced() {
		data, _, err = c.zk.Get(c.Path(name))
	}
	if errors.Is(err, zk.ErrNoNode) {
		return Spec{}, fmt.Errorf("%w: %s", ErrQueueNotFound, name)
	}
	if err != nil {
		return Spec{}, fmt.Errorf("get %s: %w", c.Path(name), err)
	}
	s, err := DecodeSpec(data)
	if err != nil {
		c.badSpec(name, err)
	}
	if err != nil || s.Deleting {
		return Spec{}, fmt.Errorf("%w: %s", ErrQueueNotFound, name)
	}
	return s, nil
}

// synced brings the ZooKeeper server of c's session up to date with the
// leader (sync), and reports whether it did. A queue another process just
// created may not have reached that server yet: ZooKeeper's reads are
// only as fresh as the server's, so a queue found missing is looked for
// again once synced before it is reported missing (a client that created
// a queue through one broker and publishes through another must find it).
func (c *Catalog) synced() bool {
	_, err := c.zk.Sync(c.path)
	return err == nil
}

// Load is Info with a watch of the queue's metadata, which fires when the
// queue is marked for deletion, deleted or changed: a process caching
// what it opened of the queue drops it then.
func (c *Catalog) Load(name string) (Spec, <-chan zk.Event, error) {
	s, _, watch, err := c.load(name)
	return s, watch, err
}

// load is Load, also returning the metadata node's Stat.
func (c *Catalog) load(name string) (Spec, *zk.Stat, <-chan zk.Event, error) {
	if err := checkName(name); err != nil {
		return Spec{}, nil, nil, err
	}
	p := c.Path(name)
	data, stat, watch, err := c.zk.GetW(p)
	if errors.Is(err, zk.ErrNoNode) && c.synced() {
		data, stat, watch, err = c.zk.GetW(p)
	}
	if errors.Is(err, zk.ErrNoNode) {
		return Spec{}, nil, nil, fmt.Errorf("%w: %s", ErrQueueNotFound, name)
	}
	if err != nil {
		return Spec{}, nil, nil, fmt.Errorf("get %s: %w", p, err)
	}
	s, err := DecodeSpec(data)
	if err != nil {
		// Unreadable metadata: treat as absent.
		c.badSpec(name, err)
		return Spec{}, nil, nil, fmt.Errorf("%w: %s (%v)", ErrQueueNotFound, name, err)
	}
	if s.Deleting {
		return Spec{}, nil, nil, fmt.Errorf("%w: %s (being deleted)", ErrQueueNotFound, name)
	}
	return s, stat, watch, nil
}

// State is a queue's metadata node as stored, for a process that also
// sees the queues being deleted (a sweep of abandoned deletions).
type State struct {
	Spec     Spec
	Err      error     // the metadata did not decode: Spec is not to be used
	Version  int32     // of the metadata: for a marked queue, the mark's
	Modified time.Time // of the metadata: for a marked queue, when it was marked
}

// Names returns the names of all queues (those being deleted included),
// unsorted, with a watch that fires when one is created or deleted.
func (c *Catalog) Names() ([]string, <-chan zk.Event, error) {
	names, _, w, err := c.zk.ChildrenW(c.path)
	if err != nil {
		return nil, nil, fmt.Errorf("children %s: %w", c.path, err)
	}
	return names, w, nil
}

// Lookup returns the state of the queue name, marked or not, with a watch
// of its metadata; ErrQueueNotFound when there is no node.
func (c *Catalog) Lookup(name string) (State, <-chan zk.Event, error) {
	if err := checkName(name); err != nil {
		return State{}, nil, err
	}
	data, stat, w, err := c.zk.GetW(c.Path(name))
	if errors.Is(err, zk.ErrNoNode) {
		return State{}, nil, fmt.Errorf("%w: %s", ErrQueueNotFound, name)
	}
	if err != nil {
		return State{}, nil, fmt.Errorf("get %s: %w", c.Path(name), err)
	}
	s, err := DecodeSpec(data)
	return State{Spec: s, Err: err, Version: stat.Version, Modified: time.UnixMilli(stat.Mtime)}, w, nil
}

// Delete deletes the queue name in two steps (see Catalog): from its mark
// on, the queue is absent to every call but Delete and Create. A Delete
// that meets a queue already marked (a concurrent Delete, or one
// interrupted by a crash) does the same deletion and returns nil once the
// queue is gone; of two concurrent calls, one may return ErrQueueNotFound
// when the other removed the queue before it looked. Nodes created under
// the queue during the deletion (messages published, consumers
// registered) are deleted too. Errors: ErrQueueNotFound; ErrQueueDeleting
// when the deletion could not be finished (the queue stays marked, and
// the next Delete or Create of the name finishes it); the context's error
// and ZooKeeper's unavailability as such.
func (c *Catalog) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	p := c.Path(name)
	for attempt := 0; attempt < markAttempts; attempt++ {
		data, stat, err := c.zk.Get(p)
		if errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("%w: %s", ErrQueueNotFound, name)
		}
		if err != nil {
			return fmt.Errorf("get %s: %w", p, err)
		}
		version := stat.Version
		s, err := DecodeSpec(data)
		if err != nil {
			s = Spec{} // unreadable: the mark is all it keeps
		}
		if !s.Deleting {
			s.Deleting = true
			mark, err := s.Encode()
			if err != nil {
				return err
			}
			st, err := c.zk.Set(p, mark, version)
			switch {
			case errors.Is(err, zk.ErrBadVersion):
				continue // marked by another call meanwhile: look again
			case errors.Is(err, zk.ErrNoNode):
				return fmt.Errorf("%w: %s", ErrQueueNotFound, name)
			case err != nil:
				return fmt.Errorf("mark %s: %w", p, err)
			}
			version = st.Version
		}
		if err := c.remove(ctx, name, version); err != nil {
			return c.deletingErr(name, err)
		}
		return nil
	}
	return fmt.Errorf("%w: %s: its metadata keeps changing; retry", ErrQueueDeleting, name)
}

// deletingErr is the error of a call that could not finish deleting a
// queue marked for deletion: the caller's context and ZooKeeper's
// unavailability as such, anything else as ErrQueueDeleting (the details
// are logged).
func (c *Catalog) deletingErr(name string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || zkutil.IsUnavailable(err) {
		return err
	}
	c.cfg.Logger.Warn("deleting a queue failed", "queue", name, "err", err)
	return fmt.Errorf("%w: %s; retry", ErrQueueDeleting, name)
}

// FinishDelete finishes the deletion of the queue name marked for
// deletion at version (State.Version of a State whose Spec is Deleting),
// as the Delete that marked it would; it returns nil once that
// incarnation of the queue is gone, and does nothing to a queue not
// marked at version (one created anew under the name).
func (c *Catalog) FinishDelete(ctx context.Context, name string, version int32) error {
	if err := checkName(name); err != nil {
		return err
	}
	data, stat, err := c.zk.Get(c.Path(name))
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get %s: %w", c.Path(name), err)
	}
	if s, err := DecodeSpec(data); err != nil || !s.Deleting || stat.Version != version {
		return nil // another incarnation
	}
	return c.remove(ctx, name, version)
}

// remove deletes the nodes of a queue marked for deletion at version (the
// version of its marked metadata): parents in queueParents order, then
// whatever else is there (a sync queue's start), then the queue's node at
// that version. Each delete checks the version in the same transaction,
// so nodes created concurrently by publishers, releases or consumers are
// deleted too (a parent that gained a child since its listing is listed
// again), while a queue created anew under the same name after the
// deletion is never touched. It returns nil once that incarnation of the
// queue is gone, whoever removed it.
func (c *Catalog) remove(ctx context.Context, name string, version int32) error {
	p := c.Path(name)
	guard := &zkutil.Guard{Path: p, Version: version}
	for _, t := range append(c.parentPaths(p), p) {
		err := zkutil.DeleteTreeHooked(ctx, c.conn, t, guard, c.listed)
		if errors.Is(err, zkutil.ErrGuardChanged) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *Catalog) parentPaths(p string) []string {
	out := make([]string, 0, len(queueParents)+1)
	for _, sub := range queueParents {
		out = append(out, p+"/"+sub)
	}
	return out
}
