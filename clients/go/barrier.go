package qbroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// SetBarrier sets the barrier name ([A-Za-z0-9._-]{1,200}) of the
// broker's Barrier service: WaitBarrier then waits until RemoveBarrier.
// Setting a set barrier changes nothing. Errors: ErrInvalidArgument (bad
// name), ErrPermissionDenied (barrier.admin), ErrUnavailable.
func (c *Client) SetBarrier(ctx context.Context, name string) error {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	if _, err := pb.NewBarrierClient(c.conn).Set(ctx, &pb.SetBarrierRequest{Name: name}); err != nil {
		return errorf("qbroker: set barrier %s: %w", name, convErr(err))
	}
	return nil
}

// RemoveBarrier removes the barrier name, releasing every WaitBarrier.
// Removing a barrier that is not set changes nothing. Errors: as
// SetBarrier's.
func (c *Client) RemoveBarrier(ctx context.Context, name string) error {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	if _, err := pb.NewBarrierClient(c.conn).Remove(ctx, &pb.RemoveBarrierRequest{Name: name}); err != nil {
		return errorf("qbroker: remove barrier %s: %w", name, convErr(err))
	}
	return nil
}

// WaitBarrier returns once the barrier name is not set: at once when it is
// not, else when someone removes it. Only ctx bounds the wait (not the
// client's call timeout). Errors: ErrInvalidArgument (bad name),
// ErrPermissionDenied (barrier), ErrResourceExhausted (the broker's stream
// limit), ErrUnavailable (retry), the context's error.
func (c *Client) WaitBarrier(ctx context.Context, name string) error {
	if _, err := pb.NewBarrierClient(c.conn).Wait(ctx, &pb.WaitBarrierRequest{Name: name}); err != nil {
		return errorf("qbroker: wait for barrier %s: %w", name, convErr(err))
	}
	return nil
}

// Participant is one participant of a double barrier (the broker's
// DoubleBarrier service), entered: count participants arrived. It is
// present while its stream to the broker is open; Leave waits for the
// others to leave, Close leaves at once, and a process or broker that
// dies leaves too (the others stop counting it). A Participant is safe
// for concurrent use.
type Participant struct {
	name   string
	key    string
	stream pb.DoubleBarrier_EnterClient
	cancel context.CancelFunc
	done   chan struct{} // closed when the participation ends

	mu      sync.Mutex
	leaving bool // Leave sent leave
	closing bool // Close or a Leave whose ctx ended cancels the stream
	left    bool // the broker sent LEFT
	err     error
}

// EnterBarrier joins the double barrier name as one of count participants
// (1 to 1000; all of a round must give the same count) and returns once
// count participants are present, or ctx ends (then it leaves). ctx bounds
// the wait only. Errors: ErrInvalidArgument (bad name or count),
// ErrPermissionDenied (barrier), ErrResourceExhausted (the broker's stream
// limit), ErrUnavailable, the context's error.
func (c *Client) EnterBarrier(ctx context.Context, name string, count int) (*Participant, error) {
	n := int32(min(max(count, 0), math.MaxInt32)) // the broker refuses what is out of range
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s, err := pb.NewDoubleBarrierClient(c.conn).Enter(sctx)
	if err == nil {
		err = s.Send(&pb.DoubleBarrierRequest{Name: name, Count: n})
	}
	var ev *pb.DoubleBarrierEvent
	if err == nil {
		ev, err = recvFirst(ctx, cancel, s.Recv)
	}
	if errors.Is(err, io.EOF) {
		err = ErrUnavailable // the broker ended the stream without a reason
	}
	if err == nil && ev.GetType() != pb.DoubleBarrierEvent_TYPE_ENTERED {
		err = fmt.Errorf("unexpected first event %v", ev.GetType())
	}
	if err != nil {
		cancel()
		return nil, errorf("qbroker: enter barrier %s: %w", name, convErr(err))
	}
	p := &Participant{name: name, key: ev.GetKey(), stream: s, cancel: cancel, done: make(chan struct{})}
	go p.run()
	return p, nil
}

// run owns the stream's receiving side until the participation ends.
func (p *Participant) run() {
	var err error
	for {
		var ev *pb.DoubleBarrierEvent
		if ev, err = p.stream.Recv(); err != nil {
			break
		}
		if ev.GetType() == pb.DoubleBarrierEvent_TYPE_LEFT {
			p.mu.Lock()
			p.left = true
			p.mu.Unlock()
		}
	}
	p.mu.Lock()
	ended := p.left && errors.Is(err, io.EOF) ||
		p.closing && (errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled)
	if !ended {
		if errors.Is(err, io.EOF) {
			err = ErrUnavailable
		}
		p.err = errorf("qbroker: barrier %s: %w: %w", p.name, ErrLost, convErr(err))
	}
	p.mu.Unlock()
	p.cancel()
	close(p.done)
}

// Name returns the double barrier's name.
func (p *Participant) Name() string { return p.name }

// Key returns the participant's key (its node's name).
func (p *Participant) Key() string { return p.key }

// Done returns a channel closed when the participation ends: after Leave
// or Close, or at its loss (Err tells which).
func (p *Participant) Done() <-chan struct{} { return p.done }

// Err returns nil while the participant is present and after Leave or
// Close; once it was lost (its node deleted, the broker's session ended,
// the stream to the broker broke), an error matching ErrLost and the
// cause.
func (p *Participant) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Leave leaves the barrier and waits until every participant has left, or
// ctx ends: then it leaves at once (the others no longer count it) and
// returns ctx's error. It returns the loss's error when the participant
// was lost (see Err). Call it once.
func (p *Participant) Leave(ctx context.Context) error {
	p.mu.Lock()
	first := !p.leaving
	p.leaving = true
	p.mu.Unlock()
	if first {
		_ = p.stream.Send(&pb.DoubleBarrierRequest{Leave: true})
	}
	select {
	case <-p.done:
		return p.Err()
	case <-ctx.Done():
		p.Close()
		return ctx.Err()
	}
}

// Close leaves at once, without waiting for the others, and waits for the
// stream's end. It is idempotent.
func (p *Participant) Close() {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	p.cancel()
	<-p.done
}
