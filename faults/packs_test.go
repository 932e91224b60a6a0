package faults_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc/codes"

	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/faults"
)

// packBurst is the size of the bursts published into packed queues to
// make a pack of their own: 100 messages of 100 bytes fit one pack
// (16 KiB by default).
const packBurst = 100

// packedLoad returns o for a packed queue: producers publish batches of
// up to 10 messages, so packs of several messages form (a batch is one
// pack, and the concurrent publishes of a window share one).
func packedLoad(o loadOptions) loadOptions {
	o.packed = true
	if o.batch == 0 {
		o.batch = 10
	}
	if o.pace == 0 {
		o.pace = 40 * time.Millisecond
	}
	return o
}

// maxPack bounds the messages of one pack of l's queue: a burst, or the
// batches of every producer gathered in one window.
func (l *load) maxPack() int {
	return max(packBurst, 2*l.o.producers*l.o.batch)
}

// maxClaimAhead is zkqueue's bound on what one claim of a packed queue
// takes for the takes waiting on it, in messages (weighed by the counts
// in the packs' names); the claim's last pack may pass it by up to a
// pack less one.
const maxClaimAhead = 1000

// maxClaim bounds the messages one claim of l's queue takes: what an
// uncertain Receive of it may lose at most once (PackReceiveFailed).
func (l *load) maxClaim() int {
	return maxClaimAhead + l.maxPack() - 1
}

// holdPack publishes bursts of packBurst messages (one pack each) through
// via until broker b's stream consumer of l receives a message of one:
// broker b claimed that pack. The consumer then holds that message at
// its gate (release opens it), the rest of its prefetch waits in its
// client, and the rest of the pack in broker b's pack buffer. It returns
// the burst's keys, nil when no burst reached broker b in 20 tries.
func (s *scenario) holdPack(l *load, b int, via *qbroker.Client) []faults.Key {
	who := streamName(b)
	for range 20 {
		keys := l.burstKeys(packBurst)
		l.hold(who, keys)
		if err := l.publishKeys(via, keys); err != nil {
			continue
		}
		waitFor(30*time.Second, func() bool { return l.holding(who) || l.allDelivered(keys) })
		if l.holding(who) {
			return keys
		}
	}
	l.release(who)
	s.fail("%s: no burst's pack reached broker %d's stream in 20 tries", l.queue, b)
	return nil
}

// allDelivered reports whether every message of keys was delivered.
func (l *load) allDelivered(keys []faults.Key) bool {
	for _, k := range keys {
		if len(l.check.Deliveries(k)) == 0 {
			return false
		}
	}
	return true
}

// checkCameBack checks, at least once, that the messages of keys that
// broker b had claimed when the fault (what: "killed", "paused", "cut
// off") hit it at `at` came back counted: each one its stream had not
// received by then is delivered again with a delivery count above 1
// (those b's consumers had received come back like any other message,
// judged by the checker).
func (s *scenario) checkCameBack(l *load, keys []faults.Key, b int, at time.Time, what string) {
	who := streamName(b)
	back := 0
	for _, k := range keys {
		ds := l.check.Deliveries(k)
		if slices.ContainsFunc(ds, func(d faults.Delivery) bool { return d.At.Before(at) }) {
			continue // b's consumers had it
		}
		back++
		for _, d := range ds {
			if d.Count < 2 && d.Consumer != who {
				l.check.Fail("%v (%s), claimed in a pack by broker %d before it was %s, delivered again to %s with count %d",
					k, d.ID, b, what, d.Consumer, d.Count)
			}
		}
	}
	s.t.Logf("%s: %d of a pack of %d held by broker %d when it was %s came back", l.queue, back, len(keys), b, what)
}

// logHeld logs what became of the messages of keys that broker b had
// claimed when the fault (what) hit it at `at`: delivered before it, by
// b's stream after it (from b's buffer), by the others with their count
// unchanged (never delivered before: given back by b, or at most once
// put back), by the others counted (swept back after the lease ran out),
// or never (at most once: lost with b's buffer, in doubt up to MayLose).
// The checker judges each delivery; this says which path the pack took.
func (s *scenario) logHeld(l *load, keys []faults.Key, b int, at time.Time, what string) {
	who := streamName(b)
	var before, byB, unchanged, counted, never int
	for _, k := range keys {
		ds := l.check.Deliveries(k)
		switch {
		case len(ds) == 0:
			never++
		case ds[0].At.Before(at):
			before++
		case ds[0].Consumer == who:
			byB++
		case ds[0].Count < 2:
			unchanged++
		default:
			counted++
		}
	}
	s.t.Logf("%s: of a pack of %d held by broker %d when it was %s: %d delivered before, %d by it after, %d by the others unchanged, %d counted, %d never",
		l.queue, len(keys), b, what, before, byB, unchanged, counted, never)
}

// receiveHeld takes up to n messages of l at least once with one Receive
// through via (a client of one broker), records them as who's and holds
// them unsettled: after a holdPack on the same broker they come from the
// pack its buffer holds, so their lease is that pack's. It returns them,
// or nil (a failure) when no Receive returned any within 30s.
func (l *load) receiveHeld(via *qbroker.Client, who string, n int) []*qbroker.Message {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ms, err := via.Receive(l.s.ctx, l.queue, qbroker.ReceiveOptions{Max: n, Wait: time.Second, Mode: qbroker.AtLeastOnce})
		at := time.Now()
		if err != nil {
			l.check.ReceiveFailed(n, err)
			sleep(l.s.ctx, 50*time.Millisecond)
			continue
		}
		var held []*qbroker.Message
		for _, m := range ms {
			if _, ok := l.record(m, at, who); ok {
				held = append(held, m)
			}
		}
		if len(held) > 0 {
			return held
		}
	}
	l.check.Fail("%s: %s received nothing to hold within 30s", l.queue, who)
	return nil
}

// freshAt reports whether broker b still held the pack of keys whole in
// its buffer at `at`: its stream's delivery of it had more than half its
// lease left then. A buffered lease with less than half its time left
// is given back unchanged at the broker's next take, so on a slow
// machine the rest of the pack may go back, uncounted and rightly so,
// before the fault: checkCameBack does not apply to it then.
func (l *load) freshAt(keys []faults.Key, b int, at time.Time) bool {
	who := streamName(b)
	for _, k := range keys {
		for _, d := range l.check.Deliveries(k) {
			if d.Consumer == who && d.At.Before(at) {
				return d.Deadline.Sub(at) > l.o.vis/2
			}
		}
	}
	return false
}

// keysOf returns the keys of ms.
func keysOf(ms []*qbroker.Message) []faults.Key {
	var keys []faults.Key
	for _, m := range ms {
		if k, err := faults.ParsePayload(m.Payload); err == nil {
			keys = append(keys, k)
		}
	}
	return keys
}

// redelivered reports whether every message of keys was delivered with a
// delivery count above 1: its lease ran out and it came back.
func (l *load) redelivered(keys []faults.Key) bool {
	for _, k := range keys {
		if !slices.ContainsFunc(l.check.Deliveries(k), func(d faults.Delivery) bool { return d.Count > 1 }) {
			return false
		}
	}
	return true
}

// lateAcksRefused acks ms through the broker they came from, after a fault
// during which their pack lease expired and they were delivered again:
// the broker must refuse every ack (FailedPrecondition: the lease is
// gone). A call that fails otherwise (the broker still reconnecting) is
// tried again, for up to 30s.
func (l *load) lateAcksRefused(ms []*qbroker.Message, what string) {
	for _, m := range ms {
		k, _ := faults.ParsePayload(m.Payload)
		var err error
		deadline := time.Now().Add(30 * time.Second)
		for {
			err = m.Ack(l.s.ctx)
			if err == nil || faults.Code(err) == codes.FailedPrecondition || time.Now().After(deadline) {
				break
			}
			sleep(l.s.ctx, 200*time.Millisecond)
		}
		switch {
		case err == nil:
			l.check.Fail("late ack of %v (%s), held across %s while its pack lease expired and it was redelivered, was accepted", k, m.ID, what)
		case faults.Code(err) != codes.FailedPrecondition:
			l.check.Fail("late ack of %v (%s), held across %s: %v, want FailedPrecondition", k, m.ID, what, err)
		}
	}
}

// receiveKeys takes messages at least once through cl, up to max per
// Receive, until every message of want arrived (within 30s), recording
// every delivery; it returns those of want by key. Messages outside want
// are acked at once.
func (l *load) receiveKeys(cl *qbroker.Client, who string, want []faults.Key, max int) map[faults.Key]*qbroker.Message {
	got := map[faults.Key]*qbroker.Message{}
	wanted := map[faults.Key]bool{}
	for _, k := range want {
		wanted[k] = true
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < len(want) && time.Now().Before(deadline) {
		ms, err := cl.Receive(l.s.ctx, l.queue, qbroker.ReceiveOptions{Max: max, Wait: time.Second, Mode: qbroker.AtLeastOnce})
		at := time.Now()
		if err != nil {
			l.check.ReceiveFailed(max, err)
			sleep(l.s.ctx, 50*time.Millisecond)
			continue
		}
		var others []*qbroker.Message
		for _, m := range ms {
			k, ok := l.record(m, at, who)
			switch {
			case !ok:
			case wanted[k] && got[k] == nil:
				got[k] = m
			default:
				others = append(others, m)
			}
		}
		l.ackAll(others)
	}
	if len(got) < len(want) {
		var missing []string
		for _, k := range want {
			if got[k] == nil {
				missing = append(missing, k.String())
			}
		}
		l.check.Fail("%s: %s did not receive %s within 30s", l.queue, who, strings.Join(missing, " "))
		// What ZooKeeper holds of the queue, and where the missing went.
		logTree(l.s.t, l.s.zk, l.s.c.root+"/queues/"+l.queue, 0)
		for _, k := range want {
			if got[k] == nil {
				l.s.t.Logf("%v: deliveries so far: %s", k, describe(l.check.Deliveries(k)))
			}
		}
	}
	return got
}

// ackAll acks ms with the Ack call, all at once (the broker coalesces the
// acks of one pack lease into one write), recording each outcome.
func (l *load) ackAll(ms []*qbroker.Message) {
	var wg sync.WaitGroup
	for _, m := range ms {
		k, err := faults.ParsePayload(m.Payload)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := m.Ack(l.s.ctx)
			l.check.Acked(k, time.Now(), err)
		}()
	}
	wg.Wait()
}

// packOf returns the pack that message ids name ("qn-7-0000000042#5" is
// message 5 of pack "qn-7-0000000042").
func packOf(id string) string {
	if i := strings.LastIndexByte(id, '#'); i >= 0 {
		return id[:i]
	}
	return id
}

// onePack checks that the messages of keys were delivered from one pack.
func (l *load) onePack(keys []faults.Key, got map[faults.Key]*qbroker.Message) {
	packs := map[string]bool{}
	for _, k := range keys {
		if m := got[k]; m != nil {
			packs[packOf(m.ID)] = true
		}
	}
	if len(packs) > 1 {
		l.check.Fail("%s: a burst of %d was stored in %d nodes, not one pack", l.queue, len(keys), len(packs))
	}
}

// ordered returns the messages of keys found in got, in the order of keys.
func ordered(keys []faults.Key, got map[faults.Key]*qbroker.Message) []*qbroker.Message {
	var out []*qbroker.Message
	for _, k := range keys {
		if m := got[k]; m != nil {
			out = append(out, m)
		}
	}
	return out
}

// A nack of one message in the middle of a pack, sent at the same moment
// as the acks of its 19 neighbours (the broker applies the settlements of
// one pack lease together): the nacked message alone comes back, counted,
// and is acked; each neighbour is delivered once, and never again. The
// redelivery is taken through either broker.
func TestPackNack(t *testing.T) {
	s := newScenario(t, "pack-nack", clusterOptions{brokers: 2})
	l := s.load(qbroker.AtLeastOnce, loadOptions{quiet: true, packed: true})
	via := []*qbroker.Client{s.dial(s.c.brokers[0].addr), s.dial(s.c.brokers[1].addr)}
	const size = 20
	var nacked, neighbours []faults.Key
	for round := range pick(10, 40) {
		keys := l.burstKeys(size)
		if err := l.publishKeys(s.admin, keys); err != nil {
			t.Fatalf("publish a pack: %v", err)
		}
		got := l.receiveKeys(via[0], "receiver@0", keys, size)
		l.onePack(keys, got)
		middle := keys[size/2]
		var wg sync.WaitGroup
		var nackErr error
		if m := got[middle]; m != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				nackErr = m.Nack(s.ctx, 0)
			}()
		}
		var rest []*qbroker.Message
		for _, m := range ordered(keys, got) {
			if k, _ := faults.ParsePayload(m.Payload); k != middle {
				rest = append(rest, m)
			}
		}
		l.ackAll(rest)
		wg.Wait()
		if nackErr != nil {
			l.check.Fail("nack of %v (%s): %v", middle, got[middle].ID, nackErr)
			continue
		}
		nacked = append(nacked, middle)
		for _, k := range keys {
			if k != middle {
				neighbours = append(neighbours, k)
			}
		}
		// The nacked message comes back, through one broker or the other.
		who := fmt.Sprintf("receiver@%d", round%2)
		again := l.receiveKeys(via[round%2], who, []faults.Key{middle}, size)
		l.ackAll(ordered([]faults.Key{middle}, again))
	}
	for _, k := range nacked {
		ds := l.check.Deliveries(k)
		if len(ds) != 2 || ds[0].Count != 1 || ds[1].Count != 2 {
			l.check.Fail("nacked %v: delivered %d times, want twice with counts 1 and 2: %s", k, len(ds), describe(ds))
		}
	}
	for _, k := range neighbours {
		if ds := l.check.Deliveries(k); len(ds) != 1 {
			l.check.Fail("%v, a neighbour of a nacked message, acked: delivered %d times, want once: %s", k, len(ds), describe(ds))
		}
	}
	s.finish()
}

// A pack lease partly acked expires: a consumer acks some messages of a
// pack of 20 (confirmed), and holds the others past the visibility
// timeout. Only those come back, counted, through the other broker; the
// acked ones never. Late acks of the held copies are refused. In the
// second kind of cycle the consumer's Receive takes 5 of the pack (the
// other 15 wait in broker 0's pack buffer), acks 2 and holds 3, and
// broker 0 is paused with SIGSTOP at once, past its session timeout and
// the visibility timeout: the 18 come back through broker 1, and once
// continued broker 0 must not hand out the stale copies its buffer held.
func TestPackExpiry(t *testing.T) {
	s := newScenario(t, "pack-expiry", clusterOptions{brokers: 2})
	l := s.load(qbroker.AtLeastOnce, loadOptions{quiet: true, packed: true})
	victim := s.c.brokers[0]
	via := []*qbroker.Client{s.dial(victim.addr), s.dial(s.c.brokers[1].addr)}
	const size = 20
	for cycle := range pick(2, 6) {
		pause := cycle%2 == 1
		keys := l.burstKeys(size)
		if err := l.publishKeys(s.admin, keys); err != nil {
			t.Fatalf("publish a pack: %v", err)
		}
		take := size
		if pause {
			take = 5
		}
		got := l.receiveKeys(via[0], "receiver@0", keys[:take], take)
		l.onePack(keys[:take], got)
		var acked, held []*qbroker.Message
		var heldKeys []faults.Key
		for i, k := range keys[:take] {
			m := got[k]
			switch {
			case m == nil:
			case (pause && i < 2) || (!pause && i%2 == 0):
				acked = append(acked, m)
			default:
				held = append(held, m)
				heldKeys = append(heldKeys, k)
			}
		}
		l.ackAll(acked)
		var owner int64
		var paused time.Time
		if pause {
			owner = s.c.sessionOf(s.zk, victim)
			victim.pause()
			paused = s.mark(faults.Fault, fmt.Sprintf("SIGSTOP broker 0 holding a pack partly delivered, partly acked (cycle %d)", cycle+1))
			s.dead = append(s.dead, owner)
			if !s.c.unregistered(s.zk, victim, owner, 30*time.Second) {
				s.fail("paused broker's session did not expire within 30s")
			}
		}
		var deadline time.Time
		for _, m := range held {
			deadline = later(deadline, m.LeaseDeadline)
		}
		waitFor(time.Minute, func() bool { return time.Since(deadline) > 3*sweepInterval })
		// What comes back: the held ones, and (paused) those the buffer held.
		back := heldKeys
		if pause {
			back = append(slices.Clone(heldKeys), keys[take:]...)
		}
		again := l.receiveKeys(via[1], "receiver@1", back, size)
		for _, k := range back {
			if m := again[k]; m != nil && m.DeliveryCount < 2 {
				l.check.Fail("%v (%s) came back after its pack lease expired with delivery count %d", k, m.ID, m.DeliveryCount)
			}
		}
		l.ackAll(ordered(back, again))
		if pause {
			victim.resume()
			s.mark(faults.Heal, "SIGCONT broker 0")
			if !s.c.registered(s.zk, victim, 30*time.Second, s.dead...) {
				s.fail("continued broker %s not registered under a new session within 30s", victim.id)
			}
			// Broker 0 takes again: a stale copy from its buffer would
			// arrive past its lease deadline, or with a count not above
			// the redelivery's.
			next := l.burstKeys(size)
			if err := l.publishKeys(s.admin, next); err != nil {
				t.Fatalf("publish a pack: %v", err)
			}
			l.ackAll(ordered(next, l.receiveKeys(via[0], "receiver@0", next, 5)))
			s.t.Logf("cycle %d: broker 0 paused %v", cycle+1, time.Since(paused).Round(time.Millisecond))
		}
		// The held copies' leases are gone: their acks are refused.
		for i, m := range held {
			if err := m.Ack(s.ctx); err == nil {
				l.check.Fail("late ack of %v (%s), whose pack lease expired and which was redelivered, was accepted", heldKeys[i], m.ID)
			}
		}
	}
	s.finish()
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func describe(ds []faults.Delivery) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprintf("#%d %s to %s", d.Count, d.ID, d.Consumer))
	}
	return strings.Join(parts, ", ")
}

// logTree logs the nodes under path, with their data's size and mtime.
func logTree(t *testing.T, c *zk.Conn, path string, depth int) {
	data, st, err := c.Get(path)
	if err != nil {
		t.Logf("%s: %v", path, err)
		return
	}
	t.Logf("%*s%s len=%d mtime=%s", depth*2, "", path[strings.LastIndexByte(path, '/')+1:], len(data), time.UnixMilli(st.Mtime).Format("15:04:05.000"))
	kids, _, _ := c.Children(path)
	slices.Sort(kids)
	for _, k := range kids {
		logTree(t, c, path+"/"+k, depth+1)
	}
}
