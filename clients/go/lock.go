package qbroker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// ErrLost: a lock, a leadership or a double barrier participation ended
// without Unlock, Resign, Leave or Close: it was
// released by key, its node deleted, the broker's ZooKeeper session
// expired, or the stream to the broker broke (the broker died, or the
// connection to it did). The error also matches the stream's cause
// (ErrAborted, ErrUnavailable, ...).
var ErrLost = errors.New("qbroker: lost")

// LockOption configures Lock.
type LockOption func(*lockOptions)

type lockOptions struct {
	value []byte
	delay time.Duration
}

// LockValue sets the holder's value, which Revoke returns (at most 64
// KiB): who holds the lock, for operators.
func LockValue(v []byte) LockOption { return func(o *lockOptions) { o.value = v } }

// LockDelay sets the grant's lock-delay (at most a minute; 0, the
// default, is none): when the grant is lost without Unlock (this process
// died or was cut off from the broker, or the broker's ZooKeeper session
// ended), nobody else gets the lock until d has passed, so a holder that
// was only cut off can notice (Lost) and stop first. Unlock and UnlockKey
// free the lock at once.
func LockDelay(d time.Duration) LockOption { return func(o *lockOptions) { o.delay = d } }

// Lock is one holding of a distributed lock (the broker's Lock service):
// held while its stream to the broker is open, released by Unlock, or by
// the broker when the stream ends (this process died) or when the
// broker's ZooKeeper session ends (the broker died). A Lock is safe for
// concurrent use.
type Lock struct {
	hold   // the stream's holding: name, Lost, Revoked, Err
	key    string
	token  int64
	stream pb.Lock_LockClient
}

// Lock takes the lock name ([A-Za-z0-9._-]{1,200}), waiting for it until
// ctx ends. ctx bounds the wait only: once granted, the lock is held until
// Unlock or its loss (Lost). Errors: ErrInvalidArgument (bad name or
// value), ErrResourceExhausted (the broker's stream limit),
// ErrUnavailable, the context's error.
func (c *Client) Lock(ctx context.Context, name string, opts ...LockOption) (*Lock, error) {
	var o lockOptions
	for _, opt := range opts {
		opt(&o)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s, err := c.locks.Lock(sctx)
	if err == nil {
		req := &pb.LockRequest{Name: name, Value: o.value}
		if o.delay != 0 {
			req.LockDelay = durationpb.New(o.delay)
		}
		err = s.Send(req)
	}
	var ev *pb.LockEvent
	if err == nil {
		ev, err = recvFirst(ctx, cancel, s.Recv)
	}
	if err == nil && ev.GetType() != pb.LockEvent_TYPE_GRANTED {
		err = fmt.Errorf("unexpected first event %v", ev.GetType())
	}
	if err != nil {
		cancel()
		return nil, errorf("qbroker: lock %s: %w", name, convErr(err))
	}
	l := &Lock{hold: newHold("lock", name, cancel), key: ev.GetKey(), token: ev.GetToken(), stream: s}
	go l.run(func() (bool, error) {
		ev, err := s.Recv()
		return ev.GetType() == pb.LockEvent_TYPE_REVOKE_REQUESTED, err
	})
	return l, nil
}

// recvFirst waits for a stream's first message or ctx; on ctx's end it
// cancels the stream (cancel) and returns ctx's error.
func recvFirst[T any](ctx context.Context, cancel context.CancelFunc, recv func() (T, error)) (T, error) {
	type result struct {
		m   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := recv()
		ch <- result{m, err}
	}()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-ctx.Done():
		cancel()
		<-ch // the receiver returns once the stream is cancelled
		var zero T
		return zero, ctx.Err()
	}
}

// Name returns the lock's name.
func (l *Lock) Name() string { return l.name }

// Key returns the grant's key (its node's name): with Token, what
// Client.UnlockKey needs.
func (l *Lock) Key() string { return l.key }

// Token returns the grant's fencing token: greater for every later grant
// of the lock. Pass it to the resources written under the lock, so they
// can refuse a holder whose lock was lost while it paused.
func (l *Lock) Token() int64 { return l.token }

// Lost returns a channel closed when the holding ends: at Unlock, or at
// its loss (Err tells which). Stop acting under the lock when it closes.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Revoked returns a channel closed when someone asked the holder to
// release the lock (Client.Revoke). The lock is still held: releasing is
// the holder's decision.
func (l *Lock) Revoked() <-chan struct{} { return l.revoked }

// Err returns nil while the lock is held and after Unlock; once it was
// lost, an error matching ErrLost and the cause.
func (l *Lock) Err() error { return l.loss() }

// Unlock releases the lock and waits, until ctx ends, for the broker to
// confirm. It is idempotent; when ctx ends first it closes the stream,
// which releases the lock as well. It returns the loss's error when the
// lock had been lost before (see Err).
func (l *Lock) Unlock(ctx context.Context) error {
	return l.release(ctx, func() {
		_ = l.stream.Send(&pb.LockRequest{Unlock: true})
		_ = l.stream.CloseSend()
	})
}

// UnlockKey releases the grant key with token of the lock name, whichever
// broker serves its holder: for a holder that cannot release it itself.
// The holder's Lost closes. Errors: ErrFailedPrecondition (that key and
// token do not hold the lock), ErrInvalidArgument, ErrUnavailable.
func (c *Client) UnlockKey(ctx context.Context, name, key string, token int64) error {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	_, err := c.locks.Unlock(ctx, &pb.UnlockRequest{Name: name, Key: key, Token: token})
	if err != nil {
		return errorf("qbroker: unlock %s %s: %w", name, key, convErr(err))
	}
	return nil
}

// LockHolder describes the holder of a lock.
type LockHolder struct {
	Key   string
	Value []byte
	Token int64
}

// Revoke asks the holder of the lock name to release it (its Revoked
// closes) and returns it. Errors: ErrFailedPrecondition (nobody holds
// it), ErrInvalidArgument, ErrUnavailable.
func (c *Client) Revoke(ctx context.Context, name string) (LockHolder, error) {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	r, err := c.locks.Revoke(ctx, &pb.RevokeRequest{Name: name})
	if err != nil {
		return LockHolder{}, errorf("qbroker: revoke %s: %w", name, convErr(err))
	}
	h := r.GetHolder()
	return LockHolder{Key: h.GetKey(), Value: h.GetValue(), Token: h.GetToken()}, nil
}
