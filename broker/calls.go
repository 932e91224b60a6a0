package broker

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"hash"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/connlimit"
	"github.com/qbroker/qbroker/internal/layout"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// gate is every call's way in: it authenticates and authorizes calls
// (Config.Auth), re-checks the streams they keep open (authstreams.go),
// counts each client's streams and connections against the limits
// (limits.go), writes the audit log (audit.go) and logs the calls. The
// gRPC server's interceptors are its callUnary and callStream.
type gate struct {
	b *Broker

	streams     atomic.Int64 // open long-lived streams, under MaxStreams
	clients     clientUse    // streams and connections per client
	authStreams authStreams  // open streams, re-checked when auth files change (authstreams.go)

	listenersMu sync.Mutex
	listeners   []*connlimit.Listener // LimitListener's, told which connections proved themselves
	warnings    rateLimit             // refusals' warnings
	refusals    auditLimit            // audit lines of refused calls
}

// enterStream accounts for a long-lived stream of ctx's client under
// MaxStreamsPerIdentity and MaxStreams; the returned func ends it.
func (gt *gate) enterStream(ctx context.Context) (func(), error) {
	b := gt.b
	if b.ctx.Err() != nil {
		return nil, errClosing
	}
	if gt.streams.Add(1) > int64(b.cfg.MaxStreams) {
		gt.streams.Add(-1)
		gt.refuseStream(reasonMaxStreams)
		return nil, fmt.Errorf("%w: %d streams open, the most the broker serves (--max-streams)", errLimit, b.cfg.MaxStreams)
	}
	c := gt.clientOf(ctx)
	if n, ok := gt.clients.addStream(c.key, b.cfg.MaxStreamsPerIdentity); !ok {
		gt.streams.Add(-1)
		gt.refuseStream(reasonPerIdentity)
		return nil, fmt.Errorf("%w: %s has %d open streams, the most one client may open (--max-streams-per-identity)",
			errLimit, c, n)
	}
	b.wg.Add(1)
	return func() { gt.streams.Add(-1); gt.clients.endStream(c.key); b.wg.Done() }, nil
}

// access is one permission a request needs: action on the queue, lock or
// election called name.
type access struct {
	action, kind, name string
}

// methodAuth is what a method's callers need besides an identity.
type methodAuth struct {
	// public methods need no credentials (health checks).
	public bool
	// needs lists the permissions one request message needs; nil: an
	// authenticated identity is enough (ListQueues then answers only the
	// queues the caller may view: admin.go's viewFilter).
	needs func(msg any) []access
}

func onQueue(action string, name func(msg any) string) func(any) []access {
	return func(m any) []access { return []access{{action, "queue", name(m)}} }
}

// tokenQueue is the queue an ack token names (its first element); a token
// that names none matches no rule, unless one grants "*".
func tokenQueue(tok string) string {
	q, _, _ := strings.Cut(tok, "/")
	return q
}

func onToken(tok func(msg any) string) func(any) []access {
	return func(m any) []access { return []access{{ActConsume, "queue", tokenQueue(tok(m))}} }
}

// onCoord: action on a lock or an election, the kind its action's first
// word names ("election.observe": an election).
func onCoord(action string, name func(msg any) string) func(any) []access {
	kind, _, _ := strings.Cut(strings.Fields(action)[0], ".")
	return func(m any) []access { return []access{{action, kind, name(m)}} }
}

// methodAuths maps every method the broker serves to what it needs
// (TestEveryMethodMapped holds it to GRPCServer's services). A method
// missing here is denied.
var methodAuths = map[string]methodAuth{
	pb.Queue_CreateQueue_FullMethodName: {needs: onQueue(ActCreate, func(m any) string { return m.(*pb.CreateQueueRequest).GetName() })},
	pb.Queue_GetQueue_FullMethodName:    {needs: onQueue(ActView, func(m any) string { return m.(*pb.GetQueueRequest).GetName() })},
	pb.Queue_ListQueues_FullMethodName:  {},
	pb.Queue_DeleteQueue_FullMethodName: {needs: onQueue(ActDelete, func(m any) string { return m.(*pb.DeleteQueueRequest).GetName() })},
	pb.Queue_Purge_FullMethodName:       {needs: onQueue(ActPurge, func(m any) string { return m.(*pb.PurgeRequest).GetName() })},
	pb.Queue_Stats_FullMethodName:       {needs: onQueue(ActView, func(m any) string { return m.(*pb.StatsRequest).GetName() })},
	pb.Queue_Publish_FullMethodName:     {needs: onQueue(ActPublish, func(m any) string { return m.(*pb.PublishRequest).GetQueue() })},
	pb.Queue_Consume_FullMethodName:     {needs: consumeNeeds},
	pb.Queue_Receive_FullMethodName:     {needs: onQueue(ActConsume, func(m any) string { return m.(*pb.ReceiveRequest).GetQueue() })},
	pb.Queue_Ack_FullMethodName:         {needs: onToken(func(m any) string { return m.(*pb.AckRequest).GetAckToken() })},
	pb.Queue_Nack_FullMethodName:        {needs: onToken(func(m any) string { return m.(*pb.NackRequest).GetAckToken() })},
	pb.Queue_ExtendLease_FullMethodName: {needs: onToken(func(m any) string { return m.(*pb.ExtendLeaseRequest).GetAckToken() })},
	pb.Queue_JoinSync_FullMethodName:    {needs: onQueue(ActJoin, func(m any) string { return m.(*pb.JoinSyncRequest).GetQueue() })},
	pb.Queue_ListDeadLetters_FullMethodName: {needs: onQueue(ActConsume, func(m any) string {
		return m.(*pb.ListDeadLettersRequest).GetQueue()
	})},
	pb.Queue_Redrive_FullMethodName: {needs: onQueue(ActRedrive, func(m any) string { return m.(*pb.RedriveRequest).GetQueue() })},
	pb.Queue_Browse_FullMethodName:  {needs: onQueue(ActConsume, func(m any) string { return m.(*pb.BrowseRequest).GetQueue() })},

	pb.Election_Campaign_FullMethodName: {needs: onCoord(ActElection, func(m any) string { return m.(*pb.CampaignRequest).GetName() })},
	pb.Election_Proclaim_FullMethodName: {needs: onCoord(actElectionByKey, func(m any) string { return m.(*pb.ProclaimRequest).GetName() })},
	pb.Election_Resign_FullMethodName:   {needs: onCoord(actElectionByKey, func(m any) string { return m.(*pb.ResignRequest).GetName() })},
	pb.Election_Leader_FullMethodName:   {needs: onCoord(ActElectionObserve, func(m any) string { return m.(*pb.LeaderRequest).GetName() })},
	pb.Election_Observe_FullMethodName:  {needs: onCoord(ActElectionObserve, func(m any) string { return m.(*pb.ObserveRequest).GetName() })},
	pb.Lock_Lock_FullMethodName:         {needs: lockNeeds},
	pb.Lock_Unlock_FullMethodName:       {needs: onCoord(actLockByKey, func(m any) string { return m.(*pb.UnlockRequest).GetName() })},
	pb.Lock_Revoke_FullMethodName:       {needs: onCoord(actLockByKey, func(m any) string { return m.(*pb.RevokeRequest).GetName() })},

	pb.Counter_Get_FullMethodName: {needs: onCoord(ActCounterRead, func(m any) string { return m.(*pb.CounterGetRequest).GetName() })},
	pb.Counter_Add_FullMethodName: {needs: onCoord(ActCounter, func(m any) string { return m.(*pb.CounterAddRequest).GetName() })},
	pb.Counter_CompareAndSet_FullMethodName: {needs: onCoord(ActCounter, func(m any) string {
		return m.(*pb.CounterCompareAndSetRequest).GetName()
	})},
	pb.Counter_Set_FullMethodName:       {needs: onCoord(ActCounter, func(m any) string { return m.(*pb.CounterSetRequest).GetName() })},
	pb.Semaphore_Acquire_FullMethodName: {needs: semaphoreNeeds},
	pb.Semaphore_Release_FullMethodName: {needs: onCoord(actSemaphoreByKey, func(m any) string {
		return m.(*pb.SemaphoreReleaseRequest).GetName()
	})},
	pb.Semaphore_Revoke_FullMethodName: {needs: onCoord(actSemaphoreByKey, func(m any) string {
		return m.(*pb.SemaphoreRevokeRequest).GetName()
	})},
	pb.Semaphore_SetLimit_FullMethodName: {needs: onCoord(ActSemaphoreAdmin, func(m any) string {
		return m.(*pb.SemaphoreSetLimitRequest).GetName()
	})},
	pb.Barrier_Set_FullMethodName:         {needs: onCoord(ActBarrierAdmin, func(m any) string { return m.(*pb.SetBarrierRequest).GetName() })},
	pb.Barrier_Remove_FullMethodName:      {needs: onCoord(ActBarrierAdmin, func(m any) string { return m.(*pb.RemoveBarrierRequest).GetName() })},
	pb.Barrier_Wait_FullMethodName:        {needs: onCoord(ActBarrier, func(m any) string { return m.(*pb.WaitBarrierRequest).GetName() })},
	pb.DoubleBarrier_Enter_FullMethodName: {needs: doubleBarrierNeeds},
}

// semaphoreNeeds: the request naming the semaphore needs semaphore on
// it; the later {release} requests give back what the stream holds.
func semaphoreNeeds(m any) []access {
	r := m.(*pb.SemaphoreAcquireRequest)
	if r.GetName() == "" && r.GetRelease() {
		return nil
	}
	return []access{{ActSemaphore, ActSemaphore, r.GetName()}}
}

// doubleBarrierNeeds: the request naming the double barrier needs
// barrier on it; the later {leave} requests leave what the stream
// entered.
func doubleBarrierNeeds(m any) []access {
	r := m.(*pb.DoubleBarrierRequest)
	if r.GetName() == "" && r.GetLeave() {
		return nil
	}
	return []access{{ActBarrier, "double_barrier", r.GetName()}}
}

// consumeNeeds: a Consume stream's subscription needs consume on its
// queue, and every settlement consume on its token's queue (an ack token
// of another queue settles nothing for a caller who may not consume it).
func consumeNeeds(m any) []access {
	r := m.(*pb.ConsumeRequest)
	var need []access
	if s := r.GetSubscribe(); s != nil {
		need = append(need, access{ActConsume, "queue", s.GetQueue()})
	}
	for _, s := range r.GetSettle() {
		need = append(need, access{ActConsume, "queue", tokenQueue(s.GetAckToken())})
	}
	return need
}

// lockNeeds: the request naming the lock needs lock on it; the later
// {unlock} requests release what the stream holds.
func lockNeeds(m any) []access {
	r := m.(*pb.LockRequest)
	if r.GetName() == "" && r.GetUnlock() {
		return nil
	}
	return []access{{ActLock, ActLock, r.GetName()}}
}

// authFor returns what method needs; ok false for a method nothing maps
// (denied). Health checks are public (load balancers probe them);
// reflection needs an identity.
func authFor(method string) (methodAuth, bool) {
	if ma, ok := methodAuths[method]; ok {
		return ma, true
	}
	switch {
	case strings.HasPrefix(method, "/grpc.health.v1.Health/"):
		return methodAuth{public: true}, true
	case strings.HasPrefix(method, "/grpc.reflection.v1.ServerReflection/"),
		strings.HasPrefix(method, "/grpc.reflection.v1alpha.ServerReflection/"):
		return methodAuth{}, true
	}
	return methodAuth{}, false
}

// authorize authenticates a call to method and checks its first (or only)
// request msg; nil msg checks only the identity. It returns ctx with the
// identity.
func (gt *gate) authorize(ctx context.Context, method string) (context.Context, Identity, methodAuth, error) {
	b := gt.b
	if b.cfg.Auth == nil {
		return ctx, Identity{}, methodAuth{}, nil
	}
	ma, ok := authFor(method)
	if ma.public {
		return ctx, Identity{}, ma, nil
	}
	id, err := b.cfg.Auth.authenticate(ctx)
	if err != nil {
		gt.warnings.warn(b.log, "auth:unauthenticated", "call refused: unauthenticated", "method", method, "peer", peerAddr(ctx), "err", status.Convert(err).Message())
		return ctx, Identity{}, ma, err
	}
	if !ok {
		return ctx, id, ma, status.Errorf(codes.PermissionDenied, "%s may not call %s", id.Name, method)
	}
	return context.WithValue(ctx, identityKey{}, id), id, ma, nil
}

// check returns PermissionDenied, naming the action and the name, unless
// id may do all that msg needs.
func (gt *gate) check(ctx context.Context, id Identity, ma methodAuth, method string, msg any) error {
	b := gt.b
	if b.cfg.Auth == nil || ma.public || ma.needs == nil { // no Auth: ma is empty
		return nil
	}
	rules := b.cfg.Auth.rules.Get()
	for _, a := range ma.needs(msg) {
		if !rules.Allowed(id.Name, a.action, a.name) {
			gt.warnings.warn(b.log, "auth:denied", "call refused: permission denied", "method", method,
				"identity", id.Name, "action", a.action, a.kind, a.name)
			return status.Errorf(codes.PermissionDenied, "%s may not %s %s %q", id.Name, a.action, a.kind, printable(a.name))
		}
	}
	return nil
}

// callUnary is the broker's interceptor of unary calls (after the gRPC
// metrics'): it authenticates and authorizes the call when Auth is set,
// counts its connection for its client (enterConn), writes the audit log
// for the methods audit.go names and for refusals, and logs the call at
// debug. A call without Auth on a connection already counted runs none of
// that but a map lookup and the log level's check.
func (gt *gate) callUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	ctx, id, ma, err := gt.authorize(ctx, info.FullMethod)
	if err == nil {
		err = gt.check(ctx, id, ma, info.FullMethod, req)
	}
	if err == nil {
		err = gt.enterConn(ctx)
	}
	var resp any
	if err == nil {
		resp, err = h(ctx, req)
	}
	if _, audited := auditedMethods[info.FullMethod]; audited || err != nil {
		gt.audit(ctx, info.FullMethod, req, id, err)
	}
	gt.logCall(ctx, info.FullMethod, start, err)
	return resp, err
}

// callStream is callUnary for streams: it authenticates them and, when
// Auth is set, authorizes each request they receive (a Consume stream's
// subscription and settlements, a Lock stream's lock, ...) and re-checks
// the stream while it is open (authstreams.go).
func (gt *gate) callStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	err := gt.authStream(srv, ss, info, h)
	gt.logCall(ss.Context(), info.FullMethod, start, err)
	return err
}

func (gt *gate) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	b := gt.b
	ctx, id, ma, err := gt.authorize(ss.Context(), info.FullMethod)
	if err != nil {
		gt.audit(ctx, info.FullMethod, nil, id, err)
		return err
	}
	if b.cfg.Auth == nil || ma.public {
		if err := gt.enterConn(ctx); err != nil {
			return err
		}
		return h(srv, ss)
	}
	if err := gt.enterConn(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := &checkedStream{ServerStream: ss, ctx: ctx, cancel: cancel}
	w.check = func(m any) error {
		if err := gt.check(ctx, id, ma, info.FullMethod, m); err != nil {
			gt.audit(ctx, info.FullMethod, m, id, err)
			return err
		}
		if ma.needs != nil && !w.recorded.Load() {
			w.grant(ma.needs(m))
		}
		return nil
	}
	// Re-checked while open: a revoked credential or rule ends it
	// (authstreams.go).
	st := &authStream{ctx: ss.Context(), id: id, method: info.FullMethod, w: w}
	gt.authStreams.add(st)
	defer gt.authStreams.remove(st)
	err = h(srv, w)
	if d := w.deniedErr(); d != nil {
		return d // the handler saw a failed receive, or its context end
	}
	return err
}

// enterConn admits the call's connection (limits.go's admitConn) unless
// it is settled already.
func (gt *gate) enterConn(ctx context.Context) error {
	cn, _ := ctx.Value(connKey{}).(*conn)
	if cn != nil && cn.settled.Load() {
		return nil
	}
	return gt.admitConn(ctx, cn)
}

// logCall logs a call at debug.
func (gt *gate) logCall(ctx context.Context, method string, start time.Time, err error) {
	b := gt.b
	if !b.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	b.log.Debug("grpc call", "method", method, "grpc_code", status.Code(err).String(),
		"duration", time.Since(start))
}

// checkedStream checks each request received; a denied one fails the
// receive and ends the stream's context, so the handler stops whatever it
// does, and the interceptor answers PermissionDenied. A re-check that
// finds the stream no longer allowed ends it the same way (end). It
// keeps what its first request was granted, for the re-checks: that
// request opens what the stream holds (a Consume subscription, a lock, a
// campaign, ...); later ones (settlements) are checked as they come.
type checkedStream struct {
	grpc.ServerStream
	ctx    context.Context
	cancel context.CancelFunc
	check  func(any) error

	mu       sync.Mutex
	denied   error
	granted  []access
	recorded atomic.Bool // granted holds the first request's
}

func (s *checkedStream) Context() context.Context { return s.ctx }

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if err := s.check(m); err != nil {
		s.end(err)
		return err
	}
	return nil
}

// SendMsg sends nothing once the stream was denied.
func (s *checkedStream) SendMsg(m any) error {
	if err := s.deniedErr(); err != nil {
		return err
	}
	return s.ServerStream.SendMsg(m)
}

// end denies the stream with err (the first reason stands) and ends its
// context.
func (s *checkedStream) end(err error) {
	s.mu.Lock()
	if s.denied == nil {
		s.denied = err
	}
	s.mu.Unlock()
	s.cancel()
}

// grant records the accesses the first request was granted.
func (s *checkedStream) grant(as []access) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.recorded.Load() {
		s.granted = as
		s.recorded.Store(true)
	}
}

func (s *checkedStream) grantedAccess() []access {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.granted)
}

func (s *checkedStream) deniedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.denied
}

// audit (audit.go) logs changes and refusals.

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// Limits per client.
//
// MaxStreams and MaxConns bound what the broker serves; without bounds per
// client, one client could hold all of it and keep every other out. A
// client is the authenticated identity of a call when Config.Auth is set,
// else the IP address the call came from. clientUse counts each client's
// streams (admitted by enterStream, under MaxStreamsPerIdentity) and the
// connections it made calls on (claimed by claimConn, under
// MaxConnsPerIdentity); a connection's end, seen by the gRPC server's
// stats handler connEnds, frees its places.

// client names the client of a call: key is the map key ("" when the call
// has no client to count, such as a health check with authentication on);
// it prints as "identity alice" or "address 10.0.0.7".
type client struct {
	key  string
	kind string // "identity" or "address"
	name string
}

func (c client) String() string { return c.kind + " " + printable(c.name) }

// clientOf returns the client of ctx's call.
func (gt *gate) clientOf(ctx context.Context) client {
	b := gt.b
	if b.cfg.Auth != nil {
		if id, ok := IdentityFrom(ctx); ok && id.Name != "" {
			return client{key: "identity:" + id.Name, kind: "identity", name: id.Name}
		}
		return client{}
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return client{}
	}
	ip := p.Addr.String()
	if t, ok := p.Addr.(*net.TCPAddr); ok {
		ip = t.IP.String()
	} else if h, _, err := net.SplitHostPort(ip); err == nil {
		ip = h
	}
	return client{key: "address:" + ip, kind: "address", name: ip}
}

// clientUse counts streams and connections per client. The zero value is
// ready; it is safe for concurrent use.
type clientUse struct {
	mu sync.Mutex
	m  map[string]*clientCount
}

type clientCount struct{ streams, conns int }

// get returns key's counts, created when missing; mu is held.
func (u *clientUse) get(key string) *clientCount {
	if u.m == nil {
		u.m = map[string]*clientCount{}
	}
	n := u.m[key]
	if n == nil {
		n = &clientCount{}
		u.m[key] = n
	}
	return n
}

// put forgets key's counts once both are zero; mu is held.
func (u *clientUse) put(key string, n *clientCount) {
	if n.streams <= 0 && n.conns <= 0 {
		delete(u.m, key)
	}
}

// addStream counts a stream of key unless key holds limit already; it
// returns key's streams before and whether the stream was counted. An
// empty key is never bounded.
func (u *clientUse) addStream(key string, limit int) (int, bool) {
	if key == "" {
		return 0, true
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	n := u.get(key)
	if n.streams >= limit {
		u.put(key, n)
		return n.streams, false
	}
	n.streams++
	return n.streams - 1, true
}

// endStream uncounts a stream addStream counted.
func (u *clientUse) endStream(key string) {
	if key == "" {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	n := u.get(key)
	n.streams--
	u.put(key, n)
}

// conn is a client connection as connEnds tags it: the clients that made
// calls on it (usually one), uncounted when it ends. Guarded by
// clientUse.mu.
type conn struct {
	clients map[string]bool
	ended   bool
	// settled: without Auth, counted for its address and proven to the
	// limiting listeners (admitConn); its calls need neither again.
	settled atomic.Bool
}

type connKey struct{}

// claimConn counts ctx's connection for ctx's client, unless the client
// made calls on MaxConnsPerIdentity other connections still open: then it
// returns a ResourceExhausted status naming the limit. Calls without a
// connection the stats handler tagged (in-process calls) are not counted.
func (gt *gate) claimConn(ctx context.Context) error {
	b := gt.b
	cn, _ := ctx.Value(connKey{}).(*conn)
	if cn == nil {
		return nil
	}
	c := gt.clientOf(ctx)
	if c.key == "" {
		return nil
	}
	u := &gt.clients
	u.mu.Lock()
	if cn.ended || cn.clients[c.key] {
		u.mu.Unlock()
		return nil
	}
	n := u.get(c.key)
	if n.conns >= b.cfg.MaxConnsPerIdentity {
		held := n.conns
		u.put(c.key, n)
		u.mu.Unlock()
		gt.connRefusedFor(c, held)
		return b.fail(fmt.Errorf("%w: %s has calls on %d open connections, the most one client may use (--max-conns-per-identity)",
			errLimit, c, held))
	}
	n.conns++
	if cn.clients == nil {
		cn.clients = map[string]bool{}
	}
	cn.clients[c.key] = true
	u.mu.Unlock()
	return nil
}

// connEnded uncounts cn for every client that made calls on it.
func (u *clientUse) connEnded(cn *conn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	cn.ended = true
	for key := range cn.clients {
		n := u.get(key)
		n.conns--
		u.put(key, n)
	}
	cn.clients = nil
}

// connEnds is the gRPC server's stats handler: it tags each connection's
// context with a conn (calls on it find it in their context) and uncounts
// the conn when the connection ends. Everything else is a no-op.
type connEnds struct{ b *Broker }

func (connEnds) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (connEnds) HandleRPC(context.Context, stats.RPCStats)                       {}

func (connEnds) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, &conn{})
}

func (h connEnds) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnEnd); !ok {
		return
	}
	if cn, ok := ctx.Value(connKey{}).(*conn); ok {
		h.b.gate.clients.connEnded(cn)
	}
}

// ZooKeeper keeps every node in its heap, so a queue with no depth cap is
// bounded by ZooKeeper's memory: a server out of heap exits, and every
// queue with it. The broker therefore refuses publishes past a data
// budget, an estimate of the heap ZooKeeper's data needs:
//
//	DataCharge * zk_approximate_data_size + NodeCharge * zk_znode_count
//
// from mntr, the largest any server of the ensemble reports (replicas
// hold the same tree; the largest errs on the safe side), plus what this
// broker admitted since it last read them.
//
// The charges are measured on ZooKeeper 3.8 (OpenJDK 17, SerialGC;
// docs/operations.md, Limits): 1,000,000 messages of 100 B in one parent took 480 MB of live
// heap for an approximate data size of 122 MB, 358 B more per node; and a
// flood of 500 KiB messages through a broker exhausted a heap of 128 MiB
// with 28 MB of data (a server holds copies of recent requests' data
// besides the tree), so each byte of data counts twice.
const (
	NodeCharge = 384
	DataCharge = 2
)

// Budget refreshes: every dataInterval while the broker publishes (it
// admitted a publish within dataActive), else every dataIdleInterval, each
// server asked within dataTimeout. A read older than dataStale is no read
// at all.
const (
	dataInterval     = time.Second
	dataActive       = 10 * time.Second
	dataIdleInterval = 10 * time.Second
	dataTimeout      = 2 * time.Second
	dataStale        = 15 * time.Second
)

// zkMemory tracks the estimate against the budget. The publish path only
// reads what the background loop (run) last found: it never waits on
// ZooKeeper's monitoring port.
//
// Unknown (no server answered mntr for dataStale, or never): publishes are
// admitted, and the loop logs a warning while it lasts. Refusing every
// publish because the monitoring port is closed or mntr is not in
// 4lw.commands.whitelist would turn a configuration gap into an outage of
// every queue; the warning names the fix.
type zkMemory struct {
	servers []string
	budget  int64 // 0: no budget
	log     *slog.Logger
	gauge   func(float64) // the estimate, -1 while unknown

	mu       sync.Mutex
	used     int64     // the estimate at readAt
	readAt   time.Time // zero: never read
	pending  int64     // bytes admitted since the read that set used began
	admitted time.Time // the last admit
}

func newZKMemory(servers []string, budget int64, log *slog.Logger, gauge func(float64)) *zkMemory {
	// As the ZooKeeper client does: a server without a port is on 2181.
	return &zkMemory{servers: zk.FormatServers(servers), budget: budget, log: log, gauge: gauge}
}

// refusal is the error of a create past the budget: why, and what to do.
// what names the create ("this publish").
func (m *zkMemory) refusal(used, n int64, what string) error {
	return fmt.Errorf("%w: ZooKeeper data budget reached: ZooKeeper holds about %s of data (twice its approximate data size plus %d B per znode) and %s adds %s, over the budget of %s (--zk-data-budget); consume or purge messages, or give ZooKeeper more heap and the brokers a larger budget",
		errLimit, mib(used), NodeCharge, what, mib(n), mib(m.budget))
}

func mib(n int64) string {
	if n < 10<<20 {
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

// admit charges a publish's n bytes against the budget, or refuses them
// with errLimit. It never blocks on ZooKeeper.
func (m *zkMemory) admit(n int64) error { return m.admitFor(n, "this publish") }

// admitNode charges the create of a coordination node (a lock holder or
// waiter, an election candidate) with data bytes, named by what: the
// budget bounds every node the broker makes, not only messages.
func (m *zkMemory) admitNode(data int, what string) error {
	return m.admitFor(NodeCharge+DataCharge*int64(data), what)
}

// admitFor is admit for a create that what names.
func (m *zkMemory) admitFor(n int64, what string) error {
	if m.budget <= 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.admitted = time.Now()
	if m.readAt.IsZero() || time.Since(m.readAt) > dataStale {
		return nil // unknown: admitted (see zkMemory), warned by run
	}
	used := m.used + m.pending
	if used+n > m.budget {
		return m.refusal(used, n, what)
	}
	m.pending += n
	return nil
}

// run refreshes the estimate until ctx ends: every dataInterval while
// the broker publishes, every dataIdleInterval otherwise (an idle broker
// keeps the estimate fresh enough for its next publish at a tenth of the
// cost).
func (m *zkMemory) run(ctx context.Context) {
	if m.budget <= 0 {
		return
	}
	t := time.NewTicker(dataInterval)
	defer t.Stop()
	var lastWarn, lastRead time.Time
	known := false
	for {
		if m.due(lastRead) {
			lastRead = time.Now()
			err := m.refresh(ctx)
			switch {
			case ctx.Err() != nil:
				return
			case err == nil && !known:
				known = true
				if !lastWarn.IsZero() {
					m.log.Info("ZooKeeper data size known again: the data budget is enforced", "budget_bytes", m.budget)
				}
			case err != nil && m.stale():
				if known || time.Since(lastWarn) > time.Minute {
					m.log.Warn("ZooKeeper data size unknown: publishes are admitted without the data budget until a server answers mntr",
						"err", err, "servers", m.servers, "fix", "list mntr in each server's 4lw.commands.whitelist and let the brokers reach its client port")
					lastWarn = time.Now()
				}
				known = false
				m.gauge(-1)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// due reports whether a refresh is due, the last having begun at last.
func (m *zkMemory) due(last time.Time) bool {
	m.mu.Lock()
	active := time.Since(m.admitted) < dataActive
	m.mu.Unlock()
	return active || time.Since(last) >= dataIdleInterval-dataInterval/2
}

func (m *zkMemory) stale() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.readAt.IsZero() || time.Since(m.readAt) > dataStale
}

// refresh reads every server and keeps the largest estimate; it fails only
// when none answered. What was admitted before the reads began is in
// their answers (committed) or about to be (in flight): it stops counting
// as pending, a small undercount the budget's margin absorbs.
func (m *zkMemory) refresh(ctx context.Context) error {
	m.mu.Lock()
	before := m.pending
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, dataTimeout)
	defer cancel()
	type answer struct {
		ds  zkutil.DataSize
		err error
	}
	answers := make(chan answer, len(m.servers))
	var wg sync.WaitGroup
	for _, s := range m.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ds, err := zkutil.Mntr(ctx, s)
			answers <- answer{ds, err}
		}()
	}
	wg.Wait()
	close(answers)
	var (
		est   int64 = -1
		first error
	)
	for a := range answers {
		if a.err != nil {
			if first == nil {
				first = a.err
			}
			continue
		}
		est = max(est, DataCharge*a.ds.Bytes+NodeCharge*a.ds.Znodes)
	}
	if est < 0 {
		return first
	}
	m.mu.Lock()
	m.used, m.readAt = est, time.Now()
	m.pending = max(m.pending-before, 0)
	m.mu.Unlock()
	m.gauge(float64(est))
	return nil
}

// The names, durations and ack tokens calls carry.

// MaxNameLen is the longest queue name or member id.
const MaxNameLen = zkutil.MaxNameLen

// validName checks a queue name or member id (zkutil.CheckName): one path
// element, which cannot escape the root.
func validName(kind, s string) error {
	if err := zkutil.CheckName(s); err != nil {
		return invalidf("%s %v", kind, err)
	}
	return nil
}

func printable(s string) string { return zkutil.Printable(s) }

// An ack token is "<queue>/<lease node name>/<hint>.<mac>" with the hint
// "<deadline ms>.<deliveries>.<size>": any broker can settle it. The hint
// lets an ack before the deadline delete the lease without reading it first
// (the lease name is unique to the delivery, so deleting it by name is
// safe; a lease already released by expiry, or settled, is gone). Past the
// hinted deadline, or without a hint, the broker reads the lease for its
// real deadline, which ExtendLease may have moved.
//
// The mac is an HMAC-SHA256 (truncated to 128 bits, base64url) of the
// queue, lease and hint under a key all brokers share (tokenKeyNode), so
// only a broker can have written the hint: a token whose mac is missing or
// wrong is settled the safe way, by reading the lease, and an edited hint
// can never ack an expired lease. "<queue>/<lease>" alone is a valid token.
type ackToken struct {
	queue, lease string
	deadline     time.Time // zero without a hint
	deliveries   int
	size         int
	hint         string // "<deadline ms>.<deliveries>.<size>" as sent
	mac          string // as sent; empty when missing
}

// macLen is the length of a token's mac in bytes, before base64.
const macLen = 16

func makeToken(s *tokenSigner, queue string, l zkqueue.Lease) string {
	b := make([]byte, 0, len(queue)+len(l.Token)+64)
	b = append(b, queue...)
	b = append(b, '/')
	b = append(b, l.Token...)
	b = append(b, '/')
	b = strconv.AppendInt(b, l.Deadline.UnixMilli(), 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(l.Deliveries), 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(len(l.Payload)), 10)
	b = append(b, '.')
	return string(s.appendMAC(b, b[:len(b)-1]))
}

// tokenSigner computes ack tokens' macs under the root's key. Every ack
// and every at-least-once delivery takes one, so the keyed hashes are
// pooled rather than set up per call.
type tokenSigner struct {
	pool sync.Pool // of hash.Hash keyed with the token key
}

func newTokenSigner(key []byte) *tokenSigner {
	key = bytes.Clone(key)
	return &tokenSigner{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// appendMAC appends the base64url mac of body to dst.
func (s *tokenSigner) appendMAC(dst, body []byte) []byte {
	h := s.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(body)
	var sum [sha256.Size]byte
	mac := h.Sum(sum[:0])[:macLen]
	s.pool.Put(h)
	return base64.RawURLEncoding.AppendEncode(dst, mac)
}

// trusted reports whether the token's hint was written by a broker holding
// the signer's key.
func (t ackToken) trusted(s *tokenSigner) bool {
	if t.deadline.IsZero() || t.mac == "" {
		return false
	}
	var buf [256]byte
	body := append(append(append(append(append(buf[:0], t.queue...), '/'), t.lease...), '/'), t.hint...)
	want := s.appendMAC(body[len(body):], body)
	return hmac.Equal([]byte(t.mac), want)
}

// errMalformedAck answers every malformed ack token.
var errMalformedAck = invalidf("malformed ack token")

func parseToken(tok string) (ackToken, error) {
	// Cut rather than Split: every ack parses one, and the parts are
	// substrings of tok.
	queue, rest, _ := strings.Cut(tok, "/")
	lease, hint, hinted := strings.Cut(rest, "/")
	if validName("queue", queue) != nil || strings.Contains(hint, "/") {
		return ackToken{}, errMalformedAck
	}
	if _, ok := zkqueue.ParseLeaseName(lease); !ok {
		return ackToken{}, errMalformedAck
	}
	t := ackToken{queue: queue, lease: lease}
	if !hinted {
		return t, nil
	}
	msText, rest, ok1 := strings.Cut(hint, ".")
	dText, rest, ok2 := strings.Cut(rest, ".")
	sizeText, mac, _ := strings.Cut(rest, ".")
	ms, err1 := strconv.ParseInt(msText, 10, 64)
	deliveries, err2 := strconv.Atoi(dText)
	size, err3 := strconv.Atoi(sizeText)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || err3 != nil || ms <= 0 || strings.Contains(mac, ".") {
		return ackToken{}, errMalformedAck
	}
	t.deadline, t.deliveries, t.size = time.UnixMilli(ms), deliveries, size
	t.hint, t.mac = hint[:len(msText)+len(dText)+len(sizeText)+2], mac
	return t, nil
}

// tokenKeyNode is the name of the root's child that holds the key signing
// ack tokens (zkutil.LoadSecret): random bytes written by the first broker
// to start under a root, read by every broker, never by anyone else
// (zkutil.PrivateACL).
const tokenKeyNode = layout.TokenKey

// clampDuration returns d, the request's field name, within [lo, hi], or
// def when d is zero.
func clampDuration(name string, d, def, lo, hi time.Duration) (time.Duration, error) {
	if d == 0 {
		return def, nil
	}
	if d < lo || d > hi {
		return 0, invalidf("%s %v out of range [%v, %v]", name, d, lo, hi)
	}
	return d, nil
}
