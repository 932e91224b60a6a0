package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/faults"
)

// callTimeout bounds every unary call of the suite's clients: a call to a
// paused broker fails with DeadlineExceeded (an uncertain outcome) rather
// than hang.
const callTimeout = 5 * time.Second

// scenario is one fault scenario: a cluster, the loads running through
// it (one queue and checker per delivery mode), and the checks every
// scenario ends with.
type scenario struct {
	t       *testing.T
	name    string
	c       *cluster
	admin   *qbroker.Client
	zk      *zk.Conn
	loads   []*load
	clients []*qbroker.Client
	dead    []int64  // ZooKeeper sessions of brokers killed or cut off
	checks  []func() // run by finish once the queues drained, before the verdicts
	ctx     context.Context
	cancel  context.CancelFunc
}

func newScenario(t *testing.T, name string, o clusterOptions) *scenario {
	t.Helper()
	c := newCluster(t, name, o)
	ctx, cancel := context.WithCancel(context.Background())
	s := &scenario{t: t, name: name, c: c, ctx: ctx, cancel: cancel, zk: c.zkConn()}
	s.admin = s.dial(c.addrs()...)
	t.Cleanup(s.close)
	return s
}

// dial returns a client of the given brokers, closed with the scenario.
func (s *scenario) dial(addrs ...string) *qbroker.Client {
	s.t.Helper()
	cl, err := qbroker.Dial(s.ctx, strings.Join(addrs, ","),
		qbroker.WithCallTimeout(callTimeout), qbroker.WithReconnectBackoff(50*time.Millisecond, time.Second))
	if err != nil {
		s.t.Fatal(err)
	}
	s.clients = append(s.clients, cl)
	return cl
}

// close stops the loads, then closes the clients.
func (s *scenario) close() {
	for _, l := range s.loads {
		l.stop()
	}
	s.cancel()
	for _, cl := range s.clients {
		_ = cl.Close()
	}
}

// loadOptions shape one queue's traffic.
type loadOptions struct {
	producers int           // publishing goroutines, each with its own client of every broker
	pace      time.Duration // pause between a producer's publishes
	batch     int           // messages per publish: 1..batch
	size      int           // payload bytes
	perProd   int           // most messages a producer publishes
	streams   []int         // one Consume stream consumer on each of these brokers
	prefetch  int           // of the stream consumers
	receivers int           // Receive consumers, each with a client of every broker
	receiveOn []int         // one more Receive consumer with a client of only this broker, per entry
	maxRecv   int           // messages per Receive
	parallel  bool          // at least once, Receive consumers ack a Receive's messages at once, in parallel
	vis       time.Duration // visibility timeout of the queue; 0: visibility
	quiet     bool          // no producers: the scenario publishes with burst
	packed    bool          // a packed queue (QueueOptions.Packed): a publish's messages share a node
}

func (o *loadOptions) defaults() {
	if o.producers == 0 && !o.quiet {
		o.producers = 2
	}
	if o.pace == 0 {
		o.pace = 20 * time.Millisecond
	}
	if o.vis == 0 {
		o.vis = visibility
	}
	if o.batch == 0 {
		o.batch = 3
	}
	if o.size == 0 {
		o.size = 100
	}
	if o.perProd == 0 {
		o.perProd = 20_000
	}
	if o.prefetch == 0 {
		o.prefetch = 8
	}
	if o.maxRecv == 0 {
		o.maxRecv = 8
	}
}

// load is the traffic of one queue: producers publishing numbered
// messages, consumers taking them, every outcome told to the checker.
type load struct {
	s     *scenario
	queue string
	mode  qbroker.DeliveryMode
	o     loadOptions
	check *faults.Checker

	stopProd  chan struct{}
	prodOnce  sync.Once
	prodWG    sync.WaitGroup
	consCtx   context.Context
	consStop  context.CancelFunc
	consWG    sync.WaitGroup
	consOnce  sync.Once
	mu        sync.Mutex
	consumers []*qbroker.Consumer
	streams   int // Consume stream consumers started
	burstSeq  int
	gates     map[string]*gate // by consumer
	acking    atomic.Int64     // Ack calls of Receive consumers under way
}

// gate stops a stream consumer once it received one of keys: it holds
// that message (recorded, unsettled) and leaves the rest of its prefetch
// pending in the client until the gate opens.
type gate struct {
	keys map[faults.Key]bool
	held bool          // the consumer waits at the gate
	open chan struct{} // closed by release
}

// load creates a queue for mode and starts its traffic.
func (s *scenario) load(mode qbroker.DeliveryMode, o loadOptions) *load {
	s.t.Helper()
	o.defaults()
	l := &load{s: s, queue: fmt.Sprintf("%s-%s", s.name, mode), mode: mode, o: o,
		check: faults.NewChecker(mode), stopProd: make(chan struct{}), gates: map[string]*gate{}}
	if o.packed {
		l.queue += "-packed"
	}
	l.consCtx, l.consStop = context.WithCancel(s.ctx)
	if _, err := s.admin.CreateQueue(s.ctx, l.queue, qbroker.QueueOptions{VisibilityTimeout: o.vis, Packed: o.packed}); err != nil {
		s.t.Fatalf("create %s: %v", l.queue, err)
	}
	s.loads = append(s.loads, l)
	for _, b := range o.streams {
		l.startStream(b)
	}
	for i := range o.receivers {
		cl := s.dial(s.c.addrs()...)
		l.consWG.Add(1)
		go l.receive(cl, fmt.Sprintf("receiver-%d", i))
	}
	for i, b := range o.receiveOn {
		cl := s.dial(s.c.addrs(b)...)
		l.consWG.Add(1)
		go l.receive(cl, fmt.Sprintf("receiver@%d-%d", b, i))
	}
	for p := range o.producers {
		cl := s.dial(s.c.addrs()...)
		l.prodWG.Add(1)
		go l.produce(cl, p)
	}
	return l
}

// label names the load's rows in the results: the scenario, and
// "(packed)" for a packed queue.
func (l *load) label() string {
	if l.o.packed {
		return l.s.name + " (packed)"
	}
	return l.s.name
}

// streamName names the stream consumers on broker b.
func streamName(b int) string { return fmt.Sprintf("stream@%d", b) }

// startStream opens a Consume stream consumer on broker b.
func (l *load) startStream(b int) {
	s := l.s
	cl := s.dial(s.c.addrs(b)...)
	who := streamName(b)
	var cons *qbroker.Consumer
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		cons, err = cl.Consume(l.consCtx, l.queue, qbroker.ConsumeOptions{Mode: l.mode, Prefetch: l.o.prefetch})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("consume %s on broker %d: %v", l.queue, b, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	l.mu.Lock()
	l.consumers = append(l.consumers, cons)
	l.streams++
	l.mu.Unlock()
	l.consWG.Add(1)
	go func() {
		defer l.consWG.Done()
		for m := range cons.Messages() {
			at := time.Now()
			k, ok := l.record(m, at, who)
			if ok {
				l.passGate(who, k)
			}
			if ok && l.mode == qbroker.AtLeastOnce {
				// On the stream: no outcome to record.
				_ = m.Ack(l.consCtx)
			}
		}
	}()
}

func (l *load) record(m *qbroker.Message, at time.Time, who string) (faults.Key, bool) {
	k, err := faults.ParsePayload(m.Payload)
	if err != nil {
		l.check.Corrupt(m.ID, err)
		return k, false
	}
	l.check.Delivered(faults.Delivery{Key: k, ID: m.ID, Count: m.DeliveryCount, Deadline: m.LeaseDeadline, At: at, Consumer: who})
	return k, true
}

// receive takes messages with Receive; at least once it acks each with the
// Ack call, whose outcome it records.
func (l *load) receive(cl *qbroker.Client, who string) {
	defer l.consWG.Done()
	for l.consCtx.Err() == nil {
		ms, err := cl.Receive(l.consCtx, l.queue, qbroker.ReceiveOptions{Max: l.o.maxRecv, Wait: 500 * time.Millisecond, Mode: l.mode})
		at := time.Now()
		if err != nil {
			if l.consCtx.Err() != nil {
				return // stopped after the queue drained: nothing left to claim
			}
			if l.o.packed {
				l.check.PackReceiveFailed(l.o.maxRecv, l.maxClaim(), at, err)
			} else {
				l.check.ReceiveFailed(l.o.maxRecv, err)
			}
			sleep(l.consCtx, 50*time.Millisecond)
			continue
		}
		var acks sync.WaitGroup
		for _, m := range ms {
			k, ok := l.record(m, at, who)
			if !ok || l.mode != qbroker.AtLeastOnce {
				continue
			}
			if !l.o.parallel {
				err := m.Ack(l.consCtx)
				l.check.Acked(k, time.Now(), err)
				continue
			}
			acks.Add(1)
			l.acking.Add(1)
			go func() {
				defer acks.Done()
				defer l.acking.Add(-1)
				err := m.Ack(l.consCtx)
				l.check.Acked(k, time.Now(), err)
			}()
		}
		acks.Wait()
	}
}

// hold sets a gate on the stream consumers named who (streamName): the
// first of them to receive one of keys stops there until release.
func (l *load) hold(who string, keys []faults.Key) {
	g := &gate{keys: map[faults.Key]bool{}, open: make(chan struct{})}
	for _, k := range keys {
		g.keys[k] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if old := l.gates[who]; old != nil {
		close(old.open)
	}
	l.gates[who] = g
}

// holding reports whether a consumer named who waits at its gate.
func (l *load) holding(who string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.gates[who]
	return g != nil && g.held
}

// release opens who's gate.
func (l *load) release(who string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.gates[who]; g != nil {
		close(g.open)
		delete(l.gates, who)
	}
}

// passGate waits at who's gate if k is one of its keys, until it opens
// or the consumers stop.
func (l *load) passGate(who string, k faults.Key) {
	l.mu.Lock()
	g := l.gates[who]
	if g == nil || !g.keys[k] {
		l.mu.Unlock()
		return
	}
	g.held = true
	l.mu.Unlock()
	select {
	case <-g.open:
	case <-l.consCtx.Done():
	}
}

// produce publishes numbered messages until stopped or perProd are out.
func (l *load) produce(cl *qbroker.Client, p int) {
	defer l.prodWG.Done()
	rng := rand.New(rand.NewPCG(uint64(p), uint64(time.Now().UnixNano())))
	for seq := 1; seq <= l.o.perProd; {
		select {
		case <-l.stopProd:
			return
		default:
		}
		n := min(1+rng.IntN(l.o.batch), l.o.perProd-seq+1)
		keys := make([]faults.Key, n)
		msgs := make([]qbroker.OutMessage, n)
		for i := range n {
			keys[i] = faults.Key{Producer: p, Seq: seq + i}
			msgs[i] = qbroker.OutMessage{Payload: faults.Payload(keys[i], l.o.size)}
		}
		seq += n
		start := time.Now()
		ids, err := cl.PublishBatch(l.s.ctx, l.queue, msgs)
		l.check.Published(keys, start, err)
		l.check.Stored(keys, ids)
		pause := l.o.pace
		if err != nil {
			pause = 50 * time.Millisecond
		}
		select {
		case <-l.stopProd:
			return
		case <-time.After(pause):
		}
	}
}

// burst publishes n messages in one batch, as the producer numbered after
// the regular ones, and returns the call's error.
func (l *load) burst(cl *qbroker.Client, n int) error {
	return l.publishKeys(cl, l.burstKeys(n))
}

// burstKeys returns the keys of the next burst of n messages.
func (l *load) burstKeys(n int) []faults.Key {
	keys := make([]faults.Key, n)
	for i := range n {
		l.burstSeq++
		keys[i] = faults.Key{Producer: l.o.producers, Seq: l.burstSeq}
	}
	return keys
}

// publishKeys publishes the messages of keys in one batch and returns
// the call's error.
func (l *load) publishKeys(cl *qbroker.Client, keys []faults.Key) error {
	msgs := make([]qbroker.OutMessage, len(keys))
	for i, k := range keys {
		msgs[i] = qbroker.OutMessage{Payload: faults.Payload(k, l.o.size)}
	}
	start := time.Now()
	ids, err := cl.PublishBatch(l.s.ctx, l.queue, msgs)
	l.check.Published(keys, start, err)
	l.check.Stored(keys, ids)
	return err
}

func (l *load) stopProducers() {
	l.prodOnce.Do(func() { close(l.stopProd) })
	l.prodWG.Wait()
}

// stopConsumers closes the consumers and waits for their goroutines.
func (l *load) stopConsumers() {
	l.consOnce.Do(func() {
		l.mu.Lock()
		cs := slices.Clone(l.consumers)
		l.mu.Unlock()
		for _, c := range cs {
			_ = c.Close()
		}
		l.consStop()
	})
	l.consWG.Wait()
}

// ended describes the stream consumers that ended by themselves (a
// broker error they do not retry), for a failure message.
func (l *load) ended() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for i, c := range l.consumers {
		select {
		case <-c.Done():
			out = append(out, fmt.Sprintf("consumer %d ended: %v", i, c.Err()))
		default:
		}
	}
	if len(out) == 0 {
		return ""
	}
	return " (" + strings.Join(out, "; ") + ")"
}

func (l *load) stop() {
	l.stopProducers()
	l.stopConsumers()
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// fail records a problem on every load's checker, so every row of the
// scenario shows it.
func (s *scenario) fail(format string, args ...any) {
	s.t.Logf(format, args...)
	for _, l := range s.loads {
		l.check.Fail(format, args...)
	}
}

// mark records a fault or a heal on every load and returns its time.
func (s *scenario) mark(kind faults.MarkKind, what string) time.Time {
	now := time.Now()
	s.t.Logf("%s: %s", map[faults.MarkKind]string{faults.Fault: "fault", faults.Heal: "heal"}[kind], what)
	for _, l := range s.loads {
		l.check.Mark(kind, what, now)
	}
	return now
}

// waitFor polls cond every 100ms until it holds or within passes.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// progress waits until every load delivered n more messages than now.
func (s *scenario) progress(n int, within time.Duration, what string) bool {
	base := make([]int, len(s.loads))
	for i, l := range s.loads {
		_, base[i] = l.check.Progress()
	}
	ok := waitFor(within, func() bool {
		for i, l := range s.loads {
			if _, d := l.check.Progress(); d < base[i]+n {
				return false
			}
		}
		return true
	})
	if !ok {
		s.fail("%s: fewer than %d messages delivered within %v", what, n, within)
	}
	return ok
}

// recovered waits until every load delivered a message published after t:
// publishing and consuming work end to end again.
func (s *scenario) recovered(t time.Time, within time.Duration, what string) bool {
	ok := waitFor(within, func() bool {
		for _, l := range s.loads {
			if !l.check.DeliveredAfter(t) {
				return false
			}
		}
		return true
	})
	if !ok {
		s.fail("no end-to-end delivery within %v after %s", within, what)
	}
	return ok
}

// finish ends the scenario: producers stop, the queues drain, consumer and
// broker registrations are checked, and each load's verdict becomes a row
// of the results (failing the test when it fails the bar).
func (s *scenario) finish() {
	s.drain(pick(60*time.Second, 120*time.Second))
	s.checkRegistrations()
	for _, check := range s.checks {
		check()
	}
	for _, l := range s.loads {
		r := l.check.Result()
		s.c.s.addRows(faults.Row{Scenario: l.label(), Result: r})
		s.t.Logf("%s %s: published %d (uncertain %d, refused %d), delivered %d in %d deliveries, redelivered %d, lost %d, in doubt %d, duplicates %d, uncounted %d; errors: %s",
			l.label(), r.Mode, r.Published, r.Uncertain, r.Refused, r.Delivered, r.Deliveries, r.Redelivered, r.Lost, r.InDoubt,
			r.Duplicates, r.Uncounted, r.ErrorSummary())
		if !r.OK {
			s.t.Errorf("%s %s fails the bar:\n%s\n(broker logs: %s)", l.label(), r.Mode, strings.Join(r.Problems, "\n"), s.c.dir)
		}
	}
}

// drain stops the producers and waits until every acknowledged publish
// was delivered and the queues are empty (nothing ready, nothing leased).
// A queue that empties while messages are still missing is given a few
// seconds, then judged as it is (lost, or in doubt at most once).
func (s *scenario) drain(within time.Duration) {
	for _, l := range s.loads {
		l.stopProducers()
	}
	for _, l := range s.loads {
		var st qbroker.Stats
		var err error
		missing, since := -1, time.Now()
		ok := waitFor(within, func() bool {
			st, err = s.admin.Stats(s.ctx, l.queue)
			if err != nil || st.Ready != 0 || st.InFlight != 0 || st.Dead != 0 {
				return false
			}
			m := l.check.Missing()
			if m != missing {
				missing, since = m, time.Now()
			}
			return m == 0 || time.Since(since) > 5*time.Second
		})
		if !ok {
			l.check.Fail("queue %s did not drain within %v: %d acknowledged publishes undelivered; stats ready %d, in flight %d, dead %d (err %v)",
				l.queue, within, l.check.Missing(), st.Ready, st.InFlight, st.Dead, err)
		}
	}
}

// checkRegistrations checks what the brokers registered in ZooKeeper
// after the faults: one consumer registration per open Consume stream,
// none once the consumers are closed, and one broker registration per
// running broker, owned by a live session.
func (s *scenario) checkRegistrations() {
	const within = 30 * time.Second
	for _, l := range s.loads {
		l.mu.Lock()
		want := l.streams
		l.mu.Unlock()
		var st qbroker.Stats
		if !waitFor(within, func() bool {
			var err error
			st, err = s.admin.Stats(s.ctx, l.queue)
			return err == nil && st.Consumers == want
		}) {
			regs, _, _ := s.zk.Children(s.c.root + "/queues/" + l.queue + "/consumers")
			slices.Sort(regs)
			l.check.Fail("%s: Stats counts %d consumers with %d Consume streams open (registrations %v, streams on brokers %v)%s",
				l.queue, st.Consumers, want, regs, l.o.streams, l.ended())
		}
	}
	for _, l := range s.loads {
		l.stopConsumers()
	}
	for _, l := range s.loads {
		var st qbroker.Stats
		if !waitFor(within, func() bool {
			var err error
			st, err = s.admin.Stats(s.ctx, l.queue)
			return err == nil && st.Consumers == 0
		}) {
			regs, _, _ := s.zk.Children(s.c.root + "/queues/" + l.queue + "/consumers")
			slices.Sort(regs)
			l.check.Fail("%s: Stats counts %d consumers after every stream closed (leaked registrations %v)", l.queue, st.Consumers, regs)
		}
	}
	var want []string
	for _, p := range s.c.brokers {
		if p.alive() {
			want = append(want, p.id)
		}
	}
	slices.Sort(want)
	var got []string
	var stale []string
	if !waitFor(within, func() bool {
		children, _, err := s.zk.Children(s.c.root + "/brokers")
		if err != nil {
			return false
		}
		slices.Sort(children)
		got, stale = children, nil
		for _, p := range s.c.brokers {
			if owner := s.c.sessionOf(s.zk, p); owner != 0 && slices.Contains(s.dead, owner) {
				stale = append(stale, p.id)
			}
		}
		return slices.Equal(got, want) && len(stale) == 0
	}) {
		s.fail("broker registrations %v (held by dead sessions: %v), want %v", got, stale, want)
	}
}
