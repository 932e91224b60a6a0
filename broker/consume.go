package broker

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

const maxPrefetch = 1000

// settleWorkers apply one stream's settlements concurrently.
const settleWorkers = 8

// maxClaimBatch bounds the messages one stream claims at once (concurrently,
// sharing a Multi), out of its credit.
const maxClaimBatch = 32

// consumeState is one Consume stream's credit and unsettled leases.
type consumeState struct {
	mu     sync.Mutex
	credit int
	held   map[string]time.Time // lease token -> deadline
	wake   chan struct{}        // signalled when credit grows
}

func (c *consumeState) addCredit(n int) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	c.credit = min(c.credit+n, maxPrefetch)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// takeCredit waits for credit and takes up to max of it.
func (c *consumeState) takeCredit(ctx context.Context, max int) (int, error) {
	for {
		c.mu.Lock()
		if c.credit > 0 {
			n := min(c.credit, max)
			c.credit -= n
			c.mu.Unlock()
			return n, nil
		}
		c.mu.Unlock()
		select {
		case <-c.wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func (c *consumeState) hold(token string, deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for t, d := range c.held {
		if now.After(d) {
			delete(c.held, t) // expired: the sweep owns it now
		}
	}
	c.held[token] = deadline
}

func (c *consumeState) settled(token string) {
	c.mu.Lock()
	delete(c.held, token)
	c.mu.Unlock()
}

func (c *consumeState) drain() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.held))
	for t := range c.held {
		out = append(out, t)
	}
	c.held = map[string]time.Time{}
	return out
}

// Consume implements pb.QueueServer.
func (b *Broker) Consume(stream pb.Queue_ConsumeServer) error {
	leave, err := b.enterStream()
	if err != nil {
		return b.fail(err)
	}
	defer leave()
	ctx, cancel := b.streamCtx(stream.Context())
	defer cancel()

	first, err := b.firstRequest(ctx, stream)
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return err
	}
	sub := first.GetSubscribe()
	if sub == nil {
		return b.fail(invalidf("the first Consume request must carry subscribe"))
	}
	q, err := b.queue(ctx, sub.GetQueue())
	if err != nil {
		return b.fail(err)
	}
	d, err := b.deliverySettings(q, sub.GetMode(), sub.GetVisibilityTimeout().AsDuration())
	if err != nil {
		return b.fail(err)
	}
	if q.sync != nil {
		if err := q.sync.checkOpen(ctx); err != nil {
			return b.fail(err)
		}
	}
	prefetch := int(sub.GetPrefetch())
	if prefetch == 0 {
		prefetch = 1
	}
	if prefetch > maxPrefetch {
		return b.fail(invalidf("prefetch %d > %d", prefetch, maxPrefetch))
	}
	unregister := b.registerConsumer(q)
	defer unregister()

	st := &consumeState{held: map[string]time.Time{}, wake: make(chan struct{}, 1)}
	st.addCredit(prefetch + int(first.GetCredit()))
	b.settle(ctx, st, first.GetSettle())

	// The receiving side: credit and settlements. Settlements are applied
	// by settleWorkers goroutines, so one slow ack does not hold up the
	// stream's others or its credit. All of them end when the stream
	// does (Recv fails once the handler has returned).
	settles := make(chan *pb.Settle, 4*settleWorkers)
	recvDone, settleDone := make(chan struct{}), make(chan struct{})
	var swg sync.WaitGroup
	for i := 0; i < settleWorkers; i++ {
		swg.Add(1)
		go func() {
			defer swg.Done()
			for s := range settles {
				b.settle(ctx, st, []*pb.Settle{s})
			}
		}()
	}
	go func() { swg.Wait(); close(settleDone) }()
	go func() {
		defer close(settles)
		defer close(recvDone)
		defer cancel()
		for {
			req, err := stream.Recv()
			if err != nil {
				return
			}
			st.addCredit(int(req.GetCredit()))
			for _, s := range req.GetSettle() {
				settles <- s
			}
		}
	}()
	defer func() {
		// A client that half-closed sent its last settlements before:
		// apply them before releasing what is left.
		select {
		case <-recvDone:
			<-settleDone
		default:
		}
		b.releaseHeld(q, st)
	}()

	// Deliveries are claimed in batches bounded by count and bytes (about
	// what the transport takes without waiting), each only after the
	// previous one was sent, and each is checked just before its send:
	// a delivery whose lease ran out (or nearly) meanwhile is given back
	// unsent. A send held up by flow control (a client that stopped
	// reading) must not outlast its lease either: it runs on the
	// stream's sender, and if the lease gets within sendMargin of its
	// deadline first, the stream ends, which abandons the send before the
	// message reaches the transport.
	snd := b.newSender(stream)
	defer snd.close()
	for {
		credit, err := st.takeCredit(ctx, maxClaimBatch)
		if err != nil {
			return b.streamEnd()
		}
		cs, err := b.take(ctx, q, d, credit, consumeBatchBytes, true)
		if err != nil {
			if ctx.Err() != nil {
				return b.streamEnd()
			}
			return b.fail(err)
		}
		st.addCredit(credit - len(cs))
		if d.ack {
			for _, c := range cs {
				st.hold(c.lease, c.expires)
			}
		}
		for i, c := range cs {
			if !b.sendable(d, c) {
				st.settled(c.lease)
				b.unsent(q, c)
				st.addCredit(1)
				continue
			}
			switch err := snd.send(ctx, c, d); {
			case err == nil:
				b.delivered(q, d, c)
			case errors.Is(err, errStalled):
				// The lease runs out while the send waits: leave it
				// to the sweep rather than release it under a send
				// that may still complete; give the rest back.
				st.settled(c.lease)
				b.metrics.expiredUnsent.WithLabelValues(q.label).Inc()
				for _, r := range cs[i+1:] {
					st.settled(r.lease)
					b.unsent(q, r)
				}
				b.log.Debug("consume stream stalled: ending it", "queue", q.name)
				return b.fail(err)
			case err != nil:
				if ctx.Err() != nil {
					return b.streamEnd()
				}
				return nil // the client is gone; held leases are released
			}
		}
	}
}

// errStalled ends a Consume stream whose client did not take a delivery
// before its lease ran out.
var errStalled = errors.New("consumer did not read a delivery before its lease ran out; the stream ends and its leases are released")

// sender sends one Consume stream's deliveries, so that the stream's
// handler can stop waiting for a send: a send held up by flow control
// returns only when the client reads again or the stream ends. It ends
// after the handler has returned and its last send came back; the
// broker's WaitGroup counts it.
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

// streamEnd is the status of a stream that ended because the client
// left (nil) or the broker is shutting down (Unavailable).
func (b *Broker) streamEnd() error {
	if b.ctx.Err() != nil {
		return b.fail(errClosing)
	}
	return nil
}

func tokenLease(tok string) string {
	t, _ := parseToken(tok)
	return t.lease
}

func (b *Broker) settle(ctx context.Context, st *consumeState, settles []*pb.Settle) {
	for _, s := range settles {
		var err error
		if s.GetNack() {
			err = b.nack(ctx, s.GetAckToken(), s.GetDelay().AsDuration())
		} else {
			err = b.ack(ctx, s.GetAckToken())
		}
		st.settled(tokenLease(s.GetAckToken()))
		if err != nil {
			b.log.Debug("settle on stream failed", "err", err)
		}
	}
}

// releaseHeld gives back the stream's unsettled leases for redelivery.
// It runs when the stream ends, also during shutdown, so it uses its own
// bounded context.
func (b *Broker) releaseHeld(q *queue, st *consumeState) {
	tokens := st.drain()
	if len(tokens) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, t := range tokens {
		m, out, ok, err := q.leases.Release(ctx, t, q.policy)
		if err != nil {
			// The lease stays; the sweep releases it at its deadline.
			b.log.Warn("release on stream end failed", "queue", q.name, "err", err)
			continue
		}
		if ok {
			b.released(q, m, out)
		}
	}
}
