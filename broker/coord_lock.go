package broker

import (
	"context"
	"errors"
	"io"
	"path"
	"time"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/lock"
)

// lockServer serves qbroker.v1.Lock (api/coord.proto) with the lock
// recipe's Mutex.
type lockServer struct {
	pb.UnimplementedLockServer
	b *Broker
}

var _ pb.LockServer = lockServer{}

// lockPathOf checks a lock's name and returns its node.
func (s lockServer) lockPathOf(name string) (string, error) {
	b := s.b
	if err := validName("lock name", name); err != nil {
		return "", err
	}
	return b.root.Lock(name)
}

// Lock implements pb.LockServer. The contender is a node of the broker's
// primary session (a Mutex per stream; one session may run many). The
// lock is held until the client releases it or leaves, the broker shuts
// down, or it is lost; the handler then unlocks.
func (s lockServer) Lock(stream pb.Lock_LockServer) error {
	b := s.b
	ctx, end, err := b.openStream(stream.Context())
	if err != nil {
		return err
	}
	defer end()
	// The receiver's ended is the lock's release: the client sent
	// unlock, half-closed or left, or the stream's context ended.
	rx := newReceiver(b, ctx, stream.Recv, (*pb.LockRequest).GetUnlock)
	defer rx.close()
	first, err := firstRequest(ctx, b, rx, "lock request")
	if errors.Is(err, io.EOF) || err != nil && rx.failed() {
		return nil
	}
	if err != nil {
		return err
	}
	rx.close() // after the first request, only the release matters
	p, err := s.lockPathOf(first.GetName())
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
	if first.GetUnlock() {
		return nil // released before asking
	}
	owner := b.gate.coordOwner(ctx)
	if err := b.zkmem.admitNode(len(owner)+len(first.GetValue()), "this lock request"); err != nil {
		return b.fail(err)
	}
	m, err := lock.NewMutex(b.conn, p, lock.WithValue(first.GetValue()), lock.WithOwner(owner),
		lock.WithLogger(b.log), lock.WithACL(b.acl), lock.WithDelay(delay))
	if err != nil {
		return b.fail(err)
	}
	defer m.Close()
	start := time.Now()
	g, err := m.Lock(rx.ended)
	if err != nil {
		if rx.ended.Err() != nil {
			return b.streamEnd() // released or gone while waiting
		}
		return b.fail(err)
	}
	b.metrics.lockWait.Observe(time.Since(start).Seconds())
	return s.holdLock(ctx, stream, rx, first.GetName(), g)
}

// holdLock keeps the grant g for the client (holdStream): the grant is
// unlocked in every case, abandoned (Grant.Abandon) when the client left
// without its unlock.
func (s lockServer) holdLock(ctx context.Context, stream pb.Lock_LockServer, rx *receiver[*pb.LockRequest], name string, g *lock.Grant) error {
	b := s.b
	key, token := path.Base(g.Key()), g.Token()
	b.metrics.locksHeld.Inc()
	b.ev.emitCoord(events.LockGranted, name, "", key, token)
	defer func() {
		b.metrics.locksHeld.Dec()
		b.ev.emitCoord(events.LockReleased, name, "", key, token)
	}()
	event := func(t pb.LockEvent_Type) *pb.LockEvent { return &pb.LockEvent{Type: t, Key: key, Token: token} }
	return holdStream(b, ctx, rx, stream.Send, g, holdSpec[*pb.LockEvent]{
		service: "lock", kind: "lock", verb: "unlock", name: name, errLost: errLockLost,
		release: g.Unlock, abandon: g.Abandon,
		granted:         event(pb.LockEvent_TYPE_GRANTED),
		revokeRequested: event(pb.LockEvent_TYPE_REVOKE_REQUESTED),
		lost:            event(pb.LockEvent_TYPE_LOST),
	})
}

// Unlock implements pb.LockServer.
func (s lockServer) Unlock(ctx context.Context, req *pb.UnlockRequest) (*pb.UnlockResponse, error) {
	b := s.b
	p, err := s.lockPathOf(req.GetName())
	var key string
	if err == nil {
		key, err = keyPath(p, req.GetKey(), "lock-")
	}
	if err == nil && req.GetToken() == 0 {
		err = invalidf("token is required")
	}
	if err != nil {
		return nil, b.fail(err)
	}
	var opts []lock.KeyOption
	own, id := b.gate.ownOnly(ctx, ActLockAdmin, req.GetName())
	if own {
		opts = append(opts, lock.IfOwner(id.Name))
	}
	err = lock.UnlockKey(ctx, b.conn, key, req.GetToken(), opts...)
	if err != nil {
		return nil, b.fail(ofCaller(id, ActLockAdmin, "lock", req.GetName(), err))
	}
	return &pb.UnlockResponse{}, nil
}

// Revoke implements pb.LockServer.
func (s lockServer) Revoke(ctx context.Context, req *pb.RevokeRequest) (*pb.RevokeResponse, error) {
	b := s.b
	p, err := s.lockPathOf(req.GetName())
	if err != nil {
		return nil, b.fail(err)
	}
	// Without lock.admin only the caller's own grant may be asked, so
	// the holder's key and token, which Unlock takes, go back only to
	// its own identity or to an admin of the lock.
	var opts []lock.KeyOption
	own, id := b.gate.ownOnly(ctx, ActLockAdmin, req.GetName())
	if own {
		opts = append(opts, lock.IfOwner(id.Name))
	}
	h, err := lock.Revoke(ctx, b.conn, p, opts...)
	if err != nil {
		return nil, b.fail(ofCaller(id, ActLockAdmin, "lock", req.GetName(), err))
	}
	b.metrics.lockRevocations.Inc()
	return &pb.RevokeResponse{Holder: &pb.LockHolder{Key: path.Base(h.Key), Value: h.Value, Token: h.Token}}, nil
}
