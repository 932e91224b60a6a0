package broker

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

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
func (b *Broker) authorize(ctx context.Context, method string) (context.Context, Identity, methodAuth, error) {
	if b.cfg.Auth == nil {
		return ctx, Identity{}, methodAuth{}, nil
	}
	ma, ok := authFor(method)
	if ma.public {
		return ctx, Identity{}, ma, nil
	}
	id, err := b.cfg.Auth.authenticate(ctx)
	if err != nil {
		b.warnings.warn(b.log, "auth:unauthenticated", "call refused: unauthenticated", "method", method, "peer", peerAddr(ctx), "err", status.Convert(err).Message())
		return ctx, Identity{}, ma, err
	}
	if !ok {
		return ctx, id, ma, status.Errorf(codes.PermissionDenied, "%s may not call %s", id.Name, method)
	}
	return context.WithValue(ctx, identityKey{}, id), id, ma, nil
}

// check returns PermissionDenied, naming the action and the name, unless
// id may do all that msg needs.
func (b *Broker) check(ctx context.Context, id Identity, ma methodAuth, method string, msg any) error {
	if b.cfg.Auth == nil || ma.public || ma.needs == nil { // no Auth: ma is empty
		return nil
	}
	rules := b.cfg.Auth.rules.Get()
	for _, a := range ma.needs(msg) {
		if !rules.Allowed(id.Name, a.action, a.name) {
			b.warnings.warn(b.log, "auth:denied", "call refused: permission denied", "method", method,
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
func (b *Broker) callUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	ctx, id, ma, err := b.authorize(ctx, info.FullMethod)
	if err == nil {
		err = b.check(ctx, id, ma, info.FullMethod, req)
	}
	if err == nil {
		err = b.enterConn(ctx)
	}
	var resp any
	if err == nil {
		resp, err = h(ctx, req)
	}
	if _, audited := auditedMethods[info.FullMethod]; audited || err != nil {
		b.audit(ctx, info.FullMethod, req, id, err)
	}
	b.logCall(ctx, info.FullMethod, start, err)
	return resp, err
}

// callStream is callUnary for streams: it authenticates them and, when
// Auth is set, authorizes each request they receive (a Consume stream's
// subscription and settlements, a Lock stream's lock, ...) and re-checks
// the stream while it is open (authstreams.go).
func (b *Broker) callStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	err := b.authStream(srv, ss, info, h)
	b.logCall(ss.Context(), info.FullMethod, start, err)
	return err
}

func (b *Broker) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, id, ma, err := b.authorize(ss.Context(), info.FullMethod)
	if err != nil {
		b.audit(ctx, info.FullMethod, nil, id, err)
		return err
	}
	if b.cfg.Auth == nil || ma.public {
		if err := b.enterConn(ctx); err != nil {
			return err
		}
		return h(srv, ss)
	}
	if err := b.enterConn(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := &checkedStream{ServerStream: ss, ctx: ctx, cancel: cancel}
	w.check = func(m any) error {
		if err := b.check(ctx, id, ma, info.FullMethod, m); err != nil {
			b.audit(ctx, info.FullMethod, m, id, err)
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
	b.authStreams.add(st)
	defer b.authStreams.remove(st)
	err = h(srv, w)
	if d := w.deniedErr(); d != nil {
		return d // the handler saw a failed receive, or its context end
	}
	return err
}

// enterConn admits the call's connection (limits.go's admitConn) unless
// it is settled already.
func (b *Broker) enterConn(ctx context.Context) error {
	cn, _ := ctx.Value(connKey{}).(*conn)
	if cn != nil && cn.settled.Load() {
		return nil
	}
	return b.admitConn(ctx, cn)
}

// logCall logs a call at debug.
func (b *Broker) logCall(ctx context.Context, method string, start time.Time, err error) {
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
