package broker

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Long-lived streams (Consume, JoinSync, Lock, Campaign, Observe) share a
// prologue (openStream) and an end (streamEnd). A stream's work runs in
// goroutines its handler waits for, except two that gRPC does not let a
// handler stop:
// grpc-go has no way to interrupt a server stream's Recv or a Send held up
// by flow control; both return once the stream ends, and gRPC ends it (it
// cancels the stream's context) right after the handler returns. The
// receiver and the outbox below are those two: they wait in nothing but
// Recv and Send, and the broker's WaitGroup counts them, so Shutdown
// waits for them too.

// openStream admits a long-lived stream under MaxStreams and
// MaxStreamsPerIdentity (the client is ctx's caller) and joins its
// context with the broker's, so that Shutdown ends it. The stream's
// handler defers end. The error is a gRPC status.
func (b *Broker) openStream(ctx context.Context) (context.Context, func(), error) {
	leave, err := b.enterStream(ctx)
	if err != nil {
		return nil, nil, b.fail(err)
	}
	ctx, cancel := b.streamCtx(ctx)
	return ctx, func() { cancel(); leave() }, nil
}

// errStreamDone ends a stream's work because the client left or
// half-closed, or the broker is shutting down: the stream ends with
// streamEnd's status.
var errStreamDone = errors.New("stream done")

// streamEnd is the status of a stream that ended because the client
// left (nil) or the broker is shutting down (Unavailable).
func (b *Broker) streamEnd() error {
	if b.ctx.Err() != nil {
		return b.fail(errClosing)
	}
	return nil
}

// receiver reads a stream's requests on a goroutine of its own, so that
// the handler can wait for a request, a timer and its context at once.
// Every streaming RPC that reads requests uses it. The goroutine forwards
// each request on reqs until stop, then goes on reading without
// forwarding; ended ends when Recv fails or a request for which last
// holds arrives (the client's last word, such as a lock's release). The
// goroutine ends then, at the latest once the handler returned (gRPC ends
// the stream then, so Recv fails).
type receiver[T any] struct {
	reqs  chan T          // closed after the last request, with err set
	err   error           // why Recv failed: io.EOF when the client half-closed
	stop  chan struct{}   // closed when the handler reads no more
	once  sync.Once       // closes stop
	ended context.Context // ends with the client's last word, or with ctx
	said  atomic.Bool     // the client's last word, or its half-close, came
}

// newReceiver starts the receiver of a stream whose requests recv reads,
// under the stream's context ctx. last may be nil: Recv's failure is then
// the only end.
func newReceiver[T any](b *Broker, ctx context.Context, recv func() (T, error), last func(T) bool) *receiver[T] {
	ended, end := context.WithCancel(ctx)
	r := &receiver[T]{reqs: make(chan T), stop: make(chan struct{}), ended: ended}
	b.wg.Add(1) // within the stream's own count, so never from zero
	go func() {
		defer b.wg.Done()
		defer end()
		forward := true
		for {
			req, err := recv()
			if err != nil {
				r.err = err
				r.said.Store(errors.Is(err, io.EOF))
				close(r.reqs)
				return
			}
			if forward {
				select {
				case r.reqs <- req:
				case <-r.stop:
					forward = false
				}
			}
			if last != nil && last(req) {
				r.said.Store(true)
				return
			}
		}
	}()
	return r
}

// close tells the receiver that the handler reads no more requests. It
// may be called more than once.
func (r *receiver[T]) close() { r.once.Do(func() { close(r.stop) }) }

// saidLast reports, once ended is done, whether the client ended the
// stream deliberately: its last word (last) or a half-close, rather than
// cancelling the stream or vanishing.
func (r *receiver[T]) saidLast() bool { return r.said.Load() }

// failed reports whether Recv failed (the client left or half-closed),
// for a handler that gave up waiting for a request. It takes a request
// the handler would not read anyway.
func (r *receiver[T]) failed() bool {
	select {
	case _, ok := <-r.reqs:
		return !ok
	default:
		return false
	}
}

// firstRequest waits up to FirstMessageTimeout for a stream's first
// request (what names it: "subscribe request", "lock request"). A
// stream that sends none is refused: it would hold a place under
// MaxStreams for nothing. It returns Recv's error when the client left
// (io.EOF when it half-closed), and io.EOF when the broker is closing and
// the stream can end quietly.
func firstRequest[T any](ctx context.Context, b *Broker, rx *receiver[T], what string) (T, error) {
	var zero T
	t := time.NewTimer(b.cfg.FirstMessageTimeout)
	defer t.Stop()
	select {
	case req, ok := <-rx.reqs:
		if !ok {
			return zero, rx.err
		}
		return req, nil
	case <-t.C:
		b.refuseStream(reasonNoSubscribe)
		return zero, b.fail(invalidf("no %s within %v", what, b.cfg.FirstMessageTimeout))
	case <-ctx.Done():
		if err := b.streamEnd(); err != nil {
			return zero, err
		}
		return zero, io.EOF
	}
}

// errStalled ends a Consume stream whose client did not take a delivery
// before its lease ran out.
var errStalled = errors.New("consumer did not read a delivery before its lease ran out; the stream ends and its leases are released")

// outbox sends a stream's messages on a goroutine of its own, so that the
// handler can stop waiting for a send: a Send held up by flow control
// returns only when the client reads again or the stream ends, which gRPC
// does right after the handler returns. Every streaming RPC sends through
// one, never by calling Send itself. The goroutine ends once the handler
// has closed the outbox and its last Send came back.
type outbox[T any] struct {
	in  chan T
	out chan error
}

func newOutbox[T any](b *Broker, send func(T) error) *outbox[T] {
	o := &outbox[T]{in: make(chan T), out: make(chan error, 1)}
	b.wg.Add(1) // within the stream's own count, so never from zero
	go func() {
		defer b.wg.Done()
		for m := range o.in {
			o.out <- send(m)
		}
	}()
	return o
}

// send sends m and waits for the transport to take it, or for ctx.
func (o *outbox[T]) send(ctx context.Context, m T) error {
	return o.sendBy(ctx, m, nil)
}

// sendBy is send that gives up with errStalled when stall fires first
// (nil: never).
func (o *outbox[T]) sendBy(ctx context.Context, m T, stall <-chan time.Time) error {
	select {
	case o.in <- m:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-o.out:
		return err
	case <-stall:
		return errStalled
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close lets the goroutine end once its Send under way, if any, returns.
func (o *outbox[T]) close() { close(o.in) }
