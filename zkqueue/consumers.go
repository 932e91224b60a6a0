package zkqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Consumer registrations and the share split.
//
// The processes consuming a queue each register their consumers as
// EPHEMERAL children of one directory (the queue's consumers/), named
// <process id>~<nonce>: the process id says whose consumer it is, the
// random nonce makes the name one no one else uses, so a process can
// tell its own registrations apart and retry a create or delete whose
// answer was lost. From the listing, every process computes the same
// sorted set of consuming processes; its rank in that set is its share of
// the queue (splitShare in dispatch.go): it takes first the messages it
// published (when its publishes carry its tag, WithPublisher), then those
// of no consuming process whose sequence number is its rank modulo their
// count.
//
// Registrations made before names had nonces were sequential nodes,
// <process id>-<10-digit sequence>; they are still read.

// Registration names.
const (
	// registrationSep separates the process id from the nonce. The nonce
	// is hex, so the last separator is the one: a process id may contain
	// it.
	registrationSep = '~'
	// nonceBytes is the nonce's length before hex encoding.
	nonceBytes = 8
	// legacySep and legacySeqLen: the sequential suffix ZooKeeper gave
	// the registrations of older processes, "-" and 10 digits.
	legacySep    = '-'
	legacySeqLen = 10
)

// DefaultRankTTL is how long one listing of the registrations serves
// Rank: a process joining or leaving shifts the shares within it.
const DefaultRankTTL = time.Second

// ParseRegistration returns the process id of a registration's node name:
// "<id>~<nonce>", or "<id>-<10-digit sequence>" as older processes named
// them. ok is false for any other name.
func ParseRegistration(name string) (processID string, ok bool) {
	if i := strings.LastIndexByte(name, registrationSep); i > 0 {
		return name[:i], true
	}
	if i := len(name) - legacySeqLen - 1; i > 0 && name[i] == legacySep {
		return name[:i], true
	}
	return "", false
}

// Share is a process's place among the processes consuming a queue: its
// rank of N, and the publisher tag (PublisherTag) of the process of each
// rank, when known (WithOwners).
type Share struct {
	Rank, N    int
	Publishers []string
}

// shareOf returns id's share among the sorted, distinct ids. A process
// absent from them (it has no registered consumer) takes the whole queue:
// rank 0 of 1.
func shareOf(ids []string, id string) Share {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	rank := slices.Index(ids, id)
	if rank < 0 {
		return Share{Rank: 0, N: 1}
	}
	tags := make([]string, len(ids))
	for i, x := range ids {
		tags[i] = PublisherTag(x)
	}
	return Share{Rank: rank, N: len(ids), Publishers: tags}
}

// ConsumerGroupConfig configures a ConsumerGroup. Zero fields take the
// defaults.
type ConsumerGroupConfig struct {
	// Registry keeps the registrations Register makes through session
	// changes (run it: Registry.Run) and tells this process's own from
	// its previous process's. Default: a Registry of the group's own,
	// which nothing runs: a registration then lasts until Close or the
	// end of its session.
	Registry *Registry
	// Own, when set, reports instead of the Registry whether this
	// process's registration at path p (its name carries this process's
	// id) counts: for a process that keeps its registrations itself.
	Own func(p string) bool
	// WithoutCreate: Register does not create the directory (see
	// WithoutCreate; Catalog.Open sets it).
	WithoutCreate bool
	// RankTTL is how long one listing serves Rank (default
	// DefaultRankTTL).
	RankTTL time.Duration
	// ACL of dir when Register creates it, and of the registrations when
	// the group has a Registry of its own (see WithACL); default open.
	ACL []zk.ACL
}

// ConsumerGroup is the set of consumers of one queue across processes:
// the registrations under one directory, the count of live consumers, and
// this process's rank among the consuming processes, the share split of
// the queue's dispatcher (use WithShare(g.Rank)).
//
// A ConsumerGroup is safe for concurrent use.
type ConsumerGroup struct {
	conn *zk.Conn
	dir  string
	id   string
	cfg  ConsumerGroupConfig
	reg  *Registry // cfg.Registry, or the group's own

	rankMu sync.Mutex // held while listing for Share: one listing serves all callers
	share  Share      // this process's share at read
	read   time.Time  // when the registrations were last listed for Share
}

// NewConsumerGroup returns the group whose registrations are the children
// of dir, seen from the process processID. It does not touch ZooKeeper.
func NewConsumerGroup(conn *zk.Conn, dir, processID string, cfg ConsumerGroupConfig) (*ConsumerGroup, error) {
	if conn == nil {
		return nil, errors.New("zkqueue: nil zk conn")
	}
	if dir == "" || dir[0] != '/' || path.Clean(dir) != dir || dir == "/" {
		return nil, fmt.Errorf("zkqueue: bad consumers path %q", dir)
	}
	if processID == "" || strings.ContainsRune(processID, '/') {
		return nil, fmt.Errorf("zkqueue: bad process id %q", processID)
	}
	if cfg.RankTTL <= 0 {
		cfg.RankTTL = DefaultRankTTL
	}
	cfg.ACL = zkutil.ACLOr(cfg.ACL)
	reg := cfg.Registry
	if reg == nil {
		reg = NewRegistry(conn, RegistryConfig{ACL: cfg.ACL})
	}
	return &ConsumerGroup{conn: conn, dir: dir, id: processID, cfg: cfg, reg: reg}, nil
}

// NewRegistrationPath returns the path of a new registration of this
// process: <dir>/<process id>~<random nonce>, a name no one else uses.
func (g *ConsumerGroup) NewRegistrationPath() string {
	var n [nonceBytes]byte
	_, _ = rand.Read(n[:])
	return g.dir + "/" + g.id + string(registrationSep) + hex.EncodeToString(n[:])
}

// Registration is one consumer registered by Register.
type Registration struct {
	g    *ConsumerGroup
	kept *keptNode
}

// Register registers a consumer of this process: an EPHEMERAL node named
// NewRegistrationPath, creating the directory when missing (unless
// ConsumerGroupConfig.WithoutCreate). It lasts until Close, through
// session expiries while the group's Registry runs (see Registry). It
// returns once the node exists or, ZooKeeper being away, once the Registry
// has it to create. Errors: the context's; zk.ErrNoNode (wrapped) when the
// directory is missing and the group may not create it (its queue was
// deleted).
func (g *ConsumerGroup) Register(ctx context.Context) (*Registration, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := g.NewRegistrationPath()
	e, gone := g.reg.keep(p)
	if gone && !g.cfg.WithoutCreate {
		g.reg.keeper.Drop(e)
		if err := zkutil.EnsurePath(g.conn, g.dir, g.cfg.ACL); err != nil {
			return nil, fmt.Errorf("zkqueue: register: %w", err)
		}
		e, gone = g.reg.keep(p)
	}
	if gone {
		g.reg.keeper.Drop(e)
		return nil, fmt.Errorf("zkqueue: register %s: %w", p, zk.ErrNoNode)
	}
	return &Registration{g: g, kept: e}, nil
}

// Path returns the registration's node.
func (r *Registration) Path() string { return r.kept.Path() }

// Close deletes the registration: it no longer counts, and its node is
// deleted at once when ZooKeeper answers, else by the Registry's Run when
// it does, or with its session. It returns nil.
func (r *Registration) Close() error {
	r.g.reg.keeper.Drop(r.kept)
	return nil
}

// own reports whether this process's registration at p counts.
func (g *ConsumerGroup) own(p string) bool {
	if g.cfg.Own != nil {
		return g.cfg.Own(p)
	}
	return g.reg.own(p)
}

// Consumers returns the process id of each live consumer registration, one
// per consumer (a process with three consumers is listed three times).
// zk.ErrNoNode: the directory does not exist.
func (g *ConsumerGroup) Consumers(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	children, _, err := g.conn.Children(g.dir)
	if err != nil {
		return nil, fmt.Errorf("zkqueue: children %s: %w", g.dir, err)
	}
	ids := make([]string, 0, len(children))
	for _, c := range children {
		id, ok := ParseRegistration(c)
		if !ok || (id == g.id && !g.own(g.dir+"/"+c)) {
			continue
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// Count returns the number of live consumers on all processes; 0 when the
// directory does not exist.
func (g *ConsumerGroup) Count(ctx context.Context) (int, error) {
	ids, err := g.Consumers(ctx)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	return len(ids), err
}

// Rank returns this process's rank among the n processes with live
// consumers, read at most every RankTTL; its signature is WithShare's. A
// process without a live consumer, or one that cannot list them, takes
// the whole queue (0 of 1).
func (g *ConsumerGroup) Rank() (rank, n int) {
	sh := g.Share()
	return sh.Rank, sh.N
}

// Share is Rank with the publisher tags of the consuming processes; its
// signature is WithOwners'.
func (g *ConsumerGroup) Share() Share {
	g.rankMu.Lock()
	defer g.rankMu.Unlock()
	if g.read.IsZero() || time.Since(g.read) >= g.cfg.RankTTL {
		g.share = Share{Rank: 0, N: 1}
		if ids, err := g.Consumers(context.Background()); err == nil {
			g.share = shareOf(ids, g.id)
		}
		g.read = time.Now()
	}
	return g.share
}

// Registry keeps a process's registrations through session changes: its
// consumers' of all the queues it consumes (ConsumerGroup.Register), and
// any node standing for the process itself (Keep). A create and a delete
// are not enough for an EPHEMERAL node that must exist exactly while what
// it stands for lives:
//
//   - a create or delete whose answer is lost with the connection may or
//     may not have happened;
//   - a session expiry deletes the session's ephemeral nodes while the
//     process and its consumers go on;
//   - a process restarted under the same process id finds its previous
//     process's registrations there until that session expires.
//
// So a registration has a name no one else uses (<process id>~<nonce>),
// it counts for this process only while the Registry keeps it, and Run
// reconciles: every kept registration until it exists under the current
// session, every closed one until it is gone, retrying with backoff while
// ZooKeeper is away and again under every new session. A registration
// under this process's id that the Registry does not know of (its
// previous process's) is not counted, and Run deletes it.
//
// Share one Registry among the ConsumerGroups of a process
// (ConsumerGroupConfig.Registry, OpenConfig.Registry): a group opened anew
// for a queue (its metadata changed) must know the registrations made
// through the old one. A Registry is safe for concurrent use.
type Registry struct {
	conn   *zk.Conn
	keeper *keeper
}

// RegistryConfig configures a Registry.
type RegistryConfig struct {
	// ACL of the registrations (see WithACL); default open.
	ACL []zk.ACL
	// Logger receives the replacements of an earlier session's
	// registrations and the retries (default: discarded).
	Logger *slog.Logger
}

// registryPoll is how often Run looks whether the session is back, a
// local read of the client's state.
const registryPoll = 100 * time.Millisecond

// NewRegistry returns a Registry of the registrations on conn. It makes no
// request. Without Run, a registration is made at once when ZooKeeper
// answers, and lasts until it is closed or the session ends.
func NewRegistry(conn *zk.Conn, cfg RegistryConfig) *Registry {
	k := newKeeper(cfg.Logger)
	k.Bind(conn, cfg.ACL)
	return &Registry{conn: conn, keeper: k}
}

// Keep makes the EPHEMERAL node p, with data, exist from now on for as long
// as the Registry runs, through session changes as a registration does: a
// process that registers itself (a broker its brokers/<id>) keeps that
// node here. p's name must be one no other process uses.
func (r *Registry) Keep(p string, data []byte) { r.keeper.Keep(p, data) }

// Wake makes Run reconcile now; a process that sees its session events may
// call it whenever the session is back, which Run otherwise notices
// within 100 ms. It never blocks.
func (r *Registry) Wake() { r.keeper.Wake() }

// Run keeps the registrations until ctx ends (see Registry); its caller
// owns the goroutine. It makes no request while nothing changes.
func (r *Registry) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.keeper.Run(ctx) }()
	defer wg.Wait()
	t := time.NewTicker(registryPoll)
	defer t.Stop()
	connected, sid := false, int64(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Back in session, the same or a new one (seen by its id when the
		// session changed between two looks): what failed meanwhile
		// (deletes of closed registrations, a new session's creates) is
		// retried now.
		now := r.conn.State() == zk.StateHasSession
		if now && (!connected || r.conn.SessionID() != sid) {
			sid = r.conn.SessionID()
			r.keeper.Wake()
		}
		connected = now
	}
}

// keep makes the registration p exist until drop; gone: its parent is
// missing (only known when ZooKeeper answered at once).
func (r *Registry) keep(p string) (e *keptNode, gone bool) {
	e = r.keeper.Keep(p, nil)
	return e, e.Gone()
}

// own reports whether this process's registration p counts: only while
// kept. One the Registry does not know of is deleted by Run.
func (r *Registry) own(p string) bool {
	known, wanted := r.keeper.Tracked(p)
	if !known {
		r.keeper.Stray(p)
	}
	return wanted
}

// keeper keeps a Registry's EPHEMERAL nodes through session changes (the
// Registry's doc says why a create and a delete are not enough): a node
// is ours only when its ephemeralOwner is our current session, and one
// goroutine (Run) reconciles every wanted node until it exists under the
// current session and every unwanted one until it is gone, retrying with
// backoff while ZooKeeper is away and again after every new session.
// Nodes found under our names that the keeper does not know of (left by
// the previous process) are deleted through Stray. Bind its connection
// before any other call; a keeper is safe for concurrent use.
type keeper struct {
	conn *zk.Conn
	acl  []zk.ACL
	log  *slog.Logger

	mu    sync.Mutex
	nodes map[string]*keptNode
	kick  chan struct{}
}

// keptNode is one node a keeper keeps, or removes.
type keptNode struct {
	path string
	data []byte

	wanted atomic.Bool // should exist; once false, never true again

	mu      sync.Mutex // serializes the node's ZooKeeper calls; guards the fields below
	owner   int64      // the session that owns the node we made; 0: none that we know of
	unknown bool       // a create or delete whose outcome is unknown
	gone    bool       // its parent was deleted: it cannot exist
}

// Path returns the node's path.
func (e *keptNode) Path() string { return e.path }

// Gone reports whether the node's parent was found missing: the keeper
// does not create it until Drop.
func (e *keptNode) Gone() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gone
}

// needsWork reports whether e differs from what is wanted under session
// sid. e.mu is held.
func (e *keptNode) needsWork(sid int64) bool {
	if e.wanted.Load() {
		return !e.gone && e.owner != sid
	}
	return e.owner != 0 || e.unknown
}

// newKeeper returns a keeper logging to logger (nil discards).
func newKeeper(logger *slog.Logger) *keeper {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &keeper{log: logger, nodes: map[string]*keptNode{}, kick: make(chan struct{}, 1)}
}

// Bind sets the connection the nodes live on and their ACL (OpenACL when
// empty). Call it once, before Keep, Drop, Stray and Run.
func (k *keeper) Bind(conn *zk.Conn, acl []zk.ACL) { k.conn, k.acl = conn, zkutil.ACLOr(acl) }

// Wake makes Run reconcile now. Call it on every new session (a
// StateHasSession event): a new session has none of the old one's
// ephemeral nodes. It never blocks.
func (k *keeper) Wake() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Keep makes the node at p exist with data, owned by the current session,
// until Drop. It tries at once; when that fails (ZooKeeper away), Run
// retries. p must be a name no other process uses. Its parent must exist:
// once it is gone (a queue deleted), the keeper stops trying until Drop.
func (k *keeper) Keep(p string, data []byte) *keptNode {
	e := &keptNode{path: p, data: data}
	e.wanted.Store(true)
	k.mu.Lock()
	k.nodes[p] = e
	k.mu.Unlock()
	k.reconcileNow(e)
	return e
}

// Drop makes the node go away: at once if ZooKeeper answers, else as soon
// as it does (or the session owning the node ends).
func (k *keeper) Drop(e *keptNode) {
	e.wanted.Store(false)
	k.reconcileNow(e)
}

// Stray schedules the deletion of the node at p, one of the caller's names
// that the keeper does not know of (a previous process's). It does nothing
// when p is kept.
func (k *keeper) Stray(p string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.nodes[p]; ok {
		return
	}
	k.nodes[p] = &keptNode{path: p, unknown: true}
	k.Wake()
}

// Tracked reports whether p is a node of the keeper (kept, or being
// removed), and whether it is wanted.
func (k *keeper) Tracked(p string) (known, wanted bool) {
	k.mu.Lock()
	e := k.nodes[p]
	k.mu.Unlock()
	if e == nil {
		return false, false
	}
	return true, e.wanted.Load()
}

func (k *keeper) snapshot() []*keptNode {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]*keptNode, 0, len(k.nodes))
	for _, e := range k.nodes {
		out = append(out, e)
	}
	return out
}

// forget drops e once nothing is left to do for it.
func (k *keeper) forget(e *keptNode) {
	k.mu.Lock()
	if k.nodes[e.path] == e {
		delete(k.nodes, e.path)
	}
	k.mu.Unlock()
}

func (k *keeper) hasSession() bool { return k.conn.State() == zk.StateHasSession }

func (k *keeper) reconcileNow(e *keptNode) {
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
// delete. Settled unwanted nodes leave the keeper.
func (k *keeper) reconcile(e *keptNode, sid int64) error {
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

// ErrKeepRace is the error of a node replaced repeatedly while the keeper
// created it; Run retries.
var ErrKeepRace = errors.New("zk: kept node replaced repeatedly")

// ensure creates e under the current session. A node already there is
// ours only when its ephemeralOwner is our session; one of an earlier
// session (a create whose answer was lost, then an expiry; or the
// previous process's) is deleted and created again. e.mu is held.
func (k *keeper) ensure(e *keptNode) error {
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
func (k *keeper) remove(e *keptNode) error {
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
func (k *keeper) Run(ctx context.Context) {
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
func (k *keeper) reconcileAll(ctx context.Context) bool {
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
