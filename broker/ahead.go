package broker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/qbroker/qbroker/zkqueue"
)

// Claim ahead of credit. A Consume stream with little prefetch waits for
// a ZooKeeper claim after every settlement that gives it credit: the
// claim's round trip sits in each of its consumer's cycles. A queue handle
// therefore keeps a small buffer of at-least-once messages claimed ahead,
// for the streams on this broker that consume the queue with the same
// visibility timeout and at most aheadMaxPrefetch prefetch: whichever of
// them gets credit next takes the buffer's first messages (in queue
// order) without a round trip, while the buffer's filler claims the next
// ones. Receive calls of at most aheadMaxPrefetch messages that may wait
// take from it too (receivers, below).
//
// The buffer is sized by its streams' recent demand (the messages they
// took in the last aheadWindow, and the streams waiting) and bounded by
// aheadMaxCount messages and aheadMaxBytes on the wire. A buffered
// message is held at most aheadMaxHold, and is given back (Unclaim: it
// keeps its place and its delivery count) once its lease has less than
// twice the send margin left, or when the broker's ZooKeeper session
// changed since its claim, so a stream never receives a lease shorter
// than the send margin plus as much again. When the last stream of the
// buffer ends (also on Shutdown) the fillers stop and every buffered
// message is given back at once. A broker that dies with a full buffer
// leaves its leases to the sweep: the messages come back when they
// expire, as the ones its streams held do.
//
// Order. The buffer holds its messages in queue order, and its streams
// take them from the front, so first deliveries keep the queue's order
// as they do when streams claim for themselves; a message given back
// must not break it by coming back after younger ones were handed out.
// Hence: a stream takes nothing at or past the first buffered message
// that may no longer be handed out; the filler gives that message back
// together with every one behind it (all younger), and only then claims
// again, so its next claim (the queue re-read after the give-back) takes
// them first. A message a stream took but does not send goes back to the
// front of the buffer (putBack), not straight to ZooKeeper, so that the
// same rule gives it back. A queue's next buffer, once its last stream
// on the broker ended, claims only after the previous buffer's messages
// are all back.
//
// At-most-once streams do not claim ahead: an at-most-once claim deletes
// the message from ZooKeeper, so a buffered one would be lost with the
// broker, widening the documented loss window from the messages in
// transit to those waiting in the buffer.
const (
	aheadMaxCount    = 512
	aheadMaxBytes    = 512 << 10
	aheadMaxPrefetch = 16
	aheadWindow      = 250 * time.Millisecond
	aheadCheck       = 50 * time.Millisecond
	aheadMaxHold     = time.Second
	// aheadMaxClaim bounds the messages one claim takes; one begun
	// while others are under way takes at least aheadMinClaim.
	aheadMaxClaim = 128
	aheadMinClaim = 32
	// aheadInFlight bounds the claims under way at once. Each chooses
	// its messages before the next one begins, and the buffer takes
	// their messages in the order the claims began, whenever they end
	// (zkqueue.Leases.TakeOrdered), so the buffer stays in queue order
	// while one claim's round trips overlap the next one's.
	aheadInFlight = 4
)

// ahead is one queue handle's buffer of messages claimed ahead of credit
// for its streams of one delivery (see above). Safe for concurrent use.
type ahead struct {
	b *Broker
	q *queue
	d delivery

	users  int // attached streams; guarded by q.aheadMu
	cancel context.CancelFunc
	fill   sync.WaitGroup  // the filler
	after  <-chan struct{} // closed once the queue's previous buffer gave back its messages; nil: none
	gone   chan struct{}   // closed once this buffer gave back its messages (detach)

	mu           sync.Mutex
	buf          []aheadItem
	bytes        int
	waiters      int // streams waiting in get
	pending      int // messages asked for by the claims under way
	pendingBytes int
	size         int           // the buffered messages' recent size on the wire (moving average)
	soonest      time.Time     // no buffered message is due back before then; zero: unknown
	session      int64         // the session all buffered messages were claimed in; -1: several
	served       [2]int        // messages taken in the previous and the current window
	window       time.Time     // when the current window began
	err          error         // the filler's last claim failed with it
	ready        chan struct{} // closed (and replaced) when messages arrive or a claim fails
	want         chan struct{} // signalled when a stream waits or took messages
}

type aheadItem struct {
	c    claimed
	size int       // on the wire
	by   time.Time // given back from then on
}

// attachAhead returns the claim-ahead buffer a subscribed stream takes
// its deliveries from, and the func that detaches it; nil when the stream
// claims for itself: at most once, a sync queue, a large prefetch, or
// another visibility than the buffer's streams'. Only called with
// Config.ClaimAhead.
func (hs *handles) attachAhead(sub subscription) (*ahead, func()) {
	b := hs.b
	q := sub.q
	// A single-active queue's one stream claims for itself: its turn
	// fences each claim by session (active.go), and a buffer would hold
	// leases that keep the next turn waiting.
	if !sub.d.ack || q.sync != nil || sub.prefetch > aheadMaxPrefetch || q.h.Active != "" {
		return nil, func() {}
	}
	q.aheadMu.Lock()
	defer q.aheadMu.Unlock()
	a := q.ahead
	if a == nil {
		ctx, cancel := context.WithCancel(b.ctx)
		a = &ahead{b: b, q: q, d: sub.d, cancel: cancel, after: q.aheadGone, gone: make(chan struct{}),
			window: time.Now(), ready: make(chan struct{}), want: make(chan struct{}, 1)}
		q.ahead = a
		a.fill.Add(1)
		go a.run(ctx)
	} else if a.d != sub.d {
		return nil, func() {}
	}
	a.users++
	return a, func() { a.detach() }
}

// receivers keeps a queue's buffer attached for its Receive calls. A
// unary call has no stream whose end detaches it, so the first Receive
// that may take from the buffer attaches it, and it stays attached while
// Receive calls keep coming: it is detached (and what it buffered given
// back) once no call used it for aheadMaxHold, or when the broker shuts
// down. Its goroutine is the broker's (b.wg).
type receivers struct {
	a     *ahead
	inUse int       // Receive calls taking from a; guarded by q.aheadMu
	last  time.Time // when the latest of them ended; guarded by q.aheadMu
}

// receiveAhead returns the buffer a Receive call of sub.prefetch messages
// takes from, and the func the call runs when done with it; nil when the
// call claims for itself (see attachAhead). Only called with
// Config.ClaimAhead, for calls that may wait.
func (hs *handles) receiveAhead(sub subscription) (*ahead, func()) {
	b, q := hs.b, sub.q
	q.aheadMu.Lock()
	r := q.recv
	if r != nil && r.a.d == sub.d && sub.prefetch <= aheadMaxPrefetch {
		r.inUse++
		q.aheadMu.Unlock()
		return r.a, func() { r.done(q) }
	}
	q.aheadMu.Unlock()
	if r != nil || b.ctx.Err() != nil {
		return nil, func() {}
	}
	a, detach := hs.attachAhead(sub)
	if a == nil {
		return nil, func() {}
	}
	q.aheadMu.Lock()
	if q.recv != nil { // another call attached it first
		q.aheadMu.Unlock()
		detach()
		return hs.receiveAhead(sub)
	}
	r = &receivers{a: a, inUse: 1}
	q.recv = r
	q.aheadMu.Unlock()
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		r.linger(b.ctx, q)
		detach()
	}()
	return a, func() { r.done(q) }
}

func (r *receivers) done(q *queue) {
	q.aheadMu.Lock()
	r.inUse--
	r.last = time.Now()
	q.aheadMu.Unlock()
}

// linger returns once no Receive call used the buffer for aheadMaxHold,
// or ctx ended, with q.recv cleared: the caller detaches the buffer.
func (r *receivers) linger(ctx context.Context, q *queue) {
	t := time.NewTimer(aheadMaxHold)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		q.aheadMu.Lock()
		if ctx.Err() == nil && r.inUse > 0 {
			q.aheadMu.Unlock()
			t.Reset(aheadMaxHold) // idle at the earliest once the calls in use end
			continue
		}
		if idle := time.Since(r.last); ctx.Err() == nil && idle < aheadMaxHold {
			q.aheadMu.Unlock()
			t.Reset(aheadMaxHold - idle)
			continue
		}
		q.recv = nil
		q.aheadMu.Unlock()
		return
	}
}

// detach ends one stream's use of the buffer. The last one stops the
// filler and gives back what is buffered; the queue's next buffer claims
// only once that is done (and, before it, the previous buffer's
// give-back), so none of its streams receives a message younger than one
// still being given back.
func (a *ahead) detach() {
	q := a.q
	q.aheadMu.Lock()
	a.users--
	last := a.users == 0
	if last && q.ahead == a {
		q.ahead = nil
		q.aheadGone = a.gone
	}
	q.aheadMu.Unlock()
	if !last {
		return
	}
	a.cancel()
	a.fill.Wait()
	a.mu.Lock()
	items := a.buf
	a.buf, a.bytes = nil, 0
	a.mu.Unlock()
	a.giveBack(items)
	if a.after != nil {
		<-a.after // bounded: a give-back runs under releaseTimeout
	}
	close(a.gone)
}

// get takes up to max buffered deliveries, no more than maxBytes of them
// on the wire (the first always), waiting for the first until ctx ends.
// It stops at the first buffered message that may no longer be handed
// out: the filler gives it back with the ones behind it. It returns the
// filler's error when a claim failed and nothing is buffered.
func (a *ahead) get(ctx context.Context, max, maxBytes int) ([]claimed, error) {
	a.mu.Lock()
	for {
		now := time.Now()
		var out []claimed
		bytes := 0
		for len(a.buf) > 0 && len(out) < max {
			it := a.buf[0]
			if !a.keep(it, now) || len(out) > 0 && bytes+it.size > maxBytes {
				break
			}
			a.pop()
			out = append(out, it.c)
			bytes += it.size
		}
		a.roll(now)
		a.served[1] += len(out)
		if len(out) > 0 {
			// The filler is woken only when it may have a claim to
			// begin, not for every message taken.
			low := len(a.buf)+a.pending <= a.target()/2
			a.mu.Unlock()
			if low {
				a.poke()
			}
			return out, nil
		}
		err, ready := a.err, a.ready
		if err == nil {
			a.waiters++
		}
		a.mu.Unlock()
		a.poke()
		if err != nil {
			return nil, err
		}
		select {
		case <-ready:
		case <-ctx.Done():
		}
		a.mu.Lock()
		a.waiters--
		if ctx.Err() != nil {
			a.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// pop drops the first buffered message; a.mu is held.
func (a *ahead) pop() {
	a.bytes -= a.buf[0].size
	a.buf[0] = aheadItem{}
	a.buf = a.buf[1:]
}

// putBack returns to the front of the buffer, in their order, messages a
// stream took from it but did not send (their lease ran short, or they
// were behind a send that stalled): they are older than every buffered
// one. They are not handed out again: the filler gives them back, with
// the ones behind them, before it claims again, and no stream takes past
// them meanwhile.
func (a *ahead) putBack(cs []claimed) {
	if len(cs) == 0 {
		return
	}
	a.mu.Lock()
	its := make([]aheadItem, len(cs), len(cs)+len(a.buf))
	for i, c := range cs {
		its[i] = aheadItem{c: c, size: len(c.m.Payload) + msgOverhead(c.msg.GetQueue())} // by: zero, given back
		a.bytes += its[i].size
	}
	a.buf = append(its, a.buf...)
	a.soonest = time.Time{}
	a.mu.Unlock()
	a.poke()
}

// keep reports whether a buffered message may still be handed out.
func (a *ahead) keep(it aheadItem, now time.Time) bool {
	return now.Before(it.by) && a.b.claims.sendable(a.d, it.c)
}

// roll starts a new demand window when the current one is over; a.mu is
// held.
func (a *ahead) roll(now time.Time) {
	switch el := now.Sub(a.window); {
	case el >= 2*aheadWindow:
		a.served = [2]int{}
		a.window = now
	case el >= aheadWindow:
		a.served = [2]int{a.served[1], 0}
		a.window = a.window.Add(aheadWindow)
	}
}

func (a *ahead) poke() {
	select {
	case a.want <- struct{}{}:
	default:
	}
}

// target is how many messages the buffer holds or claims for its streams
// (see need); a.mu is held.
func (a *ahead) target() int {
	demand := max(a.served[0], a.served[1])
	return min(aheadMaxCount, a.waiters+(demand+1)/2)
}

// need reserves the messages, and bytes, the filler claims next, and
// whether the claim waits for the first: only when a stream waits,
// nothing is buffered and no other claim is under way (underway). The
// target is what the streams took in the last aheadWindow / 2, plus the
// streams waiting; a claim tops the buffer up to it once it is half empty
// (or a stream waits), so each round trip claims many; done returns the
// reservation.
func (a *ahead) need(underway int) (n, bytes int, block bool, done func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.roll(time.Now())
	target := a.target()
	have := len(a.buf) + a.pending
	n = min(target-have, aheadMaxClaim)
	if n > 0 && underway > 0 {
		n = max(n, aheadMinClaim) // not a slot of aheadInFlight for a few
	}
	// Each claim gets its share of the bytes, and asks for no more
	// messages than fit in three quarters of it at their recent size: a
	// claim that runs out of room makes the ones begun after it give
	// back what they took (run).
	bytes = min(aheadMaxBytes-a.bytes-a.pendingBytes, aheadMaxBytes/aheadInFlight)
	if a.size > 0 {
		n = min(n, max(1, bytes*3/4/a.size))
	}
	if n <= 0 || bytes <= 0 || (a.waiters == 0 && have > target/2) {
		return 0, 0, false, nil
	}
	block = a.waiters > 0 && len(a.buf) == 0 && underway == 0
	a.pending += n
	a.pendingBytes += bytes
	return n, bytes, block, func() {
		a.mu.Lock()
		a.pending -= n
		a.pendingBytes -= bytes
		a.mu.Unlock()
	}
}

// fill is one claim of the filler's, under way or ended.
type fill struct {
	done   func()        // returns need's reservation
	picked chan struct{} // closed once the claim chose its messages
	end    chan struct{} // closed once it ended; then:
	cs     []claimed
	full   bool // a message did not fit: it stays first in line
	err    error
}

// run is the filler: it claims what need asks for, up to aheadInFlight
// claims at once, adds their messages to the buffer in the order the
// claims began, and gives back the buffered messages that may no longer
// be handed out (expire), until ctx ends. It claims only once the
// queue's previous buffer gave back its messages. The claims' goroutines
// are its own: it waits for them before it returns, and gives back what
// they took.
//
// Order: a message given back (by expire, or one a claim found no room
// for) is older than what the claims under way take, so while any is
// under way the filler begins no claim, and gives back what they took as
// they end (spoiled); its next claim then takes the message first.
func (a *ahead) run(ctx context.Context) {
	defer a.fill.Done()
	if a.after != nil {
		select {
		case <-a.after:
		case <-ctx.Done():
			return
		}
	}
	t := time.NewTicker(aheadCheck)
	defer t.Stop()
	var line []*fill // claims under way, in the order they began
	defer func() {
		for _, f := range line {
			<-f.end
			f.done()
			a.giveBack(items(f.cs, a.d)) // detach drains the buffer once the filler ends
		}
	}()
	spoiled := false            // the claims under way give back what they take
	idle := false               // the last claim found nothing or failed: wait for a stream or the ticker
	var picking <-chan struct{} // the newest claim's, until it chose its messages
	for {
		for len(line) > 0 && ended(line[0]) {
			f := line[0]
			line = line[1:]
			f.done()
			if spoiled {
				a.giveBack(items(f.cs, a.d))
				continue
			}
			if len(f.cs) > 0 {
				a.add(f.cs)
			}
			switch {
			case f.err != nil && !errors.Is(f.err, zkqueue.ErrEmpty):
				a.failed(f.err)
				idle = true // tried again for a stream that waits, or on the ticker
			case len(f.cs) == 0:
				idle = true
			}
			spoiled = f.full
		}
		if a.expire() {
			spoiled = true
		}
		if len(line) == 0 {
			spoiled = false
		}
		if len(line) == 0 || ended(line[len(line)-1]) {
			picking = nil
		}
		if !spoiled && !idle && picking == nil && len(line) < aheadInFlight {
			if n, bytes, block, done := a.need(len(line)); n > 0 {
				a.retry()
				f := a.start(ctx, n, bytes, block, done)
				line = append(line, f)
				picking = f.picked
				continue
			}
		}
		var next <-chan struct{}
		if len(line) > 0 {
			next = line[0].end
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			idle = false
		case <-a.want:
			idle = false
		case <-picking:
			picking = nil
		case <-next:
		}
	}
}

// start begins a claim of up to n messages, no more than bytes of them.
func (a *ahead) start(ctx context.Context, n, bytes int, block bool, done func()) *fill {
	f := &fill{done: done, picked: make(chan struct{}), end: make(chan struct{})}
	session := a.b.member.sessions.Load()
	go func() {
		defer close(f.end)
		ls, full, err := a.q.leases.TakeOrdered(ctx, zkqueue.TakeRequest{Max: n, Room: room(a.q, bytes),
			TTL: a.d.ttl, Block: block, Picked: func() { close(f.picked) }})
		f.cs, f.full, f.err = a.b.claims.leased(a.q, ls, session), full, err
		if err != nil {
			f.err = a.b.handles.gone(a.q, err)
		}
	}()
	return f
}

func ended(f *fill) bool {
	select {
	case <-f.end:
		return true
	default:
		return false
	}
}

// items wraps fresh claims for the buffer.
func items(cs []claimed, d delivery) []aheadItem {
	out := make([]aheadItem, len(cs))
	now := time.Now()
	for i, c := range cs {
		by := c.expires.Add(-2 * sendMargin(d.ttl))
		if hold := now.Add(aheadMaxHold); hold.Before(by) {
			by = hold
		}
		out[i] = aheadItem{c: c, size: len(c.m.Payload) + msgOverhead(c.msg.GetQueue()), by: by}
	}
	return out
}

func (a *ahead) add(cs []claimed) {
	its := items(cs, a.d)
	a.mu.Lock()
	if len(a.buf) == 0 {
		a.soonest, a.session = its[0].by, its[0].c.session
	}
	for _, it := range its {
		if it.by.Before(a.soonest) {
			a.soonest = it.by
		}
		if it.c.session != a.session {
			a.session = -1
		}
		a.buf = append(a.buf, it)
		a.bytes += it.size
		if a.size == 0 {
			a.size = it.size
		}
		a.size += (it.size - a.size) / 16
	}
	a.err = nil
	close(a.ready)
	a.ready = make(chan struct{})
	a.mu.Unlock()
}

// failed hands a claim's error to the waiting streams, as their own claim
// would have.
func (a *ahead) failed(err error) {
	a.mu.Lock()
	a.err = err
	close(a.ready)
	a.ready = make(chan struct{})
	a.mu.Unlock()
}

// retry clears the last claim's error before the next claim: it stands
// for the streams that waited for that one only.
func (a *ahead) retry() {
	a.mu.Lock()
	a.err = nil
	a.mu.Unlock()
}

// expire gives back the first buffered message that may no longer be
// handed out and every one behind it, in order, and reports whether it
// gave back any; the filler claims again only after, so the queue re-read
// by its next claim has them back ahead of anything it did not claim yet.
// Giving back only the stale ones would let the streams take the younger
// ones behind them first. It looks at each message only when one may be
// due (soonest) or the session changed: the filler runs it on every turn.
func (a *ahead) expire() (gaveBack bool) {
	now := time.Now()
	a.mu.Lock()
	if m := &a.b.member; now.Before(a.soonest) && m.hasSession.Load() && m.sessions.Load() == a.session {
		a.mu.Unlock()
		return false
	}
	i := 0
	a.soonest, a.session = time.Time{}, a.b.member.sessions.Load()
	for i < len(a.buf) && a.keep(a.buf[i], now) {
		if it := a.buf[i]; i == 0 || it.by.Before(a.soonest) {
			a.soonest = it.by
		}
		i++
	}
	var stale []aheadItem
	if i < len(a.buf) {
		stale = append(stale, a.buf[i:]...)
		for _, it := range stale {
			a.bytes -= it.size
		}
		clear(a.buf[i:])
		a.buf = a.buf[:i]
	}
	a.mu.Unlock()
	a.giveBack(stale)
	return len(stale) > 0
}

// giveBack undoes buffered claims, in order: the messages keep their
// place and delivery count and are ready at once (the queue is re-read).
// A failed give-back leaves the lease to the sweep: that message comes
// back when its lease expires, like a redelivery.
func (a *ahead) giveBack(its []aheadItem) {
	if len(its) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	for _, it := range its {
		if err := a.q.leases.Unclaim(ctx, it.c.lease); err != nil {
			a.b.log.Debug("giving back a message claimed ahead failed; the sweep releases it", "queue", a.q.name, "err", err)
		}
	}
}
