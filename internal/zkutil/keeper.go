package zkutil

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// Keeping ephemeral nodes.
//
// A process keeps EPHEMERAL nodes that must exist exactly while what they
// stand for lives (a broker while it runs, a consumer while its stream is
// open). A create and a delete are not enough:
//
//   - a create or delete whose answer is lost with the connection (a
//     ZooKeeper failover) may or may not have happened;
//   - a session expiry deletes all of the session's ephemeral nodes while
//     the process and what they stand for go on;
//   - a process restarted under the same name finds the nodes of its
//     previous process's session still there until that session expires.
//
// So a kept node has a name no one else uses, a node is ours only when its
// ephemeralOwner is our current session, and one goroutine (Run)
// reconciles: every wanted node until it exists under the current session,
// every unwanted one until it is gone, retrying with backoff while
// ZooKeeper is away and again after every new session. Nodes the caller
// finds under its names that it does not know of (left by its previous
// process) are deleted through Stray.

// Keeper keeps ephemeral nodes through session changes (see above). It is
// created before its connection, so that the connection's event callback
// can Wake it: Bind the connection before any other call. A Keeper is safe
// for concurrent use.
type Keeper struct {
	conn *zk.Conn
	acl  []zk.ACL
	log  *slog.Logger

	mu    sync.Mutex
	nodes map[string]*Kept
	kick  chan struct{}
}

// Kept is one node a Keeper keeps, or removes.
type Kept struct {
	path string
	data []byte

	wanted atomic.Bool // should exist; once false, never true again

	mu      sync.Mutex // serializes the node's ZooKeeper calls; guards the fields below
	owner   int64      // the session that owns the node we made; 0: none that we know of
	unknown bool       // a create or delete whose outcome is unknown
	gone    bool       // its parent was deleted: it cannot exist
}

// Path returns the node's path.
func (e *Kept) Path() string { return e.path }

// Gone reports whether the node's parent was found missing: the Keeper
// does not create it until Drop.
func (e *Kept) Gone() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gone
}

// needsWork reports whether e differs from what is wanted under session
// sid. e.mu is held.
func (e *Kept) needsWork(sid int64) bool {
	if e.wanted.Load() {
		return !e.gone && e.owner != sid
	}
	return e.owner != 0 || e.unknown
}

// NewKeeper returns a Keeper logging to logger (nil discards).
func NewKeeper(logger *slog.Logger) *Keeper {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Keeper{log: logger, nodes: map[string]*Kept{}, kick: make(chan struct{}, 1)}
}

// Bind sets the connection the nodes live on and their ACL (OpenACL when
// empty). Call it once, before Keep, Drop, Stray and Run.
func (k *Keeper) Bind(conn *zk.Conn, acl []zk.ACL) { k.conn, k.acl = conn, ACLOr(acl) }

// Wake makes Run reconcile now. Call it on every new session (a
// StateHasSession event): a new session has none of the old one's
// ephemeral nodes. It never blocks.
func (k *Keeper) Wake() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Keep makes the node at p exist with data, owned by the current session,
// until Drop. It tries at once; when that fails (ZooKeeper away), Run
// retries. p must be a name no other process uses. Its parent must exist:
// once it is gone (a queue deleted), the Keeper stops trying until Drop.
func (k *Keeper) Keep(p string, data []byte) *Kept {
	e := &Kept{path: p, data: data}
	e.wanted.Store(true)
	k.mu.Lock()
	k.nodes[p] = e
	k.mu.Unlock()
	k.reconcileNow(e)
	return e
}

// Drop makes the node go away: at once if ZooKeeper answers, else as soon
// as it does (or the session owning the node ends).
func (k *Keeper) Drop(e *Kept) {
	e.wanted.Store(false)
	k.reconcileNow(e)
}

// Stray schedules the deletion of the node at p, one of the caller's names
// that the Keeper does not know of (a previous process's). It does nothing
// when p is kept.
func (k *Keeper) Stray(p string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.nodes[p]; ok {
		return
	}
	k.nodes[p] = &Kept{path: p, unknown: true}
	k.Wake()
}

// Tracked reports whether p is a node of the Keeper (kept, or being
// removed), and whether it is wanted.
func (k *Keeper) Tracked(p string) (known, wanted bool) {
	k.mu.Lock()
	e := k.nodes[p]
	k.mu.Unlock()
	if e == nil {
		return false, false
	}
	return true, e.wanted.Load()
}

func (k *Keeper) snapshot() []*Kept {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]*Kept, 0, len(k.nodes))
	for _, e := range k.nodes {
		out = append(out, e)
	}
	return out
}

// forget drops e once nothing is left to do for it.
func (k *Keeper) forget(e *Kept) {
	k.mu.Lock()
	if k.nodes[e.path] == e {
		delete(k.nodes, e.path)
	}
	k.mu.Unlock()
}

func (k *Keeper) hasSession() bool { return k.conn.State() == zk.StateHasSession }

func (k *Keeper) reconcileNow(e *Kept) {
	if !k.hasSession() {
		k.Wake() // the new session's event wakes it again
		return
	}
	if err := k.reconcile(e, k.conn.SessionID()); err != nil {
		k.log.Debug("registration pending", "znode", e.path, "err", err)
		k.Wake()
	}
}

// reconcile does what e needs under session sid: create, replace or
// delete. Settled unwanted nodes leave the Keeper.
func (k *Keeper) reconcile(e *Kept, sid int64) error {
	e.mu.Lock()
	var err error
	if e.needsWork(sid) {
		if e.wanted.Load() {
			err = k.ensure(e)
		} else {
			err = k.remove(e)
		}
	}
	done := !e.wanted.Load() && !e.needsWork(sid)
	e.mu.Unlock()
	if done {
		k.forget(e)
	}
	return err
}

// ErrKeepRace is the error of a node replaced repeatedly while the Keeper
// created it; Run retries.
var ErrKeepRace = errors.New("zk: kept node replaced repeatedly")

// ensure creates e under the current session. A node already there is
// ours only when its ephemeralOwner is our session; one of an earlier
// session (a create whose answer was lost, then an expiry; or the
// previous process's) is deleted and created again. e.mu is held.
func (k *Keeper) ensure(e *Kept) error {
	acl := k.acl
	for range 5 {
		sid := k.conn.SessionID()
		_, err := k.conn.Create(e.path, e.data, zk.FlagEphemeral, acl)
		switch {
		case err == nil && k.conn.SessionID() == sid:
			e.owner, e.unknown = sid, false
			return nil
		case errors.Is(err, zk.ErrNoNode):
			e.gone, e.unknown = true, false
			return nil
		case err != nil && !errors.Is(err, zk.ErrNodeExists):
			e.unknown = true
			return fmt.Errorf("create %s: %w", e.path, err)
		}
		// The node exists, or was created while the session changed:
		// whose is it?
		ok, st, err := k.conn.Exists(e.path)
		if err != nil {
			e.unknown = true
			return fmt.Errorf("exists %s: %w", e.path, err)
		}
		if !ok {
			continue // its session just ended
		}
		if st.EphemeralOwner == k.conn.SessionID() {
			e.owner, e.unknown = st.EphemeralOwner, false
			return nil
		}
		k.log.Info("replacing a registration of an earlier session", "znode", e.path,
			"owner", fmt.Sprintf("0x%x", st.EphemeralOwner))
		err = k.conn.Delete(e.path, st.Version)
		if err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, zk.ErrBadVersion) {
			e.unknown = true
			return fmt.Errorf("delete %s: %w", e.path, err)
		}
	}
	return fmt.Errorf("%w: %s", ErrKeepRace, e.path)
}

// remove deletes e's node. Deleting a node that is not there is done: the
// name is ours alone. e.mu is held.
func (k *Keeper) remove(e *Kept) error {
	err := k.conn.Delete(e.path, -1)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		e.unknown = true
		return fmt.Errorf("delete %s: %w", e.path, err)
	}
	e.owner, e.unknown = 0, false
	return nil
}

// Retry backoff of Run.
const (
	keepRetryMin = 100 * time.Millisecond
	keepRetryMax = 5 * time.Second
)

// Run reconciles the nodes when woken (a Keep or Drop failed, a new
// session began) and retries with backoff until all is settled. It returns
// when ctx ends; its caller owns the goroutine.
func (k *Keeper) Run(ctx context.Context) {
	backoff := keepRetryMin
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.kick:
		case <-retry:
		}
		retry = nil
		if !k.hasSession() {
			continue // the next session's event wakes us
		}
		if k.reconcileAll(ctx) {
			backoff = keepRetryMin
			continue
		}
		retry = time.After(backoff)
		backoff = min(2*backoff, keepRetryMax)
	}
}

// reconcileAll reconciles every node; it reports whether all settled.
func (k *Keeper) reconcileAll(ctx context.Context) bool {
	settled := true
	for _, e := range k.snapshot() {
		if ctx.Err() != nil || !k.hasSession() {
			return false
		}
		if err := k.reconcile(e, k.conn.SessionID()); err != nil {
			k.log.Debug("registration pending", "znode", e.path, "err", err)
			settled = false
		}
	}
	return settled
}
