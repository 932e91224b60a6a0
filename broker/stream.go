package broker

import (
	"context"
	"errors"
	"io"
	"time"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// Long-lived streams (Consume, JoinSync) share a prologue (openStream) and
// an end (streamEnd). A Consume stream's work runs in goroutines its
// handler waits for, except two that gRPC does not let a handler stop:
// grpc-go has no way to interrupt a server stream's Recv or a Send held up
// by flow control; both return once the stream ends, and gRPC ends it (it
// cancels the stream's context) right after the handler returns. The
// receiver and the sender below are those two: they wait in nothing but
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

// receiver reads a Consume stream's requests on a goroutine of its own,
// so that the handler can wait for a request, a timer and its context at
// once. The goroutine forwards each request until stop, and ends when Recv
// fails (after the handler returned at the latest) or, after stop, once
// its Recv under way returns.
type receiver struct {
	reqs chan *pb.ConsumeRequest // closed after the last request, with err set
	err  error                   // why Recv failed: io.EOF when the client half-closed
	stop chan struct{}           // closed when the handler reads no more
}

func (b *Broker) newReceiver(stream pb.Queue_ConsumeServer) *receiver {
	r := &receiver{reqs: make(chan *pb.ConsumeRequest), stop: make(chan struct{})}
	b.wg.Add(1) // within the stream's own count, so never from zero
	go func() {
		defer b.wg.Done()
		for {
			req, err := stream.Recv()
			if err != nil {
				r.err = err
				close(r.reqs)
				return
			}
			select {
			case r.reqs <- req:
			case <-r.stop:
				return
			}
		}
	}()
	return r
}

// close tells the receiver that the handler reads no more requests.
func (r *receiver) close() { close(r.stop) }

// firstRequest waits up to FirstMessageTimeout for a Consume stream's
// first request. A stream that sends none is refused: it would hold a
// place under MaxStreams for nothing. It returns io.EOF when the client
// left (or the broker is closing and the stream can end quietly).
func (b *Broker) firstRequest(ctx context.Context, rx *receiver) (*pb.ConsumeRequest, error) {
	t := time.NewTimer(b.cfg.FirstMessageTimeout)
	defer t.Stop()
	select {
	case req, ok := <-rx.reqs:
		if !ok {
			return nil, rx.err
		}
		return req, nil
	case <-t.C:
		b.refuseStream(reasonNoSubscribe)
		return nil, b.fail(invalidf("no subscribe request within %v", b.cfg.FirstMessageTimeout))
	case <-ctx.Done():
		if err := b.streamEnd(); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}
}

// errStalled ends a Consume stream whose client did not take a delivery
// before its lease ran out.
var errStalled = errors.New("consumer did not read a delivery before its lease ran out; the stream ends and its leases are released")

// sender sends one Consume stream's deliveries, so that the stream's
// handler can stop waiting for a send: a send held up by flow control
// returns only when the client reads again or the stream ends. It ends
// once the handler has closed it and its last send came back.
type sender struct {
	stream pb.Queue_ConsumeServer
	in     chan *pb.Delivery
	out    chan error
}

func (b *Broker) newSender(stream pb.Queue_ConsumeServer) *sender {
	s := &sender{stream: stream, in: make(chan *pb.Delivery), out: make(chan error, 1)}
	b.wg.Add(1) // within the stream's own count, so never from zero
	go func() {
		defer b.wg.Done()
		for d := range s.in {
			s.out <- s.stream.Send(d)
		}
	}()
	return s
}

// send hands c to the transport. At least once it gives up with
// errStalled when the lease gets within sendMargin of its deadline first.
func (s *sender) send(ctx context.Context, c claimed, d delivery) error {
	var stall <-chan time.Time
	if d.ack {
		t := time.NewTimer(time.Until(c.expires) - sendMargin(d.ttl))
		defer t.Stop()
		stall = t.C
	}
	select {
	case s.in <- &pb.Delivery{Message: c.msg}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-s.out:
		return err
	case <-stall:
		return errStalled
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close lets the sender end once its send under way, if any, returns.
func (s *sender) close() { close(s.in) }
