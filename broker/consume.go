package broker

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/events"
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
	preempt context.CancelFunc   // cancels the claim under way (prioBoard)

	prio  int         // the stream's priority
	board *prioBoard  // the queue's streams on this broker
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
// outlive the handler (see receiver and outbox).
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
	unregister := b.handles.registerConsumer(ctx, sub.q)
	defer unregister()
	defer b.handles.packStream(sub.q)()
	if b.cfg.ClaimAhead {
		var detach func()
		sub.ahead, detach = b.handles.attachAhead(sub)
		defer detach()
	}

	st := &consumeState{held: map[string]time.Time{}, wake: make(chan struct{}, 1), prio: sub.prio}
	if sub.q.h.Active == "" {
		b.prio.join(sub.q.name, st)
		defer b.prio.leave(st)
	} else {
		// One stream receives at a time: priority orders the line.
		st.turn = b.active.joinActive(sub.q, sub.prio)
		defer st.turn.leave() // after releaseHeld: the next turn waits for no lease
	}
	st.addCredit(sub.prefetch + int(first.GetCredit()))
	c := &consumer{b: b, stream: stream, sub: sub, st: st, out: newOutbox(b, stream.Send)}
	defer c.out.close()
	defer c.releaseHeld()
	c.settle(ctx, context.WithoutCancel(ctx), first.GetSettle())
	return c.serve(ctx, rx)
}

// consumer is one Consume stream being served: the stream, what its first
// request subscribed to, and its credit and held leases.
type consumer struct {
	b      *Broker
	stream pb.Queue_ConsumeServer
	sub    subscription
	st     *consumeState
	out    *outbox[*pb.Delivery] // the stream's sends: deliveries and outcomes of settlements
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
	q, err := b.handles.queue(ctx, sub.GetQueue())
	if err != nil {
		return subscription{}, err
	}
	d, err := b.claims.deliverySettings(q, sub.GetMode(), sub.GetVisibilityTimeout().AsDuration())
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

// serve runs a subscribed stream until the client leaves or
// half-closes, the broker shuts down or a delivery fails, and returns the
// stream's status once all of its goroutines but the receiver's and the
// outbox's have ended.
//
// Settlements are applied by a settlePool, concurrently, so that one slow
// ack does not hold up the stream's others or its credit. They run under
// the stream's context, not the group's: the settlements a client sent
// before it half-closed are all applied before the stream ends and its
// unsettled leases are released.
func (c *consumer) serve(ctx context.Context, rx *receiver[*pb.ConsumeRequest]) error {
	b := c.b
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		detached := context.WithoutCancel(ctx)
		pool := newSettlePool(func(s []*pb.Settle) { c.settle(ctx, detached, s) })
		defer pool.close()
		return c.receiveRequests(gctx, rx, pool.submit)
	})
	g.Go(func() error { return c.deliver(gctx) })
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
func (c *consumer) receiveRequests(ctx context.Context, rx *receiver[*pb.ConsumeRequest], settle func([]*pb.Settle)) error {
	st := c.st
	rx.handleWith(func(req *pb.ConsumeRequest) {
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
	})
	defer rx.detach()
	select {
	case <-rx.ended.Done(): // Recv failed: the client left or half-closed
	case <-ctx.Done():
	}
	return errStreamDone
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
func (c *consumer) deliver(ctx context.Context) error {
	b, sub, st := c.b, c.sub, c.st
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
			cs, err = b.claims.take(tctx, sub.q, sub.d, want{max: credit, maxBytes: consumeBatchBytes, block: true})
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
		if err := c.sendBatch(ctx, c.out, cs); err != nil {
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
func (c *consumer) sendBatch(ctx context.Context, snd *outbox[*pb.Delivery], cs []claimed) error {
	b, sub, st := c.b, c.sub, c.st
	q, d := sub.q, sub.d
	for i := 0; i < len(cs); {
		c := cs[i]
		if !b.claims.sendable(d, c) && sub.ahead != nil {
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
		if !b.claims.sendable(d, c) {
			st.settled(c.lease)
			b.claims.unsent(q, c)
			st.addCredit(1)
			i++
			continue
		}
		j := i + 1
		for j < len(cs) && j-i < sub.maxBatch && b.claims.sendable(d, cs[j]) {
			j++
		}
		run := cs[i:j]
		switch err := sendDelivery(ctx, snd, run, d); {
		case err == nil:
			for _, r := range run {
				b.claims.delivered(q, d, r)
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
					b.claims.unsent(q, r)
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
// (context.WithoutCancel, made once per stream). The outcomes of those
// sent with confirm go back on the stream (stream: its context) in one
// Delivery.
//
// The acks among settles are applied together (ackMany): those of one
// pack lease share one write and one wait.
func (c *consumer) settle(stream, detached context.Context, settles []*pb.Settle) {
	b, st := c.b, c.st
	ctx, cancel := context.WithTimeout(detached, releaseTimeout)
	defer cancel()
	var outcomes []*pb.Settled
	done := func(s *pb.Settle, err error) {
		if s.GetConfirm() {
			answer := status.Convert(b.fail(err))
			outcomes = append(outcomes, &pb.Settled{AckToken: s.GetAckToken(), Code: int32(answer.Code()), Message: answer.Message()})
		}
		if err != nil && !errors.Is(err, zkqueue.ErrUnknownLease) {
			b.log.Debug("settle on stream failed", "err", err)
			return
		}
		st.settled(tokenLease(s.GetAckToken()))
	}
	var acks []*pb.Settle
	confirm := false
	for _, s := range settles {
		if s.GetNack() {
			done(s, b.acks.nack(ctx, s.GetAckToken(), s.GetDelay().AsDuration()))
		} else {
			acks = append(acks, s)
			confirm = confirm || s.GetConfirm()
		}
	}
	if !confirm {
		// Nobody waits on the commit of these acks: they may share a
		// Multi with later writes (zkqueue.WithDeferredCommit), a few
		// milliseconds on.
		ctx = zkqueue.WithDeferredCommit(ctx)
	}
	switch len(acks) {
	case 0:
	case 1:
		done(acks[0], b.acks.ack(ctx, acks[0].GetAckToken()))
	default:
		tokens := make([]string, len(acks))
		for i, s := range acks {
			tokens[i] = s.GetAckToken()
		}
		for i, err := range b.acks.ackMany(ctx, tokens) {
			done(acks[i], err)
		}
	}
	if len(outcomes) > 0 {
		_ = c.out.send(stream, &pb.Delivery{Settled: outcomes}) // a failed send ends the stream anyway
	}
}

// releaseHeld gives back the stream's unsettled leases for redelivery.
// It runs when the stream ends, also during shutdown, so it uses its own
// bounded context.
func (c *consumer) releaseHeld() {
	b, q, st := c.b, c.sub.q, c.st
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
			b.acks.released(q, m, out)
		}
	}
}

// Delivery: a claimed message on its way to a stream.

// claims claims messages for deliveries (Consume streams, Receive calls,
// the claim-ahead buffers) and accounts for each one sent or not: the
// broker's metrics, its events, the leases given back.
type claims struct{ b *Broker }

// MaxResponseBytes bounds every message the broker sends: 4 MiB, gRPC's
// default receive limit in every language, less a 64 KiB margin for what
// the size estimate of a response leaves out. Receive answers with fewer
// messages than asked for rather than more bytes, and list calls page,
// so a client with default settings can receive every answer. The
// largest payload (under 1 MiB) always fits.
const MaxResponseBytes = 4<<20 - 64<<10

// consumeBatchBytes bounds what a Consume stream claims at once beyond
// what it has sent: about one HTTP/2 stream window (64 KiB), so that the
// messages it holds claimed can be handed to the transport at once (the
// first one always fits, whatever its size).
const consumeBatchBytes = 64 << 10

// msgOverhead bounds what a delivered message of queue costs on the wire
// beyond its payload: the queue name (twice: in the message and in the
// ack token), id, lease name, timestamps, counts and protobuf framing.
func msgOverhead(queue string) int { return 2*len(queue) + 512 }

// room is the byte budget of one answer's messages from q.
func room(q *queue, bytes int) zkqueue.Room {
	return zkqueue.Room{Bytes: bytes, Overhead: msgOverhead(q.name)}
}

// sendMargin is how much of a lease must be left for the broker to hand
// the delivery to the transport: max(200ms, ttl/10), but at most half the
// lease. It covers the time to reach the consumer and clock differences.
func sendMargin(ttl time.Duration) time.Duration {
	return min(max(200*time.Millisecond, ttl/10), ttl/2)
}

// claimed is one message taken for a consumer and not yet sent.
type claimed struct {
	msg     *pb.Message
	m       zkqueue.Message
	lease   string    // at least once: the lease node's name
	expires time.Time // at least once: the lease deadline
	session int64     // the broker's session count when claimed
}

// sendable reports whether a claimed delivery may still be handed to the
// transport. At most once always (the message is deleted: not sending it
// would lose it). At least once only if its lease has sendMargin left and
// the broker has kept its ZooKeeper session since the claim: a broker
// paused (or cut off) long enough may find its leases expired and their
// messages redelivered elsewhere.
func (cl *claims) sendable(d delivery, c claimed) bool {
	b := cl.b
	if !d.ack {
		return true
	}
	return time.Until(c.expires) > sendMargin(d.ttl) && b.member.hasSession.Load() && b.member.sessions.Load() == c.session
}

// unsent gives back at once, and counts, an at-least-once delivery that
// will not be sent. The claim is undone: the message keeps its place and
// its delivery count. If the sweep has released the lease already, or the
// release fails, the sweep's release stands.
func (cl *claims) unsent(q *queue, c claimed) {
	b := cl.b
	b.metrics.expiredUnsent.WithLabelValues(q.label).Inc()
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := q.leases.Unclaim(ctx, c.lease); err != nil {
		b.log.Debug("giving back an unsent delivery failed; the sweep releases it", "queue", q.name, "err", err)
	}
}

// releaseTimeout bounds a release that runs without the caller's context.
const releaseTimeout = 10 * time.Second

// delivered accounts for a delivery handed to the transport.
func (cl *claims) delivered(q *queue, d delivery, c claimed) {
	b := cl.b
	mode := modeAtMostOnce
	if d.ack {
		mode = modeAtLeastOnce
	}
	b.metrics.delivered.WithLabelValues(q.label, mode).Inc()
	b.metrics.queueTime.WithLabelValues(q.label).Observe(time.Since(c.m.Published).Seconds())
	if c.m.Deliveries > 1 {
		b.metrics.redelivered.WithLabelValues(q.label).Inc()
	}
	if b.ev.sink != nil {
		b.ev.emit(events.Delivered, q, c.m, "")
	}
}

// delivery settings of one consume or receive call.
type delivery struct {
	ack bool          // at-least-once
	ttl time.Duration // lease
}

func (cl *claims) deliverySettings(q *queue, mode pb.DeliveryMode, vis time.Duration) (delivery, error) {
	switch mode {
	case pb.DeliveryMode_DELIVERY_MODE_UNSPECIFIED, pb.DeliveryMode_DELIVERY_MODE_AT_MOST_ONCE:
		return delivery{}, nil
	case pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE:
		ttl, err := clampDuration("visibility_timeout", vis, q.meta.Visibility, minVisibility, maxVisibility)
		return delivery{ack: true, ttl: ttl}, err
	}
	return delivery{}, invalidf("unknown delivery mode %d", mode)
}

// want is what a take asks for: up to max messages, at most maxBytes of
// them on the wire, waiting for the first when block is set.
type want struct {
	max, maxBytes int
	block         bool
}

// take claims up to w.max messages, and no more than w.maxBytes of them on the
// wire (see MaxResponseBytes; the first always fits), in queue order,
// waiting for the first when w.block is set (zkqueue.Queue.Take: the claims
// run concurrently and their writes share a Multi). A message that does
// not fit is not claimed: it stays at its place in the queue. The caller
// sends each (see sendable) and accounts for it with delivered.
func (cl *claims) take(ctx context.Context, q *queue, d delivery, w want) ([]claimed, error) {
	b := cl.b
	if q.sync != nil {
		if err := q.sync.checkOpen(ctx); err != nil {
			return nil, err
		}
	}
	session := b.member.sessions.Load()
	var out []claimed
	if d.ack {
		ls, err := q.leases.Take(ctx, w.max, room(q, w.maxBytes), d.ttl, w.block)
		if err != nil {
			return nil, b.handles.gone(q, err)
		}
		return cl.leased(q, ls, session), nil
	}
	ms, err := q.items.Take(ctx, w.max, room(q, w.maxBytes), w.block)
	if err != nil {
		return nil, b.handles.gone(q, err)
	}
	out = make([]claimed, 0, len(ms))
	for _, m := range ms {
		out = append(out, claimed{msg: toPB(q.name, m, nil), m: m, session: session})
	}
	return out, nil
}

// leased wraps at-least-once claims made while the broker's session count
// was session.
func (cl *claims) leased(q *queue, ls []zkqueue.Lease, session int64) []claimed {
	out := make([]claimed, 0, len(ls))
	for i := range ls {
		out = append(out, claimed{msg: cl.leasedPB(q.name, &ls[i]), m: ls[i].Message,
			lease: ls[i].Token, expires: ls[i].Deadline, session: session})
	}
	return out
}

// toPB converts a delivered message; the lease deadline is set for
// at-least-once deliveries (leasedPB adds their token).
func toPB(queue string, m zkqueue.Message, l *zkqueue.Lease) *pb.Message {
	out := &pb.Message{
		Queue:         queue,
		Id:            m.ID,
		Payload:       m.Payload,
		Priority:      uint32(m.Priority),
		PublishedAt:   timestamppb.New(m.Published),
		DeliveryCount: uint32(m.Deliveries),
		Headers:       m.Headers,
		ContentType:   m.ContentType,
		Group:         m.Group,
	}
	if l != nil {
		out.LeaseDeadline = timestamppb.New(l.Deadline)
		out.FencingToken = l.FencingToken
	}
	return out
}

// leasedPB converts an at-least-once delivery, with its signed ack token.
func (cl *claims) leasedPB(queue string, l *zkqueue.Lease) *pb.Message {
	b := cl.b
	out := toPB(queue, l.Message, l)
	out.AckToken = makeToken(b.acks.tokens, queue, *l)
	return out
}

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
	leave, err := b.gate.enterStream(ctx)
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

	handlers chan func(T) // buffered: handleWith's handler, for the goroutine to take
	mu       sync.Mutex   // held while the goroutine runs the handler
	detached bool         // the handler runs no more; under mu
}

// newReceiver starts the receiver of a stream whose requests recv reads,
// under the stream's context ctx. last may be nil: Recv's failure is then
// the only end.
func newReceiver[T any](b *Broker, ctx context.Context, recv func() (T, error), last func(T) bool) *receiver[T] {
	ended, end := context.WithCancel(ctx)
	r := &receiver[T]{reqs: make(chan T), stop: make(chan struct{}), ended: ended, handlers: make(chan func(T), 1)}
	b.wg.Add(1) // within the stream's own count, so never from zero
	go func() {
		defer b.wg.Done()
		defer end()
		forward := true
		var handle func(T)
		for {
			req, err := recv()
			if err != nil {
				r.err = err
				r.said.Store(errors.Is(err, io.EOF))
				close(r.reqs)
				return
			}
			if forward && handle == nil {
				select {
				case r.reqs <- req:
				case handle = <-r.handlers:
				case <-r.stop:
					forward = false
				}
			}
			if handle != nil && !r.run(handle, req) {
				handle, forward = nil, false
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

// handleWith has the receiving goroutine run handle on every request
// from the next one on, instead of forwarding it on reqs: a request then
// costs no hand-off between goroutines. The handler stops reading reqs;
// it learns that Recv failed from ended (a receiver without last) and
// must call detach before what handle uses goes away. handle may block:
// that holds up the stream's requests, as a handler that does not read
// them does.
func (r *receiver[T]) handleWith(handle func(T)) { r.handlers <- handle }

// detach stops the requests' handler: it waits for a handle call under
// way, and none starts after it.
func (r *receiver[T]) detach() {
	r.mu.Lock()
	r.detached = true
	r.mu.Unlock()
}

// run runs handle on req unless detached.
func (r *receiver[T]) run(handle func(T), req T) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.detached {
		return false
	}
	handle(req)
	return true
}

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
		b.gate.refuseStream(reasonNoSubscribe)
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
// has closed the outbox and its last Send came back. Several goroutines
// may send on one outbox (a Consume stream's deliveries and the outcomes
// of its settlements); each gets the answer of its own send.
type outbox[T any] struct {
	in chan outboxItem[T]
}

type outboxItem[T any] struct {
	m   T
	out chan error // buffered: the goroutine never waits on it
}

func newOutbox[T any](b *Broker, send func(T) error) *outbox[T] {
	o := &outbox[T]{in: make(chan outboxItem[T])}
	b.wg.Add(1) // within the stream's own count, so never from zero
	go func() {
		defer b.wg.Done()
		for it := range o.in {
			it.out <- send(it.m)
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
	out := make(chan error, 1)
	select {
	case o.in <- outboxItem[T]{m, out}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-out:
		return err
	case <-stall:
		return errStalled
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close lets the goroutine end once its Send under way, if any, returns.
// Every sender must be done.
func (o *outbox[T]) close() { close(o.in) }

// Consumer priority.
//
// A Consume stream may carry a priority (Subscribe.priority, default 0).
// Among the streams of one queue on this broker, a stream claims messages
// only while no stream of higher priority has credit (credit left, or a
// claim under way with the credit it took): lower ones get messages only
// when all higher ones are full. A lower stream's claim that waits for
// messages is cancelled as soon as a higher one gets credit (a claim
// already under way runs to its end: claims are never abandoned), so a
// message that arrives then goes to the higher stream.
//
// Priorities are compared among one broker's streams only: streams on
// different brokers share the queue as without priorities.
//
// All of a queue's streams join its board, so a stream of another
// priority arriving later is seen; but the board acts only while its
// streams' priorities differ (mixed): a queue whose streams all have the
// same priority pays no lock and no wake-up per message.

// Stream priorities.
const (
	minStreamPriority = -1000
	maxStreamPriority = 1000
)

// prioBoards are the broker's boards, one per queue with open streams.
type prioBoards struct {
	mu sync.Mutex
	m  map[string]*prioBoard
}

// prioBoard is one queue's Consume streams on this broker and their
// priorities.
type prioBoard struct {
	name    string
	mu      sync.Mutex
	members map[*consumeState]struct{}
	changed chan struct{} // closed and replaced when a member's credit changes
	mixed   atomic.Bool   // the members' priorities differ
}

// join adds st (its prio set) to the board of queue name.
func (p *prioBoards) join(name string, st *consumeState) *prioBoard {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]*prioBoard{}
	}
	bd := p.m[name]
	if bd == nil {
		bd = &prioBoard{name: name, members: map[*consumeState]struct{}{}, changed: make(chan struct{})}
		p.m[name] = bd
	}
	bd.mu.Lock()
	bd.members[st] = struct{}{}
	bd.update()
	bd.mu.Unlock()
	st.board = bd
	return bd
}

// leave takes st off its board, dropping the board when it was the last.
func (p *prioBoards) leave(st *consumeState) {
	bd := st.board
	p.mu.Lock()
	defer p.mu.Unlock()
	bd.mu.Lock()
	delete(bd.members, st)
	bd.update()
	empty := len(bd.members) == 0
	bd.mu.Unlock()
	if empty && p.m[bd.name] == bd {
		delete(p.m, bd.name)
	}
}

// update recomputes mixed and wakes the waiting members. bd.mu is held.
func (bd *prioBoard) update() {
	first, mixed := 0, false
	i := 0
	for st := range bd.members {
		if i == 0 {
			first = st.prio
		} else if st.prio != first {
			mixed = true
		}
		i++
	}
	bd.mixed.Store(mixed)
	bd.changedLocked()
}

// changedLocked wakes the members waiting in admit and cancels the
// waiting claims of members below a member with credit. bd.mu is held.
func (bd *prioBoard) changedLocked() {
	close(bd.changed)
	bd.changed = make(chan struct{})
	top, any := bd.topReady()
	if !any {
		return
	}
	for st := range bd.members {
		if st.prio < top {
			st.preemptTake()
		}
	}
}

// topReady returns the highest priority of a member with credit. bd.mu
// is held.
func (bd *prioBoard) topReady() (top int, any bool) {
	for st := range bd.members {
		if st.ready() && (!any || st.prio > top) {
			top, any = st.prio, true
		}
	}
	return top, any
}

// changed is called when st's credit changed.
func (bd *prioBoard) creditChanged() {
	if !bd.mixed.Load() {
		return
	}
	bd.mu.Lock()
	bd.changedLocked()
	bd.mu.Unlock()
}

// admit waits until no member of higher priority than st has credit and
// returns the context of st's next claim: it is cancelled (cancel must be
// called when the claim returns) as soon as a higher member gets credit.
// Without mixed priorities, or without a board (a stream of a
// single-active queue, where priority only orders the line), it returns
// ctx.
func (bd *prioBoard) admit(ctx context.Context, st *consumeState) (context.Context, context.CancelFunc, error) {
	for {
		if bd == nil || !bd.mixed.Load() {
			return ctx, func() {}, nil
		}
		bd.mu.Lock()
		blocked := false
		for m := range bd.members {
			if m.prio > st.prio && m.ready() {
				blocked = true
				break
			}
		}
		ch := bd.changed
		if !blocked {
			tctx, cancel := context.WithCancel(ctx)
			st.setPreempt(cancel)
			bd.mu.Unlock()
			return tctx, func() { st.setPreempt(nil); cancel() }, nil
		}
		bd.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// Registrations.
//
// The broker keeps two kinds of EPHEMERAL nodes through session changes,
// both with its zkqueue.Registry (b.registry, which explains why a create
// and a delete are not enough): brokers/<id> while the broker runs, and
// one consumer registration in the queue's consumers/ while one of its
// Consume streams is open, made with the queue's zkqueue.ConsumerGroup
// (the Registry is shared by all queues, so a handle opened anew knows
// the registrations made through the old one).
// The group counts the registrations (Stats) and ranks the brokers
// consuming the queue (the dispatcher's share split).

// registerConsumer records an open stream as an ephemeral node, so Stats
// counts consumers on all brokers and brokers split the queue. It returns
// the unregister func.
func (hs *handles) registerConsumer(ctx context.Context, q *queue) func() {
	b := hs.b
	g := b.metrics.consumers.WithLabelValues(q.label)
	g.Inc()
	r, err := q.consumers.Register(ctx)
	if err != nil {
		// The queue was deleted (its next call says so), or the stream
		// ended.
		b.log.Debug("consumer registration", "queue", q.name, "err", err)
	}
	return func() {
		g.Dec()
		if r != nil {
			_ = r.Close()
		}
	}
}

// countConsumers counts q's live Consume streams on all brokers.
func (hs *handles) countConsumers(q *queue) (int, error) {
	return q.consumers.Count(context.Background())
}
