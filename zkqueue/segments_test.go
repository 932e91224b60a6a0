package zkqueue_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// A small segment size, so that the tests roll hundreds of segments.
const testSegment = 50

type msgKey struct{ producer, seq int }

func keyPayload(k msgKey) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b, uint32(k.producer))
	binary.BigEndian.PutUint32(b[4:], uint32(k.seq))
	return b
}

func payloadKey(t testing.TB, b []byte) msgKey {
	if len(b) != 8 {
		t.Errorf("payload of %d bytes", len(b))
		return msgKey{-1, -1}
	}
	return msgKey{int(binary.BigEndian.Uint32(b)), int(binary.BigEndian.Uint32(b[4:]))}
}

// segProc is one process consuming and publishing: its own session,
// Committer, Queue and Leases.
type segProc struct {
	q *zkqueue.Queue
	l *zkqueue.Leases
}

func newSegProc(t *testing.T, root string, opts ...zkqueue.Option) segProc {
	conn := zktest.Conn(t)
	c := zkqueue.NewCommitter([]*zk.Conn{conn}, zkqueue.CommitterConfig{})
	t.Cleanup(c.Close)
	q := newQueue(t, conn, root+"/items", append([]zkqueue.Option{zkqueue.WithSegmentSize(testSegment), zkqueue.WithCommitter(c)}, opts...)...)
	l, err := zkqueue.NewLeases(q, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	return segProc{q, l}
}

// exchangeLog records what the consumers of TestSegmentsExchange saw.
type exchangeLog struct {
	mu        sync.Mutex
	delivered map[msgKey]int
	nacked    map[msgKey]int
	final     map[msgKey]int // taken at most once, or acked
	last      []map[int]int  // per consumer: producer -> last first-delivery seq
	finals    atomic.Int64
}

func (g *exchangeLog) deliver(t *testing.T, c int, k msgKey, deliveries int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.delivered[k]++
	if deliveries == 1 {
		if prev, ok := g.last[c][k.producer]; ok && prev >= k.seq {
			t.Errorf("consumer %d: producer %d's message %d after %d", c, k.producer, k.seq, prev)
		}
		g.last[c][k.producer] = k.seq
	}
}

func (g *exchangeLog) settle(k msgKey, nack bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if nack {
		g.nacked[k]++
		return
	}
	g.final[k]++
	g.finals.Add(1)
}

// Eight producers over two processes and sixteen consumers (half taking
// at most once, half with leases, nacking some messages) exchange 20,000
// messages through segments of 50, hundreds of rolls: none is lost; each
// is finished once (taken, or acked once); a message is delivered again
// only after a nack; each producer's order holds at every consumer; no
// segment holds more than its size plus the transactions in flight at its
// seal; the drained segments are removed.
func TestSegmentsExchange(t *testing.T) {
	total := 20_000
	if testing.Short() {
		total = 4_000
	}
	const producers, consumers, batch = 8, 16, 4
	root := zktest.Root(t)
	procs := []segProc{newSegProc(t, root), newSegProc(t, root)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	g := &exchangeLog{delivered: map[msgKey]int{}, nacked: map[msgKey]int{}, final: map[msgKey]int{}}
	for range consumers {
		g.last = append(g.last, map[int]int{})
	}
	var ids sync.Map // message id -> key
	var pwg sync.WaitGroup
	per := total / producers
	for p := range producers {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			publishAll(ctx, t, procs[p%2].q, p, per, p%2 == 0, batch, &ids)
		}()
	}
	cctx, stop := context.WithCancel(ctx)
	var cwg sync.WaitGroup
	for c := range consumers {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			consumeAll(cctx, t, procs[c%2], c, c%2 == 0, g)
		}()
	}
	zktest.WaitFor(t, 4*time.Minute, "all messages finished", func() bool {
		return g.finals.Load() >= int64(total) || t.Failed()
	})
	stop()
	cwg.Wait()
	pwg.Wait()

	for p := range producers {
		for s := range per {
			k := msgKey{p, s}
			if g.final[k] != 1 {
				t.Fatalf("message %v finished %d times", k, g.final[k])
			}
			if g.delivered[k] != 1+g.nacked[k] {
				t.Fatalf("message %v delivered %d times, nacked %d", k, g.delivered[k], g.nacked[k])
			}
		}
	}
	checkSegmentBound(t, &ids, producers*batch)
	if _, err := procs[0].q.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("TryDequeue after the exchange: %v", err)
	}
	left, _, err := zktest.Conn(t).Children(root + "/items")
	if err != nil || len(left) != 1 {
		t.Fatalf("segments left after draining: %v (%v), want the tail only", left, err)
	}
	t.Logf("%d messages, %d nacks", total, len(g.nacked))
}

// publishAll publishes producer p's n messages in order: one at a time,
// or (batches) in batches of batch.
func publishAll(ctx context.Context, t *testing.T, q *zkqueue.Queue, p, n int, batches bool, batch int, ids *sync.Map) {
	for s := 0; s < n; {
		k := min(batch, n-s)
		if !batches {
			k = 1
		}
		payloads := make([][]byte, k)
		for i := range payloads {
			payloads[i] = keyPayload(msgKey{p, s + i})
		}
		got, err := q.PublishBatch(ctx, payloads)
		if err != nil {
			t.Errorf("producer %d: %v", p, err)
			return
		}
		for i, id := range got {
			ids.Store(id, msgKey{p, s + i})
		}
		s += k
	}
}

// consumeAll consumes until ctx ends: at most once, or with leases,
// nacking one first delivery in 40.
func consumeAll(ctx context.Context, t *testing.T, pr segProc, c int, leases bool, g *exchangeLog) {
	for ctx.Err() == nil {
		if !leases {
			ms, err := pr.q.Take(ctx, 4, zkqueue.Room{}, true)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("consumer %d: %v", c, err)
				}
				return
			}
			for _, m := range ms {
				k := payloadKey(t, m.Payload)
				g.deliver(t, c, k, m.Deliveries)
				g.settle(k, false)
			}
			continue
		}
		ls, err := pr.l.Take(ctx, 4, zkqueue.Room{}, time.Minute, true)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("consumer %d: %v", c, err)
			}
			return
		}
		for _, l := range ls {
			k := payloadKey(t, l.Payload)
			g.deliver(t, c, k, l.Deliveries)
			nack := l.Deliveries == 1 && rand.IntN(40) == 0
			if nack {
				_, _, err = pr.l.Nack(context.Background(), l.Token, 0, zkqueue.Policy{})
			} else {
				_, err = pr.l.Ack(context.Background(), l.Token)
			}
			if err != nil {
				t.Errorf("consumer %d: settle %v: %v", c, k, err)
				return
			}
			g.settle(k, nack)
		}
	}
}

// checkSegmentBound checks from the published ids that no segment got more
// than testSegment messages plus inFlight, and that there were many.
func checkSegmentBound(t *testing.T, ids *sync.Map, inFlight int) {
	perSeg := map[int64]int{}
	ids.Range(func(id, _ any) bool {
		n, ok := zkqueue.ParseName(id.(string))
		if !ok || n.Seg == 0 {
			t.Fatalf("message id %q does not name a segment", id)
		}
		perSeg[n.Seg]++
		return true
	})
	most := 0
	for _, c := range perSeg {
		most = max(most, c)
	}
	if most > testSegment+inFlight {
		t.Fatalf("a segment got %d messages, more than %d + %d", most, testSegment, inFlight)
	}
	if len(perSeg) < 100 {
		t.Fatalf("only %d segments", len(perSeg))
	}
	t.Logf("%d segments, at most %d messages in one", len(perSeg), most)
}

// A message published after another one's publish returned is delivered
// after it, across rolls and group commits: four producers on one
// Committer publish while one consumer takes.
func TestSegmentsLinearizable(t *testing.T) {
	total := 4000
	if testing.Short() {
		total = 1000
	}
	const producers = 4
	root := zktest.Root(t)
	pub, cons := newSegProc(t, root), newSegProc(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type span struct{ start, end time.Duration }
	origin := time.Now()
	var mu sync.Mutex
	spans := map[msgKey]span{}
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range total / producers {
				k := msgKey{p, s}
				start := time.Since(origin)
				if _, err := pub.q.Publish(ctx, keyPayload(k)); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				mu.Lock()
				spans[k] = span{start, time.Since(origin)}
				mu.Unlock()
			}
		}()
	}
	var order []msgKey
	for len(order) < total && !t.Failed() {
		ms, err := cons.q.Take(ctx, 8, zkqueue.Room{}, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			order = append(order, payloadKey(t, m.Payload))
		}
	}
	wg.Wait()
	// Walking the delivery order backwards, the earliest return among the
	// later deliveries must not precede a delivery's start.
	minEnd := time.Duration(1<<63 - 1)
	for i := len(order) - 1; i >= 0; i-- {
		sp := spans[order[i]]
		if minEnd < sp.start {
			t.Fatalf("message %v delivered before one whose publish returned before it started", order[i])
		}
		minEnd = min(minEnd, sp.end)
	}
}

// A message put back after its segment was drained and removed re-creates
// the segment, which sorts before the tail: a Queue opened cold sees it
// first, and another process's Queue sees it through its watch on the
// parent once its snapshot is used up, before the newer messages.
func TestSegmentsRedeliveryIntoRemovedSegment(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	q := newQueue(t, conn, root+"/items", zkqueue.WithSegmentSize(2))
	l, err := zkqueue.NewLeases(q, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := q.Publish(ctx, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := l.Take(ctx, 1, zkqueue.Room{}, time.Minute, false)
	if err != nil || len(ls) != 1 || ls[0].Payload[0] != 0 {
		t.Fatalf("lease take: %v, %v", ls, err)
	}
	first := ls[0]
	if m, err := q.TryDequeue(ctx); err != nil || m.Payload[0] != 1 {
		t.Fatalf("dequeue: %v, %v", m, err)
	}
	// Another process takes 2: its listing removes the drained segment 1
	// and keeps 3 in its snapshot of segment 2.
	w := newQueue(t, zktest.Conn(t), root+"/items", zkqueue.WithSegmentSize(2))
	if m, err := w.TryDequeue(ctx); err != nil || m.Payload[0] != 2 {
		t.Fatalf("dequeue: %v, %v", m, err)
	}
	seg := segmentOfID(t, first.ID)
	if ok, _, err := conn.Exists(root + "/items/" + seg); err != nil || ok {
		t.Fatalf("drained segment %s still there (%v)", seg, err)
	}
	if _, err := w.Publish(ctx, []byte{4}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Nack(ctx, first.Token, 0, zkqueue.Policy{}); err != nil {
		t.Fatal(err)
	}
	if ok, stat, err := conn.Exists(root + "/items/" + seg); err != nil || !ok || stat.Version == 0 {
		t.Fatalf("segment %s not re-created sealed: %v %+v", seg, err, stat)
	}
	cold := newQueue(t, zktest.Conn(t), root+"/items")
	if m, err := cold.Peek(ctx); err != nil || m.ID != first.ID {
		t.Fatalf("cold peek: %v, %v; want %s", m.ID, err, first.ID)
	}
	// The other process walks its snapshot to its end (3), then sees the
	// re-created segment through its watch on the parent: 0 before 4.
	for _, want := range []byte{3, 0, 4} {
		m, err := w.TryDequeue(ctx)
		if err != nil || m.Payload[0] != want {
			t.Fatalf("dequeue: %v (%v), want payload %d", m.Payload, err, want)
		}
	}
}

// segmentOfID returns the segment node name of message id (FIFO).
func segmentOfID(t *testing.T, id string) string {
	n, ok := zkqueue.ParseName(id)
	if !ok || n.Seg == 0 {
		t.Fatalf("id %q names no segment", id)
	}
	return fmt.Sprintf("s%019d", n.Seg)
}

// A Queue opened cold on a queue of many segments delivers the head
// message first, and Len counts them all.
func TestSegmentsColdOpen(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	pub := newQueue(t, zktest.Conn(t), root+"/items", zkqueue.WithSegmentSize(testSegment))
	const n = 1000
	for i := 0; i < n; i += 100 {
		payloads := make([][]byte, 100)
		for j := range payloads {
			payloads[j] = keyPayload(msgKey{0, i + j})
		}
		if _, err := pub.PublishBatch(ctx, payloads); err != nil {
			t.Fatal(err)
		}
	}
	children, _, err := zktest.Conn(t).Children(root + "/items")
	if err != nil || len(children) < 5 {
		t.Fatalf("%d segments (%v)", len(children), err)
	}
	cold := newQueue(t, zktest.Conn(t), root+"/items", zkqueue.WithSegmentSize(testSegment))
	if got, err := cold.Len(ctx); err != nil || got != n {
		t.Fatalf("Len = %d (%v), want %d", got, err, n)
	}
	m, err := cold.Dequeue(ctx)
	if err != nil || payloadKey(t, m.Payload) != (msgKey{0, 0}) {
		t.Fatalf("first delivery %v (%v), want the head", m.Payload, err)
	}
	for i := 1; i < n; i++ {
		m, err := cold.TryDequeue(ctx)
		if err != nil || payloadKey(t, m.Payload).seq != i {
			t.Fatalf("delivery %d: %v (%v)", i, m.Payload, err)
		}
	}
	if got, err := cold.Len(ctx); err != nil || got != 0 {
		t.Fatalf("Len after draining = %d (%v)", got, err)
	}
}

// Priority chains roll independently; delivery is by (priority, publish
// order) across rolls, and a more urgent message published while a less
// urgent level drains is the next one taken.
func TestSegmentsPriorityAcrossRolls(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	q := newQueue(t, zktest.Conn(t), root+"/items", zkqueue.WithPriorities(), zkqueue.WithSegmentSize(5))
	const n = 120
	for i := range n {
		if _, err := q.PublishPriority(ctx, 3+i%3, keyPayload(msgKey{3 + i%3, i})); err != nil {
			t.Fatal(err)
		}
	}
	last := msgKey{-1, -1}
	for i := range n {
		if i == 20 {
			if _, err := q.PublishPriority(ctx, 1, keyPayload(msgKey{1, 1000})); err != nil {
				t.Fatal(err)
			}
			m, err := q.TryDequeue(ctx)
			if err != nil || payloadKey(t, m.Payload) != (msgKey{1, 1000}) {
				t.Fatalf("after an urgent publish got %v (%v)", m.Payload, err)
			}
		}
		m, err := q.TryDequeue(ctx)
		if err != nil {
			t.Fatal(err)
		}
		k := payloadKey(t, m.Payload)
		if k.producer < last.producer || k.producer == last.producer && k.seq <= last.seq {
			t.Fatalf("delivery %d: %v after %v", i, k, last)
		}
		last = k
	}
	if _, err := q.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("left over: %v", err)
	}
}

// A queue written in the single-parent layout (messages named qn-<seq>
// directly under the items parent) is consumed in place, before the
// messages published into segments since.
func TestSegmentsLegacyLayout(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	items := root + "/items"
	for _, p := range []string{"/t", root, items} {
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		data := zkqueue.EncodeData(zkqueue.Message{Payload: keyPayload(msgKey{0, i}), Published: time.Now()})
		if _, err := conn.Create(items+"/"+zkqueue.FIFOPrefix, data, zk.FlagSequence, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	q := newQueue(t, zktest.Conn(t), items, zkqueue.WithSegmentSize(2))
	for i := 5; i < 10; i++ {
		if _, err := q.Publish(ctx, keyPayload(msgKey{0, i})); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := q.Len(ctx); err != nil || got != 10 {
		t.Fatalf("Len = %d (%v), want 10", got, err)
	}
	if m, err := q.Peek(ctx); err != nil || !strings.HasPrefix(m.ID, "qn-000") {
		t.Fatalf("Peek = %s (%v), want a legacy message", m.ID, err)
	}
	for i := range 10 {
		m, err := q.TryDequeue(ctx)
		if err != nil || payloadKey(t, m.Payload).seq != i {
			t.Fatalf("delivery %d: %v (%v)", i, m.Payload, err)
		}
	}
}

// Leases of one removed segment released at once all go back: one of
// them re-creates the segment, the others land in it.
func TestSegmentsConcurrentRedelivery(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	pr := newSegProc(t, root, zkqueue.WithSegmentSize(10))
	for i := range 10 {
		if _, err := pr.q.Publish(ctx, keyPayload(msgKey{0, i})); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := pr.l.Take(ctx, 10, zkqueue.Room{}, time.Minute, false)
	if err != nil || len(ls) != 10 {
		t.Fatalf("took %d (%v)", len(ls), err)
	}
	if _, err := pr.q.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("dequeue: %v", err)
	}
	seg := segmentOfID(t, ls[0].ID)
	if ok, _, _ := zktest.Conn(t).Exists(root + "/items/" + seg); ok {
		t.Fatalf("drained segment %s not removed", seg)
	}
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, out, err := pr.l.Nack(ctx, l.Token, 0, zkqueue.Policy{}); err != nil || out != zkqueue.Requeued {
				t.Errorf("nack %s: %v %v", l.ID, out, err)
			}
		}()
	}
	wg.Wait()
	for i := range 10 {
		m, err := pr.q.TryDequeue(ctx)
		if err != nil || payloadKey(t, m.Payload).seq != i {
			t.Fatalf("redelivery %d: %v (%v)", i, m.Payload, err)
		}
	}
}

// Concurrent TryDequeues on a queue of many segments report ErrEmpty only
// once it is empty: a used-up snapshot of the head segment is not an empty
// queue.
func TestSegmentsTryDequeueAcrossSegments(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	pr := newSegProc(t, root)
	const n = 2000
	batch := make([][]byte, 100)
	for i := range batch {
		batch[i] = []byte("m")
	}
	for range n / len(batch) {
		if _, err := pr.q.PublishBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	var taken atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := pr.q.TryDequeue(ctx)
				if errors.Is(err, zkqueue.ErrEmpty) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				taken.Add(1)
			}
		}()
	}
	wg.Wait()
	if taken.Load() != n {
		t.Fatalf("took %d of %d before ErrEmpty", taken.Load(), n)
	}
}

// Len on a queue of many segments counts them all, and follows a Purge
// made by another process and the publishes after it.
func TestSegmentsLenAndPurge(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	pub := newQueue(t, zktest.Conn(t), root+"/items", zkqueue.WithSegmentSize(testSegment))
	stats := newQueue(t, zktest.Conn(t), root+"/items", zkqueue.WithSegmentSize(testSegment))
	batch := make([][]byte, 100)
	for i := range batch {
		batch[i] = []byte("m")
	}
	for range 5 {
		if _, err := pub.PublishBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := stats.Len(ctx); err != nil || n != 500 {
		t.Fatalf("Len = %d (%v), want 500", n, err)
	}
	if n, err := pub.Purge(ctx); err != nil || n != 500 {
		t.Fatalf("Purge = %d (%v), want 500", n, err)
	}
	zktest.WaitFor(t, 30*time.Second, "Len 0 after the purge", func() bool {
		n, err := stats.Len(ctx)
		return err == nil && n == 0
	})
	if _, err := pub.PublishBatch(ctx, batch[:10]); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "Len 10 after publishing", func() bool {
		n, err := stats.Len(ctx)
		return err == nil && n == 10
	})
}

// An undecodable node left in a sealed segment (written where ACLs let
// someone) is passed over: the segments behind it are still consumed, and
// Purge deletes it.
func TestSegmentsBadNodeDoesNotBlock(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	q := newQueue(t, conn, root+"/items", zkqueue.WithSegmentSize(2))
	for _, p := range []string{"a", "b"} {
		if _, err := q.Publish(ctx, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	first := root + "/items/s0000000000000000001"
	if _, err := conn.Create(first+"/qn-1-", []byte("garbage"), zk.FlagSequence, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Publish(ctx, []byte("c")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a", "b", "c"} {
		m, err := q.TryDequeue(ctx)
		if err != nil || string(m.Payload) != want {
			t.Fatalf("TryDequeue = %q, %v; want %q", m.Payload, err, want)
		}
	}
	if _, err := q.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("TryDequeue: got %v, want ErrEmpty", err)
	}
	if k, err := q.Purge(ctx); k != 1 || err != nil {
		t.Fatalf("Purge = %d, %v; want 1 (the bad node)", k, err)
	}
	if ok, _, err := conn.Exists(first); err != nil || ok {
		t.Fatalf("purged sealed segment %s still there (%v, %v)", first, ok, err)
	}
}
