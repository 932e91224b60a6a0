package qbroker

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// AcquireOption configures Acquire.
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	value   []byte
	permits int
	delay   time.Duration
}

// PermitValue sets the holder's value, which RevokePermits returns (at
// most 64 KiB): who holds the permits, for operators.
func PermitValue(v []byte) AcquireOption { return func(o *acquireOptions) { o.value = v } }

// Permits sets how many permits Acquire takes at once (default 1; at most
// the limit).
func Permits(n int) AcquireOption { return func(o *acquireOptions) { o.permits = n } }

// PermitDelay sets the lease's lock-delay (at most a minute; 0, the
// default, is none): when the lease is lost without Release (this process
// died or was cut off from the broker, or the broker's ZooKeeper session
// ended), its permits stay unavailable to others until d has passed, so
// a holder that was only cut off can notice (Lost) and stop first.
// Release and ReleasePermit free them at once.
func PermitDelay(d time.Duration) AcquireOption { return func(o *acquireOptions) { o.delay = d } }

// Permit is one lease of a counting semaphore's permits (the broker's
// Semaphore service): held while its stream to the broker is open,
// given back by Release, or by the broker when the stream ends (this
// process died) or when the broker's ZooKeeper session ends (the broker
// died). A Permit is safe for concurrent use.
type Permit struct {
	hold    // the stream's lease: name, Lost, Revoked, Err
	key     string
	token   int64
	permits int
	stream  pb.Semaphore_AcquireClient
}

// Acquire takes permits of the semaphore name ([A-Za-z0-9._-]{1,200})
// whose limit is limit (the semaphore is made with it; an existing
// semaphore's limit must be the same), waiting for them until ctx ends.
// ctx bounds the wait only: once granted, the permits are held until
// Release or their loss (Lost). Errors: ErrInvalidArgument (bad name,
// limit, permits or value), ErrFailedPrecondition (the semaphore's limit
// is another), ErrResourceExhausted (the broker's stream limit),
// ErrUnavailable, the context's error.
func (c *Client) Acquire(ctx context.Context, name string, limit int, opts ...AcquireOption) (*Permit, error) {
	o := acquireOptions{permits: 1}
	for _, opt := range opts {
		opt(&o)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s, err := c.sems.Acquire(sctx)
	if err == nil {
		req := &pb.SemaphoreAcquireRequest{Name: name, Limit: clamp32(limit), Permits: clamp32(o.permits), Value: o.value}
		if o.delay != 0 {
			req.LockDelay = durationpb.New(o.delay)
		}
		err = s.Send(req)
	}
	var ev *pb.SemaphoreEvent
	if err == nil {
		ev, err = recvFirst(ctx, cancel, s.Recv)
	}
	if err == nil && ev.GetType() != pb.SemaphoreEvent_TYPE_GRANTED {
		err = fmt.Errorf("unexpected first event %v", ev.GetType())
	}
	if err != nil {
		cancel()
		return nil, errorf("qbroker: acquire %s: %w", name, convErr(err))
	}
	p := &Permit{hold: newHold("semaphore", name, cancel), key: ev.GetKey(), token: ev.GetToken(),
		permits: int(ev.GetPermits()), stream: s}
	go p.run(func() (bool, error) {
		ev, err := s.Recv()
		return ev.GetType() == pb.SemaphoreEvent_TYPE_REVOKE_REQUESTED, err
	})
	return p, nil
}

// clamp32 keeps n in int32's range, so that an out-of-range count is
// refused by the broker rather than wrapped.
func clamp32(n int) int32 {
	switch {
	case n > 1<<31-1:
		return 1<<31 - 1
	case n < -1<<31:
		return -1 << 31
	}
	return int32(n)
}

// Name returns the semaphore's name.
func (p *Permit) Name() string { return p.name }

// Key returns the lease's key (its node's name): with Token, what
// Client.ReleasePermit needs.
func (p *Permit) Key() string { return p.key }

// Token returns the lease's fencing token, from the same space as lock
// and leadership tokens: a ZooKeeper zxid, greater for every later grant.
func (p *Permit) Token() int64 { return p.token }

// Permits returns the number of permits held.
func (p *Permit) Permits() int { return p.permits }

// Lost returns a channel closed when the lease ends: at Release, or at
// its loss (Err tells which). Stop using the permits when it closes.
func (p *Permit) Lost() <-chan struct{} { return p.lost }

// Revoked returns a channel closed when someone asked the holder to give
// its permits back (Client.RevokePermits). They are still held: releasing
// is the holder's decision.
func (p *Permit) Revoked() <-chan struct{} { return p.revoked }

// Err returns nil while the permits are held and after Release; once they
// were lost, an error matching ErrLost and the cause.
func (p *Permit) Err() error { return p.loss() }

// Release gives the permits back and waits, until ctx ends, for the
// broker to confirm. It is idempotent; when ctx ends first it closes the
// stream, which gives them back as well. It returns the loss's error when
// the lease had been lost before (see Err).
func (p *Permit) Release(ctx context.Context) error {
	return p.release(ctx, func() {
		_ = p.stream.Send(&pb.SemaphoreAcquireRequest{Release: true})
		_ = p.stream.CloseSend()
	})
}

// ReleasePermit gives back the lease key with token of the semaphore
// name, whichever broker serves its holder: for a holder that cannot
// release it itself. The holder's Lost closes. Errors:
// ErrFailedPrecondition (that key and token hold no lease),
// ErrInvalidArgument, ErrPermissionDenied (another identity's lease,
// without semaphore.admin), ErrUnavailable.
func (c *Client) ReleasePermit(ctx context.Context, name, key string, token int64) error {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	_, err := c.sems.Release(ctx, &pb.SemaphoreReleaseRequest{Name: name, Key: key, Token: token})
	if err != nil {
		return errorf("qbroker: release %s %s: %w", name, key, convErr(err))
	}
	return nil
}

// PermitHolder describes a lease of a semaphore.
type PermitHolder struct {
	Key     string
	Value   []byte
	Token   int64
	Permits int
}

// RevokePermits asks the holder of the lease key of the semaphore name,
// or with key "" every holder, to give its permits back (their Revoked
// closes) and returns those asked. Errors: ErrFailedPrecondition (nobody
// holds a permit, or key holds none), ErrInvalidArgument,
// ErrPermissionDenied, ErrUnavailable.
func (c *Client) RevokePermits(ctx context.Context, name, key string) ([]PermitHolder, error) {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	r, err := c.sems.Revoke(ctx, &pb.SemaphoreRevokeRequest{Name: name, Key: key})
	if err != nil {
		return nil, errorf("qbroker: revoke %s: %w", name, convErr(err))
	}
	out := make([]PermitHolder, 0, len(r.GetHolders()))
	for _, h := range r.GetHolders() {
		out = append(out, PermitHolder{Key: h.GetKey(), Value: h.GetValue(), Token: h.GetToken(), Permits: int(h.GetPermits())})
	}
	return out, nil
}

// SetSemaphoreLimit changes the limit of the semaphore name at once:
// holders above a lowered limit keep their permits until they release
// them. Errors: ErrNotFound (no such semaphore), ErrInvalidArgument,
// ErrPermissionDenied (semaphore.admin is needed), ErrUnavailable.
func (c *Client) SetSemaphoreLimit(ctx context.Context, name string, limit int) error {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	if _, err := c.sems.SetLimit(ctx, &pb.SemaphoreSetLimitRequest{Name: name, Limit: clamp32(limit)}); err != nil {
		return errorf("qbroker: set limit of %s: %w", name, convErr(err))
	}
	return nil
}
