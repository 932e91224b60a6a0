package broker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Registrations.
//
// The broker keeps EPHEMERAL nodes that must exist exactly while what they
// stand for lives: brokers/<id> while the broker runs, and
// queues/<q>/consumers/<id>~<nonce> while one of its Consume streams is
// open. A create and a delete are not enough:
//
//   - a create or delete whose answer is lost with the connection (a
//     ZooKeeper failover) may or may not have happened;
//   - a session expiry deletes all of the session's ephemeral nodes while
//     the broker and its streams go on;
//   - a broker restarted with the same id finds the nodes of its previous
//     process's session still there until that session expires.
//
// So a consumer node has a name no one else uses (the nonce), a node is
// ours only when its ephemeralOwner is our current session, and one
// goroutine (runRegistry) reconciles: every wanted node until it exists
// under the current session, every unwanted one until it is gone, retrying
// with backoff while ZooKeeper is away and again after every new session.
// Nodes named with this broker's id that it does not know of (left by its
// previous process) are deleted when a listing finds them, and never
// counted.

// ephemeral is one node the registry keeps, or removes.
type ephemeral struct {
	path    string
	data    []byte
	parents bool // create missing parents (the broker node); else a missing parent means the node cannot exist

	wanted atomic.Bool // should exist; once false, never true again

	mu      sync.Mutex // serializes the node's ZooKeeper calls; guards the fields below
	owner   int64      // the session that owns the node we made; 0: none that we know of
	unknown bool       // a create or delete whose outcome is unknown
	gone    bool       // its parent (the queue) was deleted: it cannot exist
}

// needsWork reports whether e differs from what is wanted under session
// sid. e.mu is held.
func (e *ephemeral) needsWork(sid int64) bool {
	if e.wanted.Load() {
		return !e.gone && e.owner != sid
	}
	return e.owner != 0 || e.unknown
}

// registry is the set of nodes being kept or removed.
type registry struct {
	mu    sync.Mutex
	nodes map[string]*ephemeral
	kick  chan struct{}
}

func newRegistry() *registry {
	return &registry{nodes: map[string]*ephemeral{}, kick: make(chan struct{}, 1)}
}

// wake makes runRegistry reconcile now.
func (r *registry) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *registry) add(e *ephemeral) {
	r.mu.Lock()
	r.nodes[e.path] = e
	r.mu.Unlock()
}

// stray schedules the deletion of a node this broker does not know of.
func (r *registry) stray(p string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.nodes[p]; ok {
		return
	}
	e := &ephemeral{path: p, unknown: true}
	r.nodes[p] = e
	r.wake()
}

// tracked reports whether p is a node of the registry, and wanted.
func (r *registry) tracked(p string) (known, wanted bool) {
	r.mu.Lock()
	e := r.nodes[p]
	r.mu.Unlock()
	if e == nil {
		return false, false
	}
	return true, e.wanted.Load()
}

func (r *registry) snapshot() []*ephemeral {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*ephemeral, 0, len(r.nodes))
	for _, e := range r.nodes {
		out = append(out, e)
	}
	return out
}

// forget drops e once nothing is left to do for it.
func (r *registry) forget(e *ephemeral) {
	r.mu.Lock()
	if r.nodes[e.path] == e {
		delete(r.nodes, e.path)
	}
	r.mu.Unlock()
}

// keep makes the node at p exist, owned by the broker's current session,
// until drop. It tries at once; when that fails (ZooKeeper away), the
// registry goroutine retries.
func (b *Broker) keep(p string, data []byte) *ephemeral {
	e := &ephemeral{path: p, data: data}
	e.wanted.Store(true)
	b.reg.add(e)
	b.reconcileNow(e)
	return e
}

// drop makes the node go away: at once if ZooKeeper answers, else as soon
// as it does (or the session owning the node ends).
func (b *Broker) drop(e *ephemeral) {
	e.wanted.Store(false)
	b.reconcileNow(e)
}

func (b *Broker) reconcileNow(e *ephemeral) {
	if !b.hasSession.Load() {
		b.reg.wake() // the new session's event wakes it again
		return
	}
	if err := b.reconcile(e, b.conn.SessionID()); err != nil {
		b.log.Debug("registration pending", "znode", e.path, "err", err)
		b.reg.wake()
	}
}

// reconcile does what e needs under session sid: create, replace or
// delete. Settled unwanted nodes leave the registry.
func (b *Broker) reconcile(e *ephemeral, sid int64) error {
	e.mu.Lock()
	var err error
	if e.needsWork(sid) {
		if e.wanted.Load() {
			err = b.ensure(e)
		} else {
			err = b.remove(e)
		}
	}
	done := !e.wanted.Load() && !e.needsWork(sid)
	e.mu.Unlock()
	if done {
		b.reg.forget(e)
	}
	return err
}

var errRegistrationRace = errors.New("registration replaced repeatedly")

// ensure creates e under the current session. A node already there is
// ours only when its ephemeralOwner is our session; one of an earlier
// session (a create whose answer was lost, then an expiry; or this
// broker's previous process) is deleted and created again. e.mu is held.
func (b *Broker) ensure(e *ephemeral) error {
	acl := zk.WorldACL(zk.PermAll)
	for range 5 {
		sid := b.conn.SessionID()
		_, err := b.conn.Create(e.path, e.data, zk.FlagEphemeral, acl)
		switch {
		case err == nil && b.conn.SessionID() == sid:
			e.owner, e.unknown = sid, false
			return nil
		case errors.Is(err, zk.ErrNoNode) && e.parents:
			if err := zkutil.EnsurePath(b.conn, path.Dir(e.path)); err != nil {
				return err
			}
			continue
		case errors.Is(err, zk.ErrNoNode):
			e.gone, e.unknown = true, false
			return nil
		case err != nil && !errors.Is(err, zk.ErrNodeExists):
			e.unknown = true
			return fmt.Errorf("create %s: %w", e.path, err)
		}
		// The node exists, or was created while the session changed:
		// whose is it?
		ok, st, err := b.conn.Exists(e.path)
		if err != nil {
			e.unknown = true
			return fmt.Errorf("exists %s: %w", e.path, err)
		}
		if !ok {
			continue // its session just ended
		}
		if st.EphemeralOwner == b.conn.SessionID() {
			e.owner, e.unknown = st.EphemeralOwner, false
			return nil
		}
		b.log.Info("replacing a registration of an earlier session", "znode", e.path,
			"owner", fmt.Sprintf("0x%x", st.EphemeralOwner))
		err = b.conn.Delete(e.path, st.Version)
		if err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, zk.ErrBadVersion) {
			e.unknown = true
			return fmt.Errorf("delete %s: %w", e.path, err)
		}
	}
	return fmt.Errorf("%w: %s", errRegistrationRace, e.path)
}

// remove deletes e's node. Deleting a node that is not there is done: the
// name is ours alone. e.mu is held.
func (b *Broker) remove(e *ephemeral) error {
	err := b.conn.Delete(e.path, -1)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		e.unknown = true
		return fmt.Errorf("delete %s: %w", e.path, err)
	}
	e.owner, e.unknown = 0, false
	return nil
}

// Registry retry backoff.
const (
	registryRetryMin = 100 * time.Millisecond
	registryRetryMax = 5 * time.Second
)

// runRegistry reconciles the registry when woken (a registration failed,
// a new session began) and retries with backoff until all is settled.
func (b *Broker) runRegistry() {
	defer b.wg.Done()
	backoff := registryRetryMin
	var retry <-chan time.Time
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-b.reg.kick:
		case <-retry:
		}
		retry = nil
		if !b.hasSession.Load() {
			continue // the next session's event wakes us
		}
		if b.reconcileAll() {
			backoff = registryRetryMin
			continue
		}
		retry = time.After(backoff)
		backoff = min(2*backoff, registryRetryMax)
	}
}

// reconcileAll reconciles every node; it reports whether all settled.
func (b *Broker) reconcileAll() bool {
	settled := true
	for _, e := range b.reg.snapshot() {
		if b.ctx.Err() != nil || !b.hasSession.Load() {
			return false
		}
		if err := b.reconcile(e, b.conn.SessionID()); err != nil {
			b.log.Debug("registration pending", "znode", e.path, "err", err)
			settled = false
		}
	}
	return settled
}

// registerConsumer records an open stream as an ephemeral node, so Stats
// counts consumers on all brokers and brokers split the queue. It returns
// the unregister func.
func (b *Broker) registerConsumer(q *queue) func() {
	g := b.metrics.consumers.WithLabelValues(q.label)
	g.Inc()
	e := b.keep(q.path+"/consumers/"+b.cfg.ID+"~"+nonce(), nil)
	return func() {
		g.Dec()
		b.drop(e)
	}
}

func nonce() string {
	var n [8]byte
	_, _ = rand.Read(n[:])
	return hex.EncodeToString(n[:])
}

// consumerBroker returns the broker id of a consumer registration:
// "<id>~<nonce>", or "<id>-<10-digit sequence>" as brokers before
// registrations had nonces named them.
func consumerBroker(name string) (string, bool) {
	if i := strings.LastIndexByte(name, '~'); i > 0 {
		return name[:i], true
	}
	if len(name) > 11 && name[len(name)-11] == '-' {
		return name[:len(name)-11], true
	}
	return "", false
}

// liveConsumers returns the broker id of each live consumer registration
// of q. This broker's own registrations count only while their streams
// are open; its unknown ones (left by its previous process, whose session
// has not expired yet) are deleted.
func (b *Broker) liveConsumers(q *queue) ([]string, error) {
	dir := q.path + "/consumers"
	children, _, err := b.conn.Children(dir)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(children))
	for _, c := range children {
		id, ok := consumerBroker(c)
		if !ok {
			continue
		}
		if id == b.cfg.ID {
			p := dir + "/" + c
			known, wanted := b.reg.tracked(p)
			if !known {
				b.reg.stray(p)
			}
			if !wanted {
				continue
			}
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// shareTTL is how long a read of the consumer registrations serves the
// queue's scans: a broker joining or leaving shifts the shares within it.
const shareTTL = time.Second

// share returns the Store's Share func for q: this broker's rank among the
// brokers with Consume streams on q, from the consumer registrations, read
// at most every shareTTL. A broker without a registered stream (Receive
// only) takes the whole queue.
func (q *queue) share(b *Broker) func() (rank, n int) {
	return func() (int, int) {
		q.shareMu.Lock()
		defer q.shareMu.Unlock()
		if time.Since(q.shareRead) >= shareTTL {
			q.shareRank, q.shareN = b.readShare(q)
			q.shareRead = time.Now()
		}
		return q.shareRank, q.shareN
	}
}

func (b *Broker) readShare(q *queue) (rank, n int) {
	ids, err := b.liveConsumers(q)
	if err != nil {
		return 0, 1
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	rank = slices.Index(ids, b.cfg.ID)
	if rank < 0 {
		return 0, 1
	}
	return rank, len(ids)
}

// countConsumers counts q's live Consume streams on all brokers.
func (b *Broker) countConsumers(q *queue) (int, error) {
	ids, err := b.liveConsumers(q)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	return len(ids), err
}
