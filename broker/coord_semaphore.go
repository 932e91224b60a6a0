package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/semaphore"
)

// semaphoreServer serves qbroker.v1.Semaphore (api/coord.proto) with the
// semaphore recipe, as lockServer serves locks:
//
//	/<root>/semaphores/<name>                      data: the limit
//	/<root>/semaphores/<name>/queue/wait-<nonce>-NNNNNNNNNN   EPHEMERAL_SEQUENTIAL waiters
//	/<root>/semaphores/<name>/leases/lease-<n>-<nonce>        EPHEMERAL leases
//	/<root>/semaphores/<name>/leases/delay-lease-<n>-<nonce>  lock-delay markers (package lockdelay)
//
// A lease is a node of the broker's primary session, held while the
// client's Acquire stream is open. Keys on the wire are the leases' names.
type semaphoreServer struct {
	pb.UnimplementedSemaphoreServer
	b *Broker
}

var _ pb.SemaphoreServer = semaphoreServer{}

// Errors of the Semaphore service; codeOf maps them.
var (
	errPermitsLost   = errors.New("semaphore lease lost")
	errLimitMismatch = errors.New("limit mismatch")
	errNoSemaphore   = errors.New("no such semaphore")
)

// semaphoreMetrics are the Semaphore service's metrics.
type semaphoreMetrics struct {
	wait        prometheus.Histogram
	held        prometheus.Gauge
	revocations prometheus.Counter
}

func newSemaphoreMetrics(reg prometheus.Registerer) semaphoreMetrics {
	m := semaphoreMetrics{
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "qbroker_semaphore_wait_seconds",
			Help:    "Time from a semaphore Acquire stream's request to its grant.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60, 600}}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_semaphore_permits_held",
			Help: "Semaphore permits held by this broker's Acquire streams."}),
		revocations: prometheus.NewCounter(prometheus.CounterOpts{Name: "qbroker_semaphore_revocations_total",
			Help: "Semaphore revocation requests made through this broker (holders asked by Revoke calls)."}),
	}
	if reg != nil {
		reg.MustRegister(m.wait, m.held, m.revocations)
	}
	return m
}

// semaphorePathOf checks a semaphore's name and returns its node.
func (s semaphoreServer) semaphorePathOf(name string) (string, error) {
	b := s.b
	if err := validName("semaphore name", name); err != nil {
		return "", err
	}
	return b.root.Semaphore(name)
}

// checkLimit refuses a limit out of 1..semaphore.MaxLimit.
func checkLimit(limit int32) error {
	if limit < 1 || limit > semaphore.MaxLimit {
		return invalidf("limit %d: want 1 to %d", limit, semaphore.MaxLimit)
	}
	return nil
}

// Acquire implements pb.SemaphoreServer. The waiter and the lease are
// nodes of the broker's primary session (a Semaphore per stream). The
// permits are held until the client releases them or leaves, the broker
// shuts down, or the lease is lost; the handler then releases.
func (s semaphoreServer) Acquire(stream pb.Semaphore_AcquireServer) error {
	b := s.b
	ctx, end, err := b.openStream(stream.Context())
	if err != nil {
		return err
	}
	defer end()
	// The receiver's ended is the release: the client sent release,
	// half-closed or left, or the stream's context ended.
	rx := newReceiver(b, ctx, stream.Recv, (*pb.SemaphoreAcquireRequest).GetRelease)
	defer rx.close()
	first, err := firstRequest(ctx, b, rx, "acquire request")
	if errors.Is(err, io.EOF) || err != nil && rx.failed() {
		return nil
	}
	if err != nil {
		return err
	}
	rx.close() // after the first request, only the release matters
	name, limit, permits := first.GetName(), first.GetLimit(), first.GetPermits()
	if permits == 0 {
		permits = 1
	}
	p, err := s.semaphorePathOf(name)
	if err == nil {
		err = checkLimit(limit)
	}
	if err == nil && (permits < 1 || permits > limit) {
		err = invalidf("permits %d: want 1 to the limit, %d", permits, limit)
	}
	if err == nil {
		err = checkValue(first.GetValue())
	}
	var delay time.Duration
	if err == nil {
		delay, err = lockDelayOf(first.GetLockDelay())
	}
	if err != nil {
		return b.fail(err)
	}
	if first.GetRelease() {
		return nil // released before asking
	}
	owner := b.gate.coordOwner(ctx)
	if err := b.zkmem.admitNode(len(owner)+len(first.GetValue()), "this acquire request"); err != nil {
		return b.fail(err)
	}
	sem, err := semaphore.New(b.conn, p, int(limit), semaphore.WithValue(first.GetValue()), semaphore.WithOwner(owner),
		semaphore.WithLogger(b.log), semaphore.WithACL(b.acl), semaphore.WithDelay(delay))
	if err != nil {
		return b.fail(err)
	}
	defer sem.Close()
	stored, err := sem.Limit(ctx)
	if err != nil {
		return b.fail(err)
	}
	if stored != int(limit) {
		return b.fail(fmt.Errorf("%w: semaphore %q has limit %d, not %d (SetLimit changes it)",
			errLimitMismatch, printable(name), stored, limit))
	}
	start := time.Now()
	l, err := sem.Acquire(rx.ended, int(permits))
	if err != nil {
		if rx.ended.Err() != nil {
			return b.streamEnd() // released or gone while waiting
		}
		return b.fail(err)
	}
	b.metrics.sem.wait.Observe(time.Since(start).Seconds())
	return s.holdPermits(ctx, stream, rx, name, l)
}

// holdPermits keeps the lease l for the client (holdStream): the lease
// is released in every case, abandoned (Lease.Abandon) when the client
// left without its release.
func (s semaphoreServer) holdPermits(ctx context.Context, stream pb.Semaphore_AcquireServer, rx *receiver[*pb.SemaphoreAcquireRequest],
	name string, l *semaphore.Lease) error {
	b := s.b
	key, token, permits := path.Base(l.Key()), l.Token(), int32(l.Permits())
	b.metrics.sem.held.Add(float64(permits))
	b.ev.emitSemaphore(events.SemaphoreGranted, name, key, token)
	defer func() {
		b.metrics.sem.held.Sub(float64(permits))
		b.ev.emitSemaphore(events.SemaphoreReleased, name, key, token)
	}()
	event := func(t pb.SemaphoreEvent_Type) *pb.SemaphoreEvent {
		return &pb.SemaphoreEvent{Type: t, Key: key, Token: token, Permits: permits}
	}
	return holdStream(b, ctx, rx, stream.Send, l, holdSpec[*pb.SemaphoreEvent]{
		service: "semaphore", kind: "semaphore lease", verb: "release", name: name, errLost: errPermitsLost,
		release: l.Release, abandon: l.Abandon,
		granted:         event(pb.SemaphoreEvent_TYPE_GRANTED),
		revokeRequested: event(pb.SemaphoreEvent_TYPE_REVOKE_REQUESTED),
		lost:            event(pb.SemaphoreEvent_TYPE_LOST),
	})
}

// leaseKeyPath checks a lease's key and returns its node.
func leaseKeyPath(p, key string) (string, error) {
	return keyPath(p+"/leases", key, "lease-")
}

// Release implements pb.SemaphoreServer.
func (s semaphoreServer) Release(ctx context.Context, req *pb.SemaphoreReleaseRequest) (*pb.SemaphoreReleaseResponse, error) {
	b := s.b
	p, err := s.semaphorePathOf(req.GetName())
	var key string
	if err == nil {
		key, err = leaseKeyPath(p, req.GetKey())
	}
	if err == nil && req.GetToken() == 0 {
		err = invalidf("token is required")
	}
	if err != nil {
		return nil, b.fail(err)
	}
	var opts []semaphore.KeyOption
	own, id := b.gate.ownOnly(ctx, ActSemaphoreAdmin, req.GetName())
	if own {
		opts = append(opts, semaphore.IfOwner(id.Name))
	}
	err = semaphore.ReleaseKey(ctx, b.conn, key, req.GetToken(), opts...)
	if err != nil {
		return nil, b.fail(ofCaller(id, ActSemaphoreAdmin, "semaphore", req.GetName(), err))
	}
	return &pb.SemaphoreReleaseResponse{}, nil
}

// Revoke implements pb.SemaphoreServer. Without semaphore.admin only the
// caller's own leases may be asked, so keys and tokens go back only to
// their own identity or to an admin.
func (s semaphoreServer) Revoke(ctx context.Context, req *pb.SemaphoreRevokeRequest) (*pb.SemaphoreRevokeResponse, error) {
	b := s.b
	p, err := s.semaphorePathOf(req.GetName())
	var key string
	if err == nil && req.GetKey() != "" {
		key, err = leaseKeyPath(p, req.GetKey())
	}
	if err != nil {
		return nil, b.fail(err)
	}
	var opts []semaphore.KeyOption
	own, id := b.gate.ownOnly(ctx, ActSemaphoreAdmin, req.GetName())
	if own {
		opts = append(opts, semaphore.IfOwner(id.Name))
	}
	var hs []semaphore.Holder
	if key == "" {
		hs, err = semaphore.Revoke(ctx, b.conn, p, opts...)
	} else {
		var h semaphore.Holder
		h, err = semaphore.RevokeKey(ctx, b.conn, key, opts...)
		hs = []semaphore.Holder{h}
	}
	if err != nil {
		return nil, b.fail(ofCaller(id, ActSemaphoreAdmin, "semaphore", req.GetName(), err))
	}
	b.metrics.sem.revocations.Add(float64(len(hs)))
	resp := &pb.SemaphoreRevokeResponse{}
	for _, h := range hs {
		resp.Holders = append(resp.Holders, &pb.SemaphoreHolder{Key: path.Base(h.Key), Value: h.Value, Token: h.Token,
			Permits: int32(h.Permits)})
	}
	return resp, nil
}

// SetLimit implements pb.SemaphoreServer.
func (s semaphoreServer) SetLimit(ctx context.Context, req *pb.SemaphoreSetLimitRequest) (*pb.SemaphoreSetLimitResponse, error) {
	b := s.b
	p, err := s.semaphorePathOf(req.GetName())
	if err == nil {
		err = checkLimit(req.GetLimit())
	}
	if err != nil {
		return nil, b.fail(err)
	}
	err = semaphore.SetLimit(ctx, b.conn, p, int(req.GetLimit()))
	if errors.Is(err, zk.ErrNoNode) {
		err = fmt.Errorf("%w: %q", errNoSemaphore, printable(req.GetName()))
	}
	if err != nil {
		return nil, b.fail(err)
	}
	return &pb.SemaphoreSetLimitResponse{}, nil
}

// emitSemaphore emits a semaphore event for the lease key (a name) and
// token of the semaphore name.
func (em *emitter) emitSemaphore(kind events.Kind, name, key string, token int64) {
	b := em.b
	if em.sink == nil {
		return
	}
	em.sink.Emit(events.Event{
		ID:        fmt.Sprintf("semaphore/%s/%s/%d", name, kind, token),
		Kind:      kind,
		Semaphore: name,
		Key:       key,
		Token:     token,
		Broker:    b.cfg.ID,
		Time:      time.Now(),
	})
}
