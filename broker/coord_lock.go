package broker

import (
	"context"
	"errors"
	"fmt"
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
func (b *Broker) lockPathOf(name string) (string, error) {
	if err := validName("lock name", name); err != nil {
		return "", err
	}
	return b.locksPath() + "/" + name, nil
}

// lockReceiver reads a Lock stream's requests on a goroutine of its own
// (see stream.go): the first request, then nothing but the client's wish
// to release. released ends when the client sends unlock, half-closes or
// leaves, or the stream's context ends. The goroutine ends then, or once
// its Recv fails after the handler returned.
type lockReceiver struct {
	first    chan *pb.LockRequest // the first request; closed without one, err set
	err      error
	released context.Context
}

func (b *Broker) newLockReceiver(ctx context.Context, stream pb.Lock_LockServer) *lockReceiver {
	released, release := context.WithCancel(ctx)
	r := &lockReceiver{first: make(chan *pb.LockRequest, 1), released: released}
	b.wg.Add(1) // within the stream's own count, so never from zero
	go func() {
		defer b.wg.Done()
		defer release()
		req, err := stream.Recv()
		if err != nil {
			r.err = err
			close(r.first)
			return
		}
		r.first <- req
		for !req.GetUnlock() {
			if req, err = stream.Recv(); err != nil {
				return
			}
		}
	}()
	return r
}

// firstRequest waits up to FirstMessageTimeout for the request naming the
// lock, as Consume does for its subscription. io.EOF: the client left
// before (or the broker is closing and the stream ends quietly).
func (b *Broker) firstLockRequest(ctx context.Context, rx *lockReceiver) (*pb.LockRequest, error) {
	t := time.NewTimer(b.cfg.FirstMessageTimeout)
	defer t.Stop()
	select {
	case req, ok := <-rx.first:
		if !ok {
			return nil, io.EOF
		}
		return req, nil
	case <-t.C:
		b.refuseStream(reasonNoSubscribe)
		return nil, b.fail(invalidf("no lock request within %v", b.cfg.FirstMessageTimeout))
	case <-ctx.Done():
		if err := b.streamEnd(); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}
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
	rx := b.newLockReceiver(ctx, stream)
	first, err := b.firstLockRequest(ctx, rx)
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return err
	}
	p, err := b.lockPathOf(first.GetName())
	if err == nil {
		err = checkValue(first.GetValue())
	}
	if err != nil {
		return b.fail(err)
	}
	if first.GetUnlock() {
		return nil // released before asking
	}
	owner := b.coordOwner(ctx)
	if err := b.zkmem.admitNode(len(owner)+len(first.GetValue()), "this lock request"); err != nil {
		return b.fail(err)
	}
	m, err := lock.NewMutex(b.conn, p, lock.WithValue(first.GetValue()), lock.WithOwner(owner),
		lock.WithLogger(b.log), lock.WithACL(b.acl))
	if err != nil {
		return b.fail(err)
	}
	defer m.Close()
	start := time.Now()
	g, err := m.Lock(rx.released)
	if err != nil {
		if rx.released.Err() != nil {
			return b.streamEnd() // released or gone while waiting
		}
		return b.fail(err)
	}
	b.metrics.lockWait.Observe(time.Since(start).Seconds())
	return b.holdLock(ctx, stream, rx, first.GetName(), g)
}

// holdLock tells the client of its grant and of revocation requests
// until the client releases it (released), the stream ends, or the grant
// is lost (LOST, then Aborted). It unlocks in every case.
func (b *Broker) holdLock(ctx context.Context, stream pb.Lock_LockServer, rx *lockReceiver, name string, g *lock.Grant) error {
	key, token := path.Base(g.Key()), g.Token()
	b.metrics.locksHeld.Inc()
	b.emitCoord(events.LockGranted, name, "", key, token)
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		if err := g.Unlock(uctx); err != nil {
			// The grant goes on deleting its node until the session ends.
			b.log.Warn("lock: unlock failed; retried until the session ends", "lock", name, "znode", g.Key(), "err", err)
		}
		b.metrics.locksHeld.Dec()
		b.emitCoord(events.LockReleased, name, "", key, token)
	}()
	out := newOutbox(b, stream.Send)
	defer out.close()
	event := func(t pb.LockEvent_Type) error {
		return out.send(ctx, &pb.LockEvent{Type: t, Key: key, Token: token})
	}
	if err := event(pb.LockEvent_TYPE_GRANTED); err != nil {
		return b.streamEnd()
	}
	revoked := g.Revoked()
	for {
		select {
		case <-g.Lost():
			_ = event(pb.LockEvent_TYPE_LOST)
			b.log.Debug("lock lost", "lock", name, "err", g.Err())
			return b.fail(fmt.Errorf("%w: %s", errLockLost, name))
		case <-revoked:
			revoked = nil
			if err := event(pb.LockEvent_TYPE_REVOKE_REQUESTED); err != nil {
				return b.streamEnd()
			}
		case <-rx.released.Done():
			return b.streamEnd()
		}
	}
}

// Unlock implements pb.LockServer.
func (s lockServer) Unlock(ctx context.Context, req *pb.UnlockRequest) (*pb.UnlockResponse, error) {
	b := s.b
	p, err := b.lockPathOf(req.GetName())
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
	own, id := b.ownOnly(ctx, ActLockAdmin, req.GetName())
	if own {
		opts = append(opts, lock.IfOwner(id.Name))
	}
	err = lock.UnlockKey(ctx, b.conn, key, req.GetToken(), opts...)
	if errors.Is(err, lock.ErrNotOwner) {
		return nil, notOwned(id, ActLockAdmin, "lock", req.GetName())
	}
	if err != nil {
		return nil, b.fail(err)
	}
	return &pb.UnlockResponse{}, nil
}

// Revoke implements pb.LockServer.
func (s lockServer) Revoke(ctx context.Context, req *pb.RevokeRequest) (*pb.RevokeResponse, error) {
	b := s.b
	p, err := b.lockPathOf(req.GetName())
	if err != nil {
		return nil, b.fail(err)
	}
	// Without lock.admin only the caller's own grant may be asked, so
	// the holder's key and token, which Unlock takes, go back only to
	// its own identity or to an admin of the lock.
	var opts []lock.KeyOption
	own, id := b.ownOnly(ctx, ActLockAdmin, req.GetName())
	if own {
		opts = append(opts, lock.IfOwner(id.Name))
	}
	h, err := lock.Revoke(ctx, b.conn, p, opts...)
	if errors.Is(err, lock.ErrNotOwner) {
		return nil, notOwned(id, ActLockAdmin, "lock", req.GetName())
	}
	if err != nil {
		return nil, b.fail(err)
	}
	b.metrics.lockRevocations.Inc()
	return &pb.RevokeResponse{Holder: &pb.LockHolder{Key: path.Base(h.Key), Value: h.Value, Token: h.Token}}, nil
}
