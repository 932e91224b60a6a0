package broker

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/zkqueue"
)

const maxPrefetch = 1000

// maxSettling bounds the settlements of one stream applied at once. Each
// waits for its lease's write to commit (settlements of one lease share a
// write), so this is how many commits a stream's acks can wait for
// together: at 8 a prefetch-100 stream's acks queued behind each other
// and held up its credit (a packed 60,000-message drain at 64 consumers,
// prefetch 100: 29-31k msg/s at 8, 34-40k at 32 and at 64).
const maxSettling = 64

// maxClaimBatch bounds the messages one stream claims at once (concurrently,
// sharing a Multi), out of its credit.
const maxClaimBatch = 32

// consumeState is one Consume stream's credit and unsettled leases.
type consumeState struct {
	mu      sync.Mutex
	credit  int
	taking  bool                 // a claim runs with credit taken (takeCredit to endTake)
	held    map[string]time.Time // lease token -> deadline
	expires time.Time            // the earliest deadline in held, or before it
	wake    chan struct{}        // signalled when credit grows
	preempt context.CancelFunc   // cancels the claim under way (streamprio.go)

	prio  int         // the stream's priority
	board *prioBoard  // the queue's streams on this broker (streamprio.go)
	turn  *activeTurn // single-active queues: the stream's turn (active.go)
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
	if c.board != nil {
		c.board.creditChanged()
	}
}

// endTake ends a claim begun with takeCredit, giving back the credit it
// did not use.
func (c *consumeState) endTake(unused int) {
	c.mu.Lock()
	c.taking = false
	if unused > 0 {
		c.credit = min(c.credit+unused, maxPrefetch)
	}
	c.mu.Unlock()
	if unused > 0 {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	if c.board != nil {
		c.board.creditChanged()
	}
}

// ready reports whether the stream has credit: left, or taken by a claim
// under way.
func (c *consumeState) ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.credit > 0 || c.taking
}

// setPreempt sets (nil: clears) the cancel of the claim under way.
func (c *consumeState) setPreempt(f context.CancelFunc) {
	c.mu.Lock()
	c.preempt = f
	c.mu.Unlock()
}

// preemptTake cancels the claim under way, if any: a stream of higher
// priority got credit.
func (c *consumeState) preemptTake() {
	c.mu.Lock()
	f := c.preempt
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

// takeCredit waits for credit and takes up to max of it; endTake ends
// the claim it begins.
func (c *consumeState) takeCredit(ctx context.Context, max int) (int, error) {
	for {
		c.mu.Lock()
		if c.credit > 0 {
			n := min(c.credit, max)
			c.credit -= n
			c.taking = true
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
	if now := time.Now(); now.After(c.expires) && len(c.held) > 0 {
		// Some lease may have expired: the sweep owns those now. The
		// scan runs at most once per earliest deadline, not per delivery.
		c.expires = deadline
		for t, d := range c.held {
			if now.After(d) {
				delete(c.held, t)
			} else if d.Before(c.expires) {
				c.expires = d
			}
		}
	} else if len(c.held) == 0 || deadline.Before(c.expires) {
		c.expires = deadline
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

// Consume implements pb.QueueServer. It subscribes the stream, then runs
// its work in one errgroup it waits for: the receiving side (credit and
// settlements, applied by a settlePool it waits for) and the delivery
// loop. Then it releases the leases left unsettled. Only the receiver's
// and the outbox's goroutines, waiting in gRPC's Recv and Send, may
// outlive the handler (see stream.go).
func (b *Broker) Consume(stream pb.Queue_ConsumeServer) error {
	ctx, end, err := b.openStream(stream.Context())
	if err != nil {
		return err
	}
	defer end()
	rx := newReceiver(b, ctx, stream.Recv, nil)
	defer rx.close()

	first, err := firstRequest(ctx, b, rx, "subscribe request")
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return err
	}
	sub, err := b.subscribe(ctx, first)
	if err != nil {
		return b.fail(err)
	}
	unregister := b.registerConsumer(ctx, sub.q)
	defer unregister()
	defer b.packStream(sub.q)()
	var detach func()
	sub.ahead, detach = b.attachAhead(sub)
	defer detach()

	st := &consumeState{held: map[string]time.Time{}, wake: make(chan struct{}, 1), prio: sub.prio}
	if sub.q.h.Active == "" {
		b.prio.join(sub.q.name, st)
		defer b.prio.leave(st)
	} else {
		// One stream receives at a time: priority orders the line.
		st.turn = b.joinActive(sub.q, sub.prio)
		defer st.turn.leave() // after releaseHeld: the next turn waits for no lease
	}
	st.addCredit(sub.prefetch + int(first.GetCredit()))
	defer b.releaseHeld(sub.q, st)
	b.settle(context.WithoutCancel(ctx), st, first.GetSettle())
	return b.serveConsume(ctx, stream, rx, sub, st)
}

// subscription is what a Consume stream's first request asked for.
type subscription struct {
	q        *queue
	d        delivery
	prefetch int
	prio     int
	ahead    *ahead // the buffer the stream takes from (ahead.go); nil: it claims for itself
	maxBatch int    // the most messages in one Delivery (Subscribe.max_batch), at least 1
}

// subscribe checks a Consume stream's first request.
func (b *Broker) subscribe(ctx context.Context, first *pb.ConsumeRequest) (subscription, error) {
	sub := first.GetSubscribe()
	if sub == nil {
		return subscription{}, invalidf("the first Consume request must carry subscribe")
	}
	q, err := b.queue(ctx, sub.GetQueue())
	if err != nil {
		return subscription{}, err
	}
	d, err := b.deliverySettings(q, sub.GetMode(), sub.GetVisibilityTimeout().AsDuration())
	if err != nil {
		return subscription{}, err
	}
	if q.sync != nil {
		if err := q.sync.checkOpen(ctx); err != nil {
			return subscription{}, err
		}
	}
	prefetch := int(sub.GetPrefetch())
	if prefetch == 0 {
		prefetch = 1
	}
	if prefetch > maxPrefetch {
		return subscription{}, invalidf("prefetch %d > %d", prefetch, maxPrefetch)
	}
	prio := int(sub.GetPriority())
	if prio < minStreamPriority || prio > maxStreamPriority {
		return subscription{}, invalidf("priority %d out of range [%d, %d]", prio, minStreamPriority, maxStreamPriority)
	}
	maxBatch := max(int(sub.GetMaxBatch()), 1)
	if maxBatch > maxPrefetch {
		return subscription{}, invalidf("max_batch %d > %d", maxBatch, maxPrefetch)
	}
	return subscription{q: q, d: d, prefetch: prefetch, prio: prio, maxBatch: maxBatch}, nil
}

// serveConsume runs a subscribed stream until the client leaves or
// half-closes, the broker shuts down or a delivery fails, and returns the
// stream's status once all of its goroutines but the receiver's and the
// outbox's have ended.
//
// Settlements are applied by a settlePool, concurrently, so that one slow
// ack does not hold up the stream's others or its credit. They run under
// the stream's context, not the group's: the settlements a client sent
// before it half-closed are all applied before the stream ends and its
// unsettled leases are released.
func (b *Broker) serveConsume(ctx context.Context, stream pb.Queue_ConsumeServer, rx *receiver[*pb.ConsumeRequest], sub subscription, st *consumeState) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		detached := context.WithoutCancel(ctx)
		pool := newSettlePool(func(s []*pb.Settle) { b.settle(detached, st, s) })
		defer pool.close()
		return b.receiveRequests(gctx, rx, st, pool.submit)
	})
	g.Go(func() error { return b.deliver(gctx, stream, sub, st) })
	err := g.Wait()
	if errors.Is(err, errStreamDone) {
		return b.streamEnd()
	}
	return err
}

// settlePool applies one stream's settlements on up to maxSettling
// goroutines, started as the settlements' concurrency grows and kept until
// the stream ends (a goroutine per settlement would grow a fresh stack
// each time). Only the stream's receiving goroutine submits, and it waits
// in submit while all of them are busy, which holds up the stream's
// requests: that is the back-pressure.
type settlePool struct {
	apply func([]*pb.Settle)
	work  chan []*pb.Settle // unbuffered: a send is taken by an idle worker
	n     int               // workers started; only submit touches it
	wg    sync.WaitGroup
}

func newSettlePool(apply func([]*pb.Settle)) *settlePool {
	return &settlePool{apply: apply, work: make(chan []*pb.Settle)}
}

// submit has settles applied together (Broker.settle).
func (p *settlePool) submit(s []*pb.Settle) {
	select {
	case p.work <- s:
		return
	default:
	}
	if p.n < maxSettling {
		p.n++
		p.wg.Add(1)
		go p.run(s)
		return
	}
	p.work <- s
}

func (p *settlePool) run(s []*pb.Settle) {
	defer p.wg.Done()
	for ok := true; ok; s, ok = <-p.work {
		p.apply(s)
	}
}

// close waits for the settlements submitted to be applied. Each is
// bounded by releaseTimeout (settle).
func (p *settlePool) close() {
	close(p.work)
	p.wg.Wait()
}

// receiveRequests adds the credit of a stream's requests and hands their
// settlements to settle (a settlePool's submit), until the client
// half-closes or leaves (errStreamDone) or ctx ends. The acks of pack
// messages a request carries go together, so that those of one lease wait
// for their write together; every other settlement goes alone, so that
// each waits only for its own.
func (b *Broker) receiveRequests(ctx context.Context, rx *receiver[*pb.ConsumeRequest], st *consumeState, settle func([]*pb.Settle)) error {
	for {
		select {
		case req, ok := <-rx.reqs:
			if !ok {
				return errStreamDone
			}
			st.addCredit(int(req.GetCredit()))
			var members []*pb.Settle
			for _, s := range req.GetSettle() {
				if !s.GetNack() && strings.Contains(s.GetAckToken(), zkqueue.MemberSep) {
					members = append(members, s)
				} else {
					settle([]*pb.Settle{s})
				}
			}
			if len(members) > 0 {
				settle(members)
			}
		case <-ctx.Done():
			return errStreamDone
		}
	}
}

// deliver claims and sends deliveries while the stream has credit, until
// ctx ends or a delivery fails. It never returns nil.
//
// Deliveries are claimed in batches bounded by count and bytes (about
// what the transport takes without waiting), or taken from the queue's
// messages claimed ahead (ahead.go), each only after the
// previous one was sent, and each is checked just before its send: a
// delivery whose lease ran out (or nearly) meanwhile is given back
// unsent. A send held up by flow control (a client that stopped reading)
// must not outlast its lease either: it runs on the stream's outbox, and
// if the lease gets within sendMargin of its deadline first, the stream
// ends, which abandons the send before the message reaches the transport.
func (b *Broker) deliver(ctx context.Context, stream pb.Queue_ConsumeServer, sub subscription, st *consumeState) error {
	snd := newOutbox(b, stream.Send)
	defer snd.close()
	for {
		if st.turn != nil {
			if err := st.turn.wait(ctx); err != nil {
				if ctx.Err() != nil {
					return errStreamDone
				}
				return b.fail(err)
			}
		}
		credit, err := st.takeCredit(ctx, maxClaimBatch)
		if err != nil {
			return errStreamDone
		}
		tctx, done, err := st.board.admit(ctx, st)
		if err != nil {
			return errStreamDone
		}
		var cs []claimed
		if sub.ahead != nil {
			cs, err = sub.ahead.get(tctx, credit, consumeBatchBytes)
		} else {
			cs, err = b.take(tctx, sub.q, sub.d, want{max: credit, maxBytes: consumeBatchBytes, block: true})
		}
		done()
		st.endTake(credit - len(cs))
		if err != nil {
			if ctx.Err() != nil {
				return errStreamDone
			}
			if tctx.Err() != nil {
				continue // a stream of higher priority got credit
			}
			return b.fail(err)
		}
		if st.turn != nil {
			st.turn.fence(cs)
		}
		if sub.d.ack {
			for _, c := range cs {
				st.hold(c.lease, c.expires)
			}
		}
		if err := b.sendBatch(ctx, snd, sub, st, cs); err != nil {
			return err
		}
	}
}

// sendBatch sends the claimed deliveries cs, in order, giving back the
// ones whose lease ran out before their turn. A stream that accepts
// several messages per Delivery (sub.maxBatch) gets each run of sendable
// ones, up to maxBatch, in one Delivery: cs is what the stream has in
// hand now, so batching them holds none back. Deliveries taken from the
// messages claimed ahead go back to that buffer instead, from the first
// that cannot be sent on (ahead.putBack), to keep their order. The
// leases of the ones it could not send stay held, for releaseHeld.
func (b *Broker) sendBatch(ctx context.Context, snd *outbox[*pb.Delivery], sub subscription, st *consumeState, cs []claimed) error {
	q, d := sub.q, sub.d
	for i := 0; i < len(cs); {
		c := cs[i]
		if !b.sendable(d, c) && sub.ahead != nil {
			// Taken from the messages claimed ahead: this one and the
			// rest go back through the buffer, which gives them back
			// before any younger message reaches its streams.
			for _, r := range cs[i:] {
				st.settled(r.lease)
			}
			b.metrics.expiredUnsent.WithLabelValues(q.label).Add(float64(len(cs) - i))
			sub.ahead.putBack(cs[i:])
			st.addCredit(len(cs) - i)
			return nil
		}
		if !b.sendable(d, c) {
			st.settled(c.lease)
			b.unsent(q, c)
			st.addCredit(1)
			i++
			continue
		}
		j := i + 1
		for j < len(cs) && j-i < sub.maxBatch && b.sendable(d, cs[j]) {
			j++
		}
		run := cs[i:j]
		switch err := sendDelivery(ctx, snd, run, d); {
		case err == nil:
			for _, r := range run {
				b.delivered(q, d, r)
			}
		case errors.Is(err, errStalled):
			// The leases run out while the send waits: leave them to
			// the sweep rather than release them under a send that
			// may still complete; give the rest back.
			for _, r := range run {
				st.settled(r.lease)
			}
			b.metrics.expiredUnsent.WithLabelValues(q.label).Add(float64(len(run)))
			for _, r := range cs[j:] {
				st.settled(r.lease)
				if sub.ahead == nil {
					b.unsent(q, r)
				}
			}
			if sub.ahead != nil {
				b.metrics.expiredUnsent.WithLabelValues(q.label).Add(float64(len(cs) - j))
				sub.ahead.putBack(cs[j:])
			}
			b.log.Debug("consume stream stalled: ending it", "queue", q.name)
			return b.fail(err)
		default:
			return errStreamDone // the client is gone, or ctx ended
		}
		i = j
	}
	return nil
}

// sendDelivery hands the messages run (at least one) to the stream's
// outbox as one Delivery. At least once it gives up with errStalled when
// the earliest of their leases gets within sendMargin of its deadline
// first.
func sendDelivery(ctx context.Context, snd *outbox[*pb.Delivery], run []claimed, d delivery) error {
	var stall <-chan time.Time
	if d.ack {
		expires := run[0].expires
		for _, c := range run[1:] {
			if c.expires.Before(expires) {
				expires = c.expires
			}
		}
		t := time.NewTimer(time.Until(expires) - sendMargin(d.ttl))
		defer t.Stop()
		stall = t.C
	}
	dl := &pb.Delivery{Message: run[0].msg}
	if len(run) > 1 {
		dl.More = make([]*pb.Message, 0, len(run)-1)
		for _, c := range run[1:] {
			dl.More = append(dl.More, c.msg)
		}
	}
	return snd.sendBy(ctx, dl, stall)
}

// tokenLease returns the lease name of an ack token (see ackToken) for
// the stream's bookkeeping: the settlement parsed and checked the token
// already.
func tokenLease(tok string) string {
	_, rest, _ := strings.Cut(tok, "/")
	lease, _, _ := strings.Cut(rest, "/")
	return lease
}

// settle applies settlements a stream received. Each runs to its answer
// even when the stream ends meanwhile (a client that acks and leaves at
// once means the ack), bounded by releaseTimeout; one that fails leaves
// its lease held, so the stream's end releases it for redelivery.
// detached carries the stream's values without its cancellation
// (context.WithoutCancel, made once per stream).
//
// The acks among settles are applied together (ackMany): those of one
// pack lease share one write and one wait.
func (b *Broker) settle(detached context.Context, st *consumeState, settles []*pb.Settle) {
	ctx, cancel := context.WithTimeout(detached, releaseTimeout)
	defer cancel()
	done := func(token string, err error) {
		if err != nil && !errors.Is(err, zkqueue.ErrUnknownLease) {
			b.log.Debug("settle on stream failed", "err", err)
			return
		}
		st.settled(tokenLease(token))
	}
	var acks []string
	for _, s := range settles {
		if s.GetNack() {
			done(s.GetAckToken(), b.nack(ctx, s.GetAckToken(), s.GetDelay().AsDuration()))
		} else {
			acks = append(acks, s.GetAckToken())
		}
	}
	if len(acks) == 1 {
		done(acks[0], b.ack(ctx, acks[0]))
		return
	}
	for i, err := range b.ackMany(ctx, acks) {
		done(acks[i], err)
	}
}

// packStream counts a Consume stream of q; the function it returns, run
// when the stream ended (after releaseHeld), gives back what q's packed
// takes claimed and did not hand out (zkqueue's pack buffer) once the last
// stream of q on this broker ended, so the messages wait at their places
// rather than in this broker.
func (b *Broker) packStream(q *queue) func() {
	q.streams.Add(1)
	return func() {
		if q.streams.Add(-1) == 0 && q.meta.Packed {
			b.givePacksBack(q)
		}
	}
}

// givePacksBackAll gives back what the packed queues' takes buffered.
func (b *Broker) givePacksBackAll() {
	b.queuesMu.Lock()
	var qs []*queue
	for _, q := range b.queues {
		if q.meta.Packed {
			qs = append(qs, q)
		}
	}
	b.queuesMu.Unlock()
	for _, q := range qs {
		b.givePacksBack(q)
	}
}

// givePacksBack gives back what q's packed takes claimed and did not hand
// out, with its own bounded context (it also runs at shutdown).
func (b *Broker) givePacksBack(q *queue) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	q.leases.Flush(ctx)
	if err := q.items.Flush(ctx); err != nil {
		b.log.Warn("giving back buffered messages failed", "queue", q.name, "err", err)
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
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
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
