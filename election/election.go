package election

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lockdelay"
)

// Sentinel errors, wrapped with the operation and node; use errors.Is.
var (
	// ErrNotLeader: Proclaim by an Election that does not lead (any more).
	ErrNotLeader = errors.New("election: not leader")
	// ErrNoLeader: Leader found no candidate.
	ErrNoLeader = errors.New("election: no leader")
	// ErrCampaigning: Campaign while a campaign of the same session in the
	// same election is under way or leads (through this Election or
	// another one on the same connection): one session has one candidate
	// per election, see the package doc.
	ErrCampaigning = errors.New("election: this session campaigns in this election already")
	// ErrNodeLost: the candidate node vanished while campaigning (deleted
	// by another client, or gone with an expired session).
	ErrNodeLost = errors.New("election: candidate node lost")
	// ErrClosed: the Election was closed.
	ErrClosed = errors.New("election: closed")
	// ErrInvalid: a bad argument to New.
	ErrInvalid = errors.New("election: invalid argument")
	// ErrNotOwner: ProclaimKey or ResignKey with IfOwner named a
	// candidate of another owner; nothing was changed.
	ErrNotOwner = errors.New("election: candidate of another owner")
)

// LeaderInfo describes a leader: its candidate node and value.
type LeaderInfo struct {
	// Key is the leader's candidate node, <path>/n-<sequence>.
	Key string
	// Value is the value given to Campaign, or the last one Proclaim set.
	Value []byte
	// Owner is the candidate's WithOwner, "" without one.
	Owner string
	// Token is the fencing token: the zxid that created the node (Czxid).
	// It is greater for every later leadership of the election.
	Token int64
	// Version is the node's data version: 0 as campaigned, one more per
	// Proclaim.
	Version int32
}

// Election is one participant in the election under a ZooKeeper node. It
// campaigns as at most one candidate at a time and can campaign again
// after its leadership ended. All methods are safe for concurrent use.
type Election struct {
	conn      *zk.Conn
	path      string
	acl       []zk.ACL
	log       *slog.Logger
	owner     string // WithOwner
	mayCreate bool   // the election's node may be created (again) when missing
	delay     time.Duration

	closed chan struct{}  // closed by Close: ends campaigns, watchers, observers
	wg     sync.WaitGroup // leadership watchers and observers

	proclaimMu sync.Mutex // one Proclaim at a time: each writes at the version the last produced

	mu       sync.Mutex
	isClosed bool
	busy     bool     // a Campaign is under way or its leadership holds
	key      string   // the candidate node while campaigning or leading
	stale    []string // our nodes whose delete failed: Resign and Close retry them
	unsure   bool     // a create failed with the connection: a node of ours may exist unnamed
	term     *term    // the current leadership; nil when not leading
}

// term is one leadership: from the Campaign that won to its loss or
// resignation.
type term struct {
	key     string
	token   int64
	version int32         // data version, guarded by Election.mu
	done    chan struct{} // closed when the leadership ends
}

// closedChan is what Done returns while not leading.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// sessionKey names one session's place in one election: the package lets
// one Election at a time campaign there, since each Campaign takes this
// session's other candidate nodes for orphans and deletes them.
type sessionKey struct {
	conn *zk.Conn
	path string
}

var campaigning sync.Map // sessionKey -> *Election

// New returns an Election under p, the election's node, creating it and
// its missing parents unless WithCreateParents(false) says not to. It
// starts nothing: Campaign takes part, Leader and Observe only look.
func New(conn *zk.Conn, p string, opts ...Option) (*Election, error) {
	o := defaults()
	for _, opt := range opts {
		opt(&o)
	}
	if conn == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalid)
	}
	if p == "" || p[0] != '/' || p == "/" || path.Clean(p) != p {
		return nil, fmt.Errorf("%w: path %q: want an absolute, clean ZooKeeper path other than /", ErrInvalid, p)
	}
	if lockdelay.Validate(o.delay) != nil {
		return nil, fmt.Errorf("%w: delay %v: want 0 (none) to %v", ErrInvalid, o.delay, lockdelay.Max)
	}
	if o.createParents {
		if err := zkutil.EnsurePath(conn, p, o.acl); err != nil {
			return nil, errfmt.Errorf("election: %w", err)
		}
	}
	return &Election{conn: conn, path: p, acl: zkutil.ACLOr(o.acl), log: o.logger.With("election", p), owner: o.owner,
		mayCreate: o.createParents, delay: o.delay, closed: make(chan struct{})}, nil
}

// Path returns the election's node.
func (e *Election) Path() string { return e.path }

// Key returns our candidate node while a Campaign is under way or leads,
// "" otherwise.
func (e *Election) Key() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.key
}

// Token returns the fencing token of our leadership (see LeaderInfo.Token),
// 0 when not leading.
func (e *Election) Token() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term == nil {
		return 0
	}
	return e.term.token
}

// Done returns a channel closed when the leadership that the last
// successful Campaign won ends: our node deleted (by Resign or anyone
// else), the session expired (as soon as the client learns it: when it
// reconnects), the connection or the Election closed. While not leading
// it returns a closed channel.
func (e *Election) Done() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term == nil {
		return closedChan
	}
	return e.term.done
}

// Resign ends our leadership: it deletes our candidate node (with
// WithDelay, in one multi with its marker: no delay), so the next
// candidate leads at once, and closes Done. It also deletes the nodes an
// earlier failed delete left behind. It is idempotent and safe to retry: without a
// leadership it returns nil; when the delete fails (the connection is
// lost) it returns the error and the leadership stands (Done stays open).
// A Campaign still under way is ended by its ctx, not by Resign.
func (e *Election) Resign(ctx context.Context) error { return e.resign(ctx, false) }

// Abandon ends our leadership as a loss would: it deletes our candidate
// node but leaves its lock-delay marker (WithDelay), so no other
// candidate leads until the delay has passed. For a service that
// campaigns for its clients and sees one vanish without resigning: the
// client may only be cut off, still believing it leads. Without a delay,
// or while not leading, it is Resign. Errors as Resign's.
func (e *Election) Abandon(ctx context.Context) error { return e.resign(ctx, true) }

func (e *Election) resign(ctx context.Context, keep bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.mu.Lock()
	t := e.term
	nodes := append([]string(nil), e.stale...)
	e.mu.Unlock()
	if t != nil {
		nodes = append(nodes, t.key)
	}
	for _, n := range nodes {
		remove := e.remove
		if keep && t != nil && n == t.key {
			remove = func(n string) error { return e.conn.Delete(n, -1) }
		}
		if err := remove(n); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return errfmt.Errorf("election: resign: delete %s: %w", n, err)
		}
		e.mu.Lock()
		e.stale = slices.DeleteFunc(e.stale, func(s string) bool { return s == n })
		e.mu.Unlock()
	}
	if t != nil {
		why := "resigned"
		if keep {
			why = "abandoned"
		}
		e.endTerm(t, why)
	}
	return nil
}

// Proclaim sets the leader's value without a new election: a versioned
// write of our own node. It returns ErrNotLeader when this Election does
// not lead (any more).
func (e *Election) Proclaim(ctx context.Context, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	e.proclaimMu.Lock()
	defer e.proclaimMu.Unlock()
	e.mu.Lock()
	t := e.term
	var version int32
	if t != nil {
		version = t.version
	}
	e.mu.Unlock()
	if t == nil {
		return ErrNotLeader
	}
	st, err := e.conn.Set(t.key, zkutil.EncodeOwned(e.owner, value), version)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return errfmt.Errorf("election: proclaim %s: %w", t.key, ErrNotLeader)
	case err != nil:
		// ErrBadVersion: another client wrote our node.
		return errfmt.Errorf("election: proclaim %s: %w", t.key, err)
	}
	e.mu.Lock()
	t.version = st.Version
	e.mu.Unlock()
	return nil
}

// Close resigns (see Resign), ends a Campaign under way (it returns
// ErrClosed) and the Observe streams, and waits for the Election's
// goroutines. After a Campaign whose create failed with the connection it
// also deletes this session's candidate nodes (the create may have
// succeeded unseen). It returns the first error of those deletes: the
// nodes then stay until the session ends. Close is idempotent.
func (e *Election) Close() error {
	e.mu.Lock()
	if e.isClosed {
		e.mu.Unlock()
		return nil
	}
	e.isClosed = true
	close(e.closed)
	e.mu.Unlock()
	err := e.Resign(context.Background())
	if err == nil {
		err = e.sweepUnsure()
	}
	e.wg.Wait()
	e.mu.Lock()
	t := e.term
	e.mu.Unlock()
	if t != nil {
		e.endTerm(t, "closed")
	}
	return err
}

// sweepUnsure deletes this session's candidate nodes after a create whose
// answer was lost, unless another Election of the session campaigns here
// now (its Campaign deletes them).
func (e *Election) sweepUnsure() error {
	e.mu.Lock()
	unsure := e.unsure
	e.mu.Unlock()
	if !unsure {
		return nil
	}
	k := sessionKey{e.conn, e.path}
	if other, loaded := campaigning.LoadOrStore(k, e); loaded && other != e {
		return nil
	}
	defer campaigning.CompareAndDelete(k, e)
	children, _, err := e.conn.Children(e.path)
	if err != nil {
		return errfmt.Errorf("election: close: children %s: %w", e.path, err)
	}
	if _, err := e.dropOrphans(children, ""); err != nil {
		return err
	}
	e.mu.Lock()
	e.unsure = false
	e.mu.Unlock()
	return nil
}

// begin marks a Campaign under way, refusing a second one of this
// session in this election.
func (e *Election) begin() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.isClosed:
		return ErrClosed
	case e.busy:
		return ErrCampaigning
	}
	if other, loaded := campaigning.LoadOrStore(sessionKey{e.conn, e.path}, e); loaded && other != e {
		return ErrCampaigning
	}
	e.busy = true
	return nil
}

// idle ends a campaign or a leadership: another may begin.
func (e *Election) idle() {
	e.busy = false
	e.key = ""
	campaigning.CompareAndDelete(sessionKey{e.conn, e.path}, e)
}

// lead makes the node key, now the lowest, our leadership: it reads the
// node's creation zxid (the fencing token) with a watch that the term's
// watcher then follows.
func (e *Election) lead(key string) error {
	ok, st, w, err := e.conn.ExistsW(key)
	if err != nil {
		return errfmt.Errorf("election: campaign: exists %s: %w", key, err)
	}
	if !ok || st.EphemeralOwner != e.conn.SessionID() {
		return errfmt.Errorf("election: campaign: %s: %w", key, ErrNodeLost)
	}
	// The marker of our lock-delay, before we lead.
	err = lockdelay.Mark(e.conn, e.path, path.Base(key), e.delay, e.acl)
	if errors.Is(err, lockdelay.ErrHolderGone) {
		return errfmt.Errorf("election: campaign: %s: %w", key, ErrNodeLost)
	}
	if err != nil {
		return errfmt.Errorf("election: campaign: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.isClosed {
		return ErrClosed
	}
	t := &term{key: key, token: st.Czxid, version: st.Version, done: make(chan struct{})}
	e.term = t
	e.wg.Add(1)
	go e.watchTerm(t, w)
	e.log.Debug("leadership acquired", "znode", key, "token", t.token)
	return nil
}

// remove deletes our candidate node n, with its lock-delay marker when
// we campaign with a delay (a marker exists only while n leads).
func (e *Election) remove(n string) error {
	if e.delay > 0 {
		return lockdelay.Release(e.conn, e.path, path.Base(n))
	}
	return e.conn.Delete(n, -1)
}

// endTerm ends the leadership t, once.
func (e *Election) endTerm(t *term, why string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term != t {
		return
	}
	e.term = nil
	close(t.done)
	e.idle()
	e.log.Debug("leadership ended", "znode", t.key, "why", why)
}

// watchTerm follows our own node with an exists watch until the
// leadership ends: a NodeDeleted event (Resign, another client, the
// session's end on the server) or EventNotWatching (the client learned the
// session expired, or the connection closed) ends it. A data change (our
// Proclaim) only sets the watch again.
func (e *Election) watchTerm(t *term, w <-chan zk.Event) {
	defer e.wg.Done()
	for {
		select {
		case <-t.done:
			return
		case <-e.closed:
			return // Close ends the term
		case ev := <-w:
			switch ev.Type {
			case zk.EventNodeDeleted:
				e.endTerm(t, "node deleted")
				return
			case zk.EventNotWatching:
				e.endTerm(t, fmt.Sprintf("watch ended: %v", ev.Err))
				return
			}
			if w = e.rewatch(t); w == nil {
				return
			}
		}
	}
}

// rewatch sets the exists watch on our node again, retrying while the
// connection is down; nil when the leadership ended meanwhile.
func (e *Election) rewatch(t *term) <-chan zk.Event {
	backoff := 50 * time.Millisecond
	for {
		ok, st, w, err := e.conn.ExistsW(t.key)
		switch {
		case errors.Is(err, zk.ErrSessionExpired), errors.Is(err, zk.ErrClosing):
			e.endTerm(t, err.Error())
			return nil
		case err == nil && (!ok || st.EphemeralOwner != e.conn.SessionID()):
			e.endTerm(t, "node gone")
			return nil
		case err == nil:
			return w
		}
		if !sleep(backoff, t.done, e.closed) {
			return nil
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// sleep waits d unless a or b closes first (false then).
func sleep(d time.Duration, a, b <-chan struct{}) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-a:
		return false
	case <-b:
		return false
	}
}

// Reaper deletes the idle elections under a directory of elections (the
// broker's elections/): an election's node <dir>/<name> that has had no
// candidate for a whole pass interval, so election names do not leave
// nodes behind forever. Campaign makes a deleted election's node again
// when its create finds it gone (unless WithCreateParents(false)), so a
// candidate racing the reaper still takes part; Observe waits for the node
// to exist again. A new node starts its candidates' sequence over, so keep
// a key only while its candidate lives. A Reaper is used by one goroutine
// at a time.
type Reaper struct{ r *zkutil.IdleReaper }

// NewReaper returns a Reaper of the elections under dir. It returns
// ErrInvalid for a path that is not absolute and clean.
func NewReaper(conn *zk.Conn, dir string) (*Reaper, error) {
	if conn == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalid)
	}
	if dir == "" || dir[0] != '/' || dir == "/" || path.Clean(dir) != dir {
		return nil, fmt.Errorf("%w: path %q: want an absolute, clean ZooKeeper path other than /", ErrInvalid, dir)
	}
	return &Reaper{r: zkutil.NewIdleReaper(conn, dir)}, nil
}

// Reap is one pass: it deletes the election nodes under dir that are
// empty and were already empty, unchanged, at the previous pass, and
// returns how many. Call it periodically from one process (a leader): the
// interval between passes is how long an election stays idle before it
// is deleted.
func (r *Reaper) Reap(ctx context.Context) (int, error) {
	n, err := r.r.Pass(ctx)
	if err != nil {
		return n, fmt.Errorf("election: reap: %w", err)
	}
	return n, nil
}
