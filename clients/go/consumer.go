package qbroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// maxPrefetch is the broker's bound on a stream's credit.
const maxPrefetch = 1000

// ConsumeOptions configure Consume. The zero value consumes at most once,
// one message in flight.
type ConsumeOptions struct {
	// Mode of delivery; default AtMostOnce.
	Mode DeliveryMode
	// Prefetch is how many messages the broker may send ahead of the
	// application: 0 means 1, at most 1000. At most once, prefetched
	// messages not yet taken are lost when the consumer ends; at least
	// once, they are redelivered.
	Prefetch int
	// Visibility is the lease of AtLeastOnce deliveries; 0 means the
	// queue's visibility timeout.
	Visibility time.Duration
	// Max ends the consumer after it has delivered this many messages; 0
	// means no limit. Credit is never granted beyond Max, so at most once
	// no message is lost on the way out; at least once, the consumer
	// stays until the last of them is settled.
	Max int
	// ExhaustedTimeout is how long the consumer keeps re-subscribing
	// while the brokers refuse its stream with ResourceExhausted (their
	// stream limit) before it ends with ErrResourceExhausted; 0 means
	// 30s.
	ExhaustedTimeout time.Duration
	// Priority of the stream, -1000..1000 (default 0): among a queue's
	// streams on one broker, a stream gets messages only while no stream
	// of higher priority has credit. On a single-active queue, the
	// broker's waiting stream of highest priority is the next active one.
	Priority int
	// Confirm makes a message's Ack and Nack wait for the broker's answer
	// that the settlement committed, or why it failed, as the Ack and
	// Nack calls do; they still travel on the stream, and the credit
	// they give back goes at once, so the next message is on its way
	// while the settlement commits. Without it they return once handed
	// to the stream, and the broker may hold an ack a few milliseconds to
	// commit it with others. If the stream breaks before the answer,
	// they fail with ErrUnavailable: the settlement may or may not have
	// committed. At least once only.
	Confirm bool
}

// Stream priorities (ConsumeOptions.Priority).
const (
	MinConsumerPriority = -1000
	MaxConsumerPriority = 1000
)

// defaultExhaustedTimeout is ConsumeOptions.ExhaustedTimeout's default.
const defaultExhaustedTimeout = 30 * time.Second

// Consumer receives a queue's messages over a Consume stream. One
// goroutine owns the stream: it grants the broker credit as the
// application takes messages (at most once) or settles them (at least
// once), and re-subscribes with backoff when the stream breaks because a
// broker is unavailable, so a consumer survives broker restarts.
//
// At least once, a message's Ack and Nack travel on the stream that
// delivered it while it is open; after it broke, they call the broker,
// and usually fail with ErrFailedPrecondition because the broker released
// the stream's leases for redelivery. A delivery whose lease runs out
// before the application takes it is dropped, not handed out (see
// Expired): the broker redelivers it.
//
// A Consumer is safe for concurrent use. Close it when done.
type Consumer struct {
	c     *Client
	queue string
	opts  ConsumeOptions
	mode  pb.DeliveryMode

	msgs      chan *Message
	settles   chan settleReq
	closing   chan struct{} // closed by Close
	closeOnce sync.Once
	done      chan struct{}

	mu  sync.Mutex
	err error

	expired atomic.Int64 // deliveries dropped: lease ran out before handed out
}

type settleReq struct {
	m       *Message
	nack    bool
	delay   time.Duration
	reply   chan bool  // true: sent on the stream
	outcome chan error // with Confirm: the broker's answer, once sent
}

// errUnconfirmed answers a settlement sent with Confirm whose stream
// ended before the broker's answer came.
var errUnconfirmed = fmt.Errorf("the stream ended before the broker confirmed the settlement, which may or may not have committed: %w", ErrUnavailable)

// Consume subscribes to a queue and returns a running Consumer. It checks
// that the queue exists first. The consumer runs until Close, until ctx
// ends, until it has delivered opts.Max messages, until the broker
// reports an error other than Unavailable, Aborted or ResourceExhausted,
// or until the brokers have refused it with ResourceExhausted for
// opts.ExhaustedTimeout (see Err). Errors: ErrNotFound, ErrInvalidArgument
// (options out of range).
func (c *Client) Consume(ctx context.Context, queue string, opts ConsumeOptions) (*Consumer, error) {
	mode, err := opts.Mode.toPB()
	if err != nil {
		return nil, err
	}
	if opts.Prefetch < 0 || opts.Prefetch > maxPrefetch || opts.Max < 0 || opts.Visibility < 0 || opts.ExhaustedTimeout < 0 {
		return nil, errorf("qbroker: consume %s: prefetch %d not in [0, %d], or negative option: %w",
			queue, opts.Prefetch, maxPrefetch, ErrInvalidArgument)
	}
	if opts.Confirm && opts.Mode != AtLeastOnce {
		return nil, errorf("qbroker: consume %s: Confirm needs at-least-once delivery: %w", queue, ErrInvalidArgument)
	}
	if opts.Priority < MinConsumerPriority || opts.Priority > MaxConsumerPriority {
		return nil, errorf("qbroker: consume %s: priority %d not in [%d, %d]: %w",
			queue, opts.Priority, MinConsumerPriority, MaxConsumerPriority, ErrInvalidArgument)
	}
	if opts.Prefetch == 0 {
		opts.Prefetch = 1
	}
	if opts.ExhaustedTimeout == 0 {
		opts.ExhaustedTimeout = defaultExhaustedTimeout
	}
	qctx, cancel := c.callCtx(ctx, 0)
	_, err = c.rpc.GetQueue(qctx, &pb.GetQueueRequest{Name: queue})
	cancel()
	if err != nil {
		return nil, errorf("qbroker: consume %s: %w", queue, convErr(err))
	}
	k := &Consumer{
		c:       c,
		queue:   queue,
		opts:    opts,
		mode:    mode,
		msgs:    make(chan *Message),
		settles: make(chan settleReq),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
	}
	go k.run(ctx)
	return k, nil
}

// Messages returns the channel of delivered messages. It is closed when
// the consumer ends; Err then tells why.
func (k *Consumer) Messages() <-chan *Message { return k.msgs }

// Next waits for the next message. When the consumer has ended it returns
// Err, or ErrClosed after Close or once Max messages were delivered.
func (k *Consumer) Next(ctx context.Context) (*Message, error) {
	select {
	case m, ok := <-k.msgs:
		if ok {
			return m, nil
		}
		if err := k.Err(); err != nil {
			return nil, err
		}
		return nil, errorf("qbroker: consume %s: %w", k.queue, ErrClosed)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Err returns the error that ended the consumer: nil while it runs, after
// Close and after Max messages; the context's error when its context
// ended; otherwise the broker's error (ErrNotFound when the queue was
// deleted, ErrFailedPrecondition when a KindSync queue is not open,
// ErrResourceExhausted when the brokers kept refusing the stream for
// ExhaustedTimeout, ...).
func (k *Consumer) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Expired returns how many at-least-once deliveries the consumer dropped
// because their lease had run out before the application took them (it
// did not read for longer than the visibility timeout, or they waited
// that long in transit): the broker redelivers those, possibly to another
// consumer already, so handing them out could have the same message
// handled twice at once.
func (k *Consumer) Expired() int64 { return k.expired.Load() }

// Done is closed when the consumer's goroutine has ended.
func (k *Consumer) Done() <-chan struct{} { return k.done }

// Close ends the stream and waits for the consumer's goroutine. It ends
// the stream gracefully: settlements already sent are applied first (for
// up to 5s). At least once, the broker then releases unsettled messages
// for redelivery; at most once, prefetched messages not taken are lost.
// Close returns the error that had ended the consumer before, if any.
func (k *Consumer) Close() error {
	k.closeOnce.Do(func() { close(k.closing) })
	<-k.done
	return k.Err()
}

// settle hands a settlement to the owner goroutine. It reports whether
// it was sent on the stream; false means: call the broker.
func (k *Consumer) settle(ctx context.Context, m *Message, nack bool, delay time.Duration) (bool, error) {
	r := settleReq{m: m, nack: nack, delay: delay, reply: make(chan bool, 1)}
	if k.opts.Confirm {
		r.outcome = make(chan error, 1)
	}
	select {
	case k.settles <- r:
	case <-k.done:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
	var sent bool
	select {
	case sent = <-r.reply:
	case <-ctx.Done():
		// The owner has it and replies at once; the settlement may
		// still go out.
		return false, ctx.Err()
	}
	if !sent || r.outcome == nil {
		return sent, nil
	}
	select {
	case err := <-r.outcome:
		return true, err
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

// drainTimeout bounds the graceful end of a stream.
const drainTimeout = 5 * time.Second

func (k *Consumer) run(ctx context.Context) {
	defer close(k.done)
	l := &consumeLoop{
		k:      k,
		events: make(chan streamEvent),
		bo:     newBackoff(k.c.opts.minBackoff, k.c.opts.maxBackoff),
	}
	err := l.run(ctx)
	switch {
	case err == nil, errors.Is(err, ErrClosed):
		err = nil
		l.drain(ctx)
	case ctx.Err() != nil:
		err = ctx.Err()
	}
	l.endStream()
	if err != nil {
		err = errorf("qbroker: consume %s: %w", k.queue, err)
	}
	k.mu.Lock()
	k.err = err
	k.mu.Unlock()
	l.closeMsgs()
}

// streamEvent is what a stream's receiving goroutine reports.
type streamEvent struct {
	gen     uint64
	opened  pb.Queue_ConsumeClient // the subscribe request was sent
	msgs    []*pb.Message          // one Delivery's messages, in order
	settled []*pb.Settled          // one Delivery's outcomes of settlements
	err     error                  // the stream ended
}

// consumeLoop is the state of the owner goroutine; only it touches it.
type consumeLoop struct {
	k      *Consumer
	events chan streamEvent
	bo     *backoffTimer

	pending    []*Message // received, not yet taken by the application
	handed     int        // messages the application took
	msgsClosed bool
	// headTimer fires when the lease of the pending head runs out, so
	// that a head waiting for the application is dropped, not handed out
	// late; timed is the head it is set for.
	headTimer *time.Timer
	timed     *Message

	// The current stream: gen counts streams; stream is non-nil once the
	// subscribe was sent; credit is granted on it and not yet used.
	gen        uint64
	active     bool
	stream     pb.Queue_ConsumeClient
	stop       context.CancelFunc
	exited     chan struct{}
	credit     int
	owed       int // credit granted while connecting, sent once open
	taken      int // at most once: messages taken since the last grant
	unsettled  int // at least once: taken from this stream, not settled
	openedAt   time.Time
	gotMessage bool

	// exhaustedSince is when the brokers began refusing the stream with
	// ResourceExhausted, without a delivery since; zero otherwise.
	exhaustedSince time.Time

	retry <-chan time.Time // backoff before the next subscribe

	// Settlements gathered for the stream's next request, with the
	// credit they give back (settle); flushAt fires when they must go.
	settles    []*pb.Settle
	settleCred int
	flushTimer *time.Timer
	flushAt    <-chan time.Time
	// With Confirm: the settlements sent and not answered yet, by token.
	confirming map[string]chan error
}

func (l *consumeLoop) atLeastOnce() bool { return l.k.opts.Mode == AtLeastOnce }

// budget is how much more credit Max allows.
func (l *consumeLoop) budget() int {
	if l.k.opts.Max == 0 {
		return maxPrefetch
	}
	return l.k.opts.Max - l.handed - len(l.pending) - l.credit
}

func (l *consumeLoop) finished() bool {
	return l.k.opts.Max > 0 && l.handed >= l.k.opts.Max && l.unsettled == 0
}

// initialCredit is the prefetch of a new stream.
func (l *consumeLoop) initialCredit() int {
	n := l.k.opts.Prefetch - len(l.pending)
	return min(n, l.budget())
}

func (l *consumeLoop) closeMsgs() {
	if !l.msgsClosed {
		l.msgsClosed = true
		close(l.k.msgs)
	}
}

func (l *consumeLoop) run(ctx context.Context) error {
	l.headTimer = time.NewTimer(time.Hour)
	l.headTimer.Stop()
	defer l.headTimer.Stop()
	for {
		if l.finished() {
			return nil
		}
		if !l.active && l.retry == nil && l.initialCredit() > 0 {
			l.subscribe(ctx)
		}
		l.dropExpired()
		var out chan *Message
		var head *Message
		var expiry <-chan time.Time
		if len(l.pending) > 0 && !l.msgsClosed { // closed: Max reached, and then nothing is pending
			out, head = l.k.msgs, l.pending[0]
			expiry = l.expiry(head)
		}
		select {
		case <-expiry:
			// The head's lease ran out while it waited: dropped at the
			// top of the loop (or the timer re-armed, should the clock
			// have been set back).
			l.timed = nil
		case out <- head:
			l.pending[0] = nil
			l.pending = l.pending[1:]
			l.handed++
			if l.atLeastOnce() && head.gen == l.gen && l.active {
				l.unsettled++
			}
			if !l.atLeastOnce() {
				l.took()
			}
			if l.k.opts.Max > 0 && l.handed >= l.k.opts.Max {
				l.closeMsgs()
			}
		case ev := <-l.events:
			if err := l.onEvent(ev); err != nil {
				return err
			}
		case r := <-l.k.settles:
			r.reply <- l.onSettle(r)
		case <-l.flushAt:
			l.flushAt = nil
			l.flush()
		case <-l.retry:
			l.retry = nil
		case <-l.k.closing:
			return ErrClosed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// dropExpired drops the pending at-least-once deliveries at the head
// whose lease has run out (Consumer.Expired counts them). Each gives its
// credit back to its stream: it will never be settled.
func (l *consumeLoop) dropExpired() {
	now := time.Now()
	for len(l.pending) > 0 {
		m := l.pending[0]
		if m.LeaseDeadline.IsZero() || now.Before(m.LeaseDeadline) {
			return
		}
		l.pending[0] = nil
		l.pending = l.pending[1:]
		l.k.expired.Add(1)
		if m.gen == l.gen {
			l.grant(1)
		}
	}
}

// expiry returns a channel that fires when head's lease runs out; nil at
// most once.
func (l *consumeLoop) expiry(head *Message) <-chan time.Time {
	if head.LeaseDeadline.IsZero() {
		return nil
	}
	if l.timed != head {
		l.timed = head
		l.headTimer.Reset(time.Until(head.LeaseDeadline))
	}
	return l.headTimer.C
}

// subscribe starts a stream and its receiving goroutine.
func (l *consumeLoop) subscribe(ctx context.Context) {
	l.gen++
	l.active, l.stream = true, nil
	l.credit, l.owed, l.unsettled, l.taken = l.initialCredit(), 0, 0, 0
	l.gotMessage = false
	sctx, stop := context.WithCancel(ctx)
	l.stop, l.exited = stop, make(chan struct{})
	sub := &pb.Subscribe{
		Queue:             l.k.queue,
		Mode:              l.k.mode,
		VisibilityTimeout: durationOrNil(l.k.opts.Visibility),
		Prefetch:          uint32(l.credit),
		Priority:          int32(l.k.opts.Priority),
		// Several messages per Delivery, up to the prefetch: receive
		// unpacks them, so the application sees no difference.
		MaxBatch: uint32(l.k.opts.Prefetch),
	}
	go l.k.receive(sctx, l.gen, &pb.ConsumeRequest{Subscribe: sub}, l.events, l.exited)
}

// drain ends the current stream gracefully: it half-closes it, so the
// broker applies the settlements sent so far and then ends the stream,
// and waits for that (up to drainTimeout). Settlements asked for
// meanwhile go to the broker directly.
func (l *consumeLoop) drain(ctx context.Context) {
	if l.stream == nil {
		return
	}
	l.flush()
	if err := l.stream.CloseSend(); err != nil {
		return
	}
	t := time.NewTimer(drainTimeout)
	defer t.Stop()
	for {
		select {
		case ev := <-l.events:
			if ev.err != nil {
				return
			}
			l.confirmed(ev.settled)
			// A late delivery: at least once it is released with the
			// stream; at most once it is lost, as documented.
		case r := <-l.k.settles:
			r.reply <- false
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// endStream cancels the current stream and waits for its goroutine.
func (l *consumeLoop) endStream() {
	if !l.active {
		return
	}
	l.stop()
	<-l.exited
	l.active, l.stream, l.credit, l.owed, l.unsettled = false, nil, 0, 0, 0
	// Settlements not sent die with the stream, like those sent and not
	// yet applied: the broker releases the stream's leases.
	l.settles, l.settleCred, l.flushAt = nil, 0, nil
	for _, c := range l.confirming {
		c <- errUnconfirmed
	}
	clear(l.confirming)
	if l.atLeastOnce() {
		// The broker releases the stream's leases: these will be
		// redelivered, so the application must not get them.
		clear(l.pending)
		l.pending = l.pending[:0]
	}
}

func (l *consumeLoop) onEvent(ev streamEvent) error {
	if ev.gen != l.gen || !l.active {
		return nil // cannot happen: old streams are waited for
	}
	switch {
	case ev.opened != nil:
		l.stream, l.openedAt = ev.opened, time.Now()
		if l.owed > 0 {
			_ = l.stream.Send(&pb.ConsumeRequest{Credit: uint32(l.owed)})
			l.owed = 0
		}
	case ev.settled != nil:
		l.confirmed(ev.settled)
	case len(ev.msgs) > 0:
		l.credit = max(l.credit-len(ev.msgs), 0)
		l.gotMessage = true
		for _, m := range ev.msgs {
			l.pending = append(l.pending, l.k.c.message(m, l.k, l.gen))
		}
	default:
		lived := l.stream != nil && time.Since(l.openedAt) > l.bo.max
		l.endStream()
		if !retryable(ev.err) {
			return convErr(ev.err)
		}
		if l.gotMessage || lived {
			l.bo.reset()
			l.exhaustedSince = time.Time{}
		}
		if status.Code(ev.err) != codes.ResourceExhausted {
			l.exhaustedSince = time.Time{}
		} else if l.exhaustedSince.IsZero() {
			l.exhaustedSince = time.Now()
		} else if time.Since(l.exhaustedSince) >= l.k.opts.ExhaustedTimeout {
			// The broker limit holds: say so rather than retry forever.
			return convErr(ev.err)
		}
		l.retry = time.After(l.bo.next())
	}
	return nil
}

// took gives back the credit of a message the application took, at most
// once. Grants are gathered, a quarter of the prefetch at a time, so the
// broker does not receive a stream message per message; a grant goes at
// once when the stream has no credit left, so delivery never waits for
// the rest of a quarter.
func (l *consumeLoop) took() {
	l.taken++
	if l.taken >= max(l.k.opts.Prefetch/4, 1) || l.credit == 0 {
		n := l.taken
		l.taken = 0
		l.grant(n)
	}
}

// grant gives the current stream up to n more credit.
func (l *consumeLoop) grant(n int) {
	if !l.active {
		return // the next stream starts with fresh credit
	}
	n = min(n, l.budget())
	if n <= 0 {
		return
	}
	l.credit += n
	if l.stream == nil {
		l.owed += n
		return
	}
	_ = l.stream.Send(&pb.ConsumeRequest{Credit: uint32(n)}) // a failure ends the stream
}

// onSettle gathers a settlement of the current stream's delivery, with
// the credit it gives back, for the stream's next request: a request
// carries up to a quarter of the prefetch of them, so the broker does not
// receive a stream message per ack. They go at once when the application
// has nothing left to take (it waits for the credit they give back), else
// within settleDelay; with Confirm, the settlements go at once (their
// callers wait for the answers) and the credit as without it.
func (l *consumeLoop) onSettle(r settleReq) bool {
	if l.stream == nil || r.m.gen != l.gen {
		return false
	}
	l.settles = append(l.settles, &pb.Settle{AckToken: r.m.token, Nack: r.nack, Delay: durationOrNil(r.delay), Confirm: r.outcome != nil})
	l.unsettled = max(l.unsettled-1, 0)
	if n := min(1, l.budget()); n > 0 {
		l.settleCred += n
		l.credit += n
	}
	if r.outcome != nil {
		if l.confirming == nil {
			l.confirming = make(map[string]chan error)
		}
		l.confirming[r.m.token] = r.outcome
	}
	quarter := max(l.k.opts.Prefetch/4, 1)
	switch {
	case len(l.settles) >= quarter || l.settleCred >= quarter || len(l.pending) == 0:
		return l.flush()
	case r.outcome != nil:
		// Its caller waits for the answer; the credit waits for a
		// quarter of the prefetch, so the broker claims for the
		// stream in batches as it does without Confirm.
		return l.send(false)
	case l.flushAt == nil:
		if l.flushTimer == nil {
			l.flushTimer = time.NewTimer(settleDelay)
		} else {
			l.flushTimer.Reset(settleDelay)
		}
		l.flushAt = l.flushTimer.C
	}
	return true
}

// confirmed answers the settlements the broker confirmed.
func (l *consumeLoop) confirmed(outcomes []*pb.Settled) {
	for _, o := range outcomes {
		c, ok := l.confirming[o.GetAckToken()]
		if !ok {
			continue
		}
		delete(l.confirming, o.GetAckToken())
		var err error
		if code := codes.Code(o.GetCode()); code != codes.OK {
			err = convErr(status.Error(code, o.GetMessage()))
		}
		c <- err
	}
}

// settleDelay bounds how long a gathered settlement waits for others.
const settleDelay = time.Millisecond

// flush sends the gathered settlements and their credit in one request.
func (l *consumeLoop) flush() bool { return l.send(true) }

// send sends the gathered settlements, with their credit or (withCredit
// false) keeping it for a later request.
func (l *consumeLoop) send(withCredit bool) bool {
	if len(l.settles) == 0 || l.stream == nil {
		return true
	}
	req := &pb.ConsumeRequest{Settle: l.settles}
	l.settles = nil
	if withCredit {
		req.Credit, l.settleCred = uint32(l.settleCred), 0
	}
	if l.flushAt != nil {
		l.flushTimer.Stop()
		l.flushAt = nil
	}
	return l.stream.Send(req) == nil // a failure ends the stream
}

// receive opens a stream, sends the subscribe request and reports
// deliveries until the stream ends or ctx is cancelled.
func (k *Consumer) receive(ctx context.Context, gen uint64, first *pb.ConsumeRequest, events chan<- streamEvent, exited chan<- struct{}) {
	defer close(exited)
	report := func(ev streamEvent) bool {
		ev.gen = gen
		select {
		case events <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	// WaitForReady: while no broker is reachable, wait for one (until
	// ctx ends) rather than fail.
	s, err := k.c.rpc.Consume(ctx, grpc.WaitForReady(true))
	if err == nil {
		if err = s.Send(first); errors.Is(err, io.EOF) {
			_, err = s.Recv() // the stream's status
		}
	}
	if err != nil {
		report(streamEvent{err: err})
		return
	}
	if !report(streamEvent{opened: s}) {
		return
	}
	for {
		d, err := s.Recv()
		if err != nil {
			report(streamEvent{err: err})
			return
		}
		msgs := make([]*pb.Message, 0, 1+len(d.GetMore()))
		if m := d.GetMessage(); m != nil {
			msgs = append(msgs, m)
		}
		msgs = append(msgs, d.GetMore()...)
		if len(d.GetSettled()) > 0 && !report(streamEvent{settled: d.GetSettled()}) {
			return
		}
		if len(msgs) > 0 && !report(streamEvent{msgs: msgs}) {
			return
		}
	}
}

// retryable reports whether a stream that ended with err should be
// re-subscribed.
func retryable(err error) bool {
	if errors.Is(err, io.EOF) {
		return true // the broker ended the stream without an error
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	return false
}

// backoffTimer is exponential backoff with jitter.
type backoffTimer struct {
	min, max, cur time.Duration
}

func newBackoff(lo, hi time.Duration) *backoffTimer {
	return &backoffTimer{min: lo, max: hi}
}

func (b *backoffTimer) reset() { b.cur = 0 }

func (b *backoffTimer) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	// 80%..120%.
	return time.Duration(float64(b.cur) * (0.8 + 0.4*rand.Float64()))
}
