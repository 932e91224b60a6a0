package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// groupedQueue opens the queue under root with groups, on its own session,
// as process rank of n (WithShare).
func groupedQueue(t *testing.T, root string, rank, n int, opts ...zkqueue.Option) (*zkqueue.Queue, *zkqueue.Leases) {
	t.Helper()
	opts = append([]zkqueue.Option{zkqueue.WithGroups(root + "/groups"),
		zkqueue.WithShare(func() (int, int) { return rank, n })}, opts...)
	q, err := zkqueue.New(zktest.Conn(t), root+"/items", opts...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := zkqueue.NewLeases(q, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	return q, l
}

func publishGrouped(t *testing.T, q *zkqueue.Queue, group, payload string) string {
	t.Helper()
	d := zkqueue.Draft{Payload: []byte(payload)}
	d.Group = group
	id, err := q.PublishDraft(context.Background(), d)
	if err != nil {
		t.Fatalf("publish %s: %v", payload, err)
	}
	return id
}

// takeOne takes what is claimable now, without waiting.
func takeNow(t *testing.T, l *zkqueue.Leases, max int, ttl time.Duration) []zkqueue.Lease {
	t.Helper()
	ls, err := l.Take(context.Background(), max, zkqueue.Room{}, ttl, false)
	if err != nil && !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatal(err)
	}
	return ls
}

func payloads(ls []zkqueue.Lease) map[string]bool {
	out := map[string]bool{}
	for _, l := range ls {
		out[string(l.Payload)] = true
	}
	return out
}

// Three groups interleaved with plain messages, consumed by two processes
// (disjoint shares, so each finds messages of the other's share ahead of
// its own) with two consumers each: every group is delivered in publish
// order, and a group's next message is received only after its previous
// one's ack began. Plain messages all arrive too.
func TestGroupsOrderAcrossProcesses(t *testing.T) {
	root := zktest.Root(t)
	pub, _ := groupedQueue(t, root, 0, 1)
	const perGroup = 8
	groups := []string{"a", "b", "c"}
	for i := range perGroup {
		for _, g := range groups {
			publishGrouped(t, pub, g, fmt.Sprintf("%s/%d", g, i))
		}
		if _, err := pub.Publish(context.Background(), []byte(fmt.Sprintf("plain/%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	type event struct {
		payload   string
		received  time.Time
		ackBegins time.Time
	}
	var mu sync.Mutex
	var events []*event
	total := perGroup * (len(groups) + 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var done atomic.Int64
	for rank := range 2 {
		_, l := groupedQueue(t, root, rank, 2)
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for done.Load() < int64(total) && ctx.Err() == nil {
					wctx, c := context.WithTimeout(ctx, 500*time.Millisecond)
					ls, err := l.Take(wctx, 3, zkqueue.Room{}, time.Minute, true)
					c()
					if err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							t.Error(err)
							return
						}
						continue
					}
					now := time.Now()
					evs := make([]*event, len(ls))
					mu.Lock()
					for i, ls := range ls {
						evs[i] = &event{payload: string(ls.Payload), received: now}
						events = append(events, evs[i])
					}
					mu.Unlock()
					for i, ls := range ls {
						mu.Lock()
						evs[i].ackBegins = time.Now()
						mu.Unlock()
						if _, err := l.Ack(ctx, ls.Token); err != nil {
							t.Error(err)
							return
						}
						done.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if len(events) != total {
		t.Fatalf("%d deliveries, want %d", len(events), total)
	}
	byGroup := map[string][]*event{}
	for _, e := range events {
		g, _, _ := strings.Cut(e.payload, "/")
		byGroup[g] = append(byGroup[g], e)
	}
	for _, g := range groups {
		evs := byGroup[g]
		if len(evs) != perGroup {
			t.Fatalf("group %s: %d deliveries, want %d", g, len(evs), perGroup)
		}
		// events is in order of receipt by each consumer; sort the
		// group's by receipt time and check publish order.
		for i := range evs {
			for j := i + 1; j < len(evs); j++ {
				if evs[j].received.Before(evs[i].received) {
					evs[i], evs[j] = evs[j], evs[i]
				}
			}
		}
		for i, e := range evs {
			if want := fmt.Sprintf("%s/%d", g, i); e.payload != want {
				t.Errorf("group %s delivery %d: %s, want %s", g, i, e.payload, want)
			}
			if i > 0 && !e.received.After(evs[i-1].ackBegins) {
				t.Errorf("group %s: %s received at %v, before the ack of %s began at %v",
					g, e.payload, e.received, evs[i-1].payload, evs[i-1].ackBegins)
			}
		}
	}
	if n := len(byGroup["plain"]); n != perGroup {
		t.Errorf("%d plain messages, want %d", n, perGroup)
	}
	assertGroupsIdle(t, root)
}

// assertGroupsIdle waits until every group node is gone (idle groups are
// deleted).
func assertGroupsIdle(t *testing.T, root string) {
	t.Helper()
	conn := zktest.Conn(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		children, _, err := conn.Children(root + "/groups")
		if err != nil {
			t.Fatal(err)
		}
		if len(children) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("groups left: %v", children)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A nacked group head is redelivered first: its group waits meanwhile,
// the other group proceeds. A head whose lease expires (released by a
// LeaseSweeper) behaves the same.
func TestGroupNackedHeadWaits(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	q, l := groupedQueue(t, root, 0, 1)
	publishGrouped(t, q, "a", "a1")
	publishGrouped(t, q, "b", "b1")
	publishGrouped(t, q, "a", "a2")
	publishGrouped(t, q, "b", "b2")

	ls := takeNow(t, l, 10, time.Minute)
	if got := payloads(ls); len(got) != 2 || !got["a1"] || !got["b1"] {
		t.Fatalf("first take: %v, want a1 and b1", got)
	}
	var a1, b1 zkqueue.Lease
	for _, x := range ls {
		if string(x.Payload) == "a1" {
			a1 = x
		} else {
			b1 = x
		}
	}
	if ls := takeNow(t, l, 10, time.Minute); len(ls) != 0 {
		t.Fatalf("took %v while both groups are in flight", payloads(ls))
	}
	if _, out, err := l.Nack(ctx, a1.Token, 0, zkqueue.Policy{}); err != nil || out != zkqueue.Requeued {
		t.Fatalf("nack a1: %v, %v", out, err)
	}
	if _, err := l.Ack(ctx, b1.Token); err != nil {
		t.Fatal(err)
	}
	ls = takeNow(t, l, 10, time.Minute)
	if got := payloads(ls); len(got) != 2 || !got["a1"] || !got["b2"] {
		t.Fatalf("after nack a1, ack b1: %v, want a1 (again) and b2", got)
	}
	for _, x := range ls {
		if string(x.Payload) == "a1" {
			a1 = x
			if x.Deliveries != 2 {
				t.Errorf("a1 delivered %d times, want 2", x.Deliveries)
			}
		} else if _, err := l.AckUnread(ctx, x.Token); err != nil { // b2: read-free ack
			t.Fatal(err)
		}
	}

	// Expiry: a1's lease is released by the sweeper; a1 comes again,
	// before a2.
	if _, out, err := l.Nack(ctx, a1.Token, 0, zkqueue.Policy{}); err != nil || out != zkqueue.Requeued {
		t.Fatalf("nack a1: %v, %v", out, err)
	}
	ls = takeNow(t, l, 10, 300*time.Millisecond)
	if got := payloads(ls); len(got) != 1 || !got["a1"] {
		t.Fatalf("third take: %v, want a1", got)
	}
	sw := zkqueue.NewLeaseSweeper(zktest.Conn(t), root+"/items", root+"/leases", root+"/dead",
		zkqueue.SweeperConfig{Groups: root + "/groups"})
	sweepUntil(ctx, t, "a1's lease", sw, zkqueue.Policy{}, 1)
	// Put back by another session: seen once its watch fires.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ls, err := l.Take(wctx, 10, zkqueue.Room{}, time.Minute, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := payloads(ls); len(got) != 1 || !got["a1"] {
		t.Fatalf("after the expiry: %v, want a1", got)
	}
	if _, err := l.Ack(ctx, ls[0].Token); err != nil {
		t.Fatal(err)
	}
	ls = takeNow(t, l, 10, time.Minute)
	if got := payloads(ls); len(got) != 1 || !got["a2"] {
		t.Fatalf("after a1's ack: %v, want a2", got)
	}
	if _, err := l.AckUnread(ctx, ls[0].Token); err != nil {
		t.Fatal(err)
	}
	assertGroupsIdle(t, root)
}

// A consumer waiting for messages wakes when a blocked group is freed by
// an ack in another process.
func TestGroupFreedWakesWaitingConsumer(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	q1, l1 := groupedQueue(t, root, 0, 1)
	_, l2 := groupedQueue(t, root, 0, 1)
	publishGrouped(t, q1, "a", "a1")
	publishGrouped(t, q1, "a", "a2")
	ls := takeNow(t, l1, 10, time.Minute)
	if len(ls) != 1 || string(ls[0].Payload) != "a1" {
		t.Fatalf("take: %v, want a1", payloads(ls))
	}
	// l2 passes a2 over (a1 is in flight) and then waits: the ack
	// changes nothing in the queue's segment, only the group.
	if ls := takeNow(t, l2, 10, time.Minute); len(ls) != 0 {
		t.Fatalf("took %v while a1 is in flight", payloads(ls))
	}
	got := make(chan []zkqueue.Lease, 1)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		ls, err := l2.Take(wctx, 10, zkqueue.Room{}, time.Minute, true)
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	if _, err := l1.Ack(ctx, ls[0].Token); err != nil {
		t.Fatal(err)
	}
	if ls := <-got; len(ls) != 1 || string(ls[0].Payload) != "a2" {
		t.Fatalf("waiting take: %v, want a2", payloads(ls))
	}
}

// At most once: two processes taking in turn get each group's messages
// in publish order, never one before the previous is consumed.
func TestGroupsAtMostOnceOrder(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	pub, _ := groupedQueue(t, root, 0, 1)
	const perGroup = 6
	for i := range perGroup {
		for _, g := range []string{"a", "b"} {
			publishGrouped(t, pub, g, fmt.Sprintf("%s%d", g, i))
		}
	}
	q0, _ := groupedQueue(t, root, 0, 2)
	q1, _ := groupedQueue(t, root, 1, 2)
	next := map[string]int{}
	for turn := 0; next["a"]+next["b"] < 2*perGroup; turn++ {
		if turn > 100 {
			t.Fatalf("stuck at %v", next)
		}
		q := []*zkqueue.Queue{q0, q1}[turn%2]
		ms, err := q.Take(ctx, 3, zkqueue.Room{}, false)
		if err != nil && !errors.Is(err, zkqueue.ErrEmpty) {
			t.Fatal(err)
		}
		if len(ms) > 2 {
			t.Fatalf("took %d messages of 2 groups at once", len(ms))
		}
		for _, m := range ms {
			g := m.Group
			if want := fmt.Sprintf("%s%d", g, next[g]); string(m.Payload) != want {
				t.Fatalf("group %s: took %s, want %s", g, m.Payload, want)
			}
			next[g]++
		}
	}
	assertGroupsIdle(t, root)
}

// A dead-lettered head frees its group; redriven, it goes to its group's
// end. Purge deletes grouped messages with their entries, so the group
// is not stuck afterwards, even while one of its messages is in flight.
func TestGroupsDeadLetterRedrivePurge(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	q, l := groupedQueue(t, root, 0, 1)
	publishGrouped(t, q, "a", "a1")
	publishGrouped(t, q, "a", "a2")
	ls := takeNow(t, l, 10, time.Minute)
	if len(ls) != 1 || string(ls[0].Payload) != "a1" {
		t.Fatalf("take: %v, want a1", payloads(ls))
	}
	if _, out, err := l.Nack(ctx, ls[0].Token, 0, zkqueue.Policy{MaxDeliveries: 1, DeadLetter: true}); err != nil || out != zkqueue.DeadLettered {
		t.Fatalf("nack: %v, %v; want DeadLettered", out, err)
	}
	publishGrouped(t, q, "a", "a3")
	if n, err := l.Redrive(ctx, nil); err != nil || n != 1 {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	for _, want := range []string{"a2", "a3", "a1"} {
		ls := takeNow(t, l, 10, time.Minute)
		if len(ls) != 1 || string(ls[0].Payload) != want {
			t.Fatalf("take: %v, want %s", payloads(ls), want)
		}
		if _, err := l.Ack(ctx, ls[0].Token); err != nil {
			t.Fatal(err)
		}
	}
	assertGroupsIdle(t, root)

	publishGrouped(t, q, "a", "a4")
	publishGrouped(t, q, "a", "a5")
	publishGrouped(t, q, "b", "b1")
	ls = takeNow(t, l, 10, time.Minute)
	if got := payloads(ls); len(got) != 2 || !got["a4"] || !got["b1"] {
		t.Fatalf("take: %v, want a4 and b1", got)
	}
	a4 := ls[0]
	if string(a4.Payload) != "a4" {
		a4, ls[1] = ls[1], ls[0]
	}
	if _, err := l.Ack(ctx, ls[1].Token); err != nil { // b1
		t.Fatal(err)
	}
	publishGrouped(t, q, "b", "b2")
	if n, err := q.Purge(ctx); err != nil || n != 2 {
		t.Fatalf("purge: %d, %v; want a5 and b2", n, err)
	}
	publishGrouped(t, q, "a", "a6")
	publishGrouped(t, q, "b", "b3")
	for _, want := range []string{"b3", "a6"} {
		ls := takeNow(t, l, 10, time.Minute)
		if len(ls) != 1 || string(ls[0].Payload) != want {
			t.Fatalf("after the purge: %v, want %s", payloads(ls), want)
		}
		if _, err := l.Ack(ctx, ls[0].Token); err != nil {
			t.Fatal(err)
		}
		if want == "b3" {
			if _, err := l.Ack(ctx, a4.Token); err != nil {
				t.Fatal(err)
			}
		}
	}
	assertGroupsIdle(t, root)
}

// Plain messages cost no request more in a queue with groups: the same
// publishes, takes and acks make as many requests as without WithGroups.
func TestGroupsCostPlainMessagesNothing(t *testing.T) {
	ctx := context.Background()
	count := func(groups bool) int64 {
		root := zktest.Root(t)
		var n atomic.Int64
		opts := []zkqueue.Option{zkqueue.WithObserver(countAll(&n))}
		if groups {
			opts = append(opts, zkqueue.WithGroups(root+"/groups"))
		}
		q, err := zkqueue.New(zktest.Conn(t), root+"/items", opts...)
		if err != nil {
			t.Fatal(err)
		}
		l, err := zkqueue.NewLeases(q, root+"/leases", root+"/dead")
		if err != nil {
			t.Fatal(err)
		}
		n.Store(0)
		for i := range 5 {
			if _, err := q.Publish(ctx, []byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := q.PublishBatch(ctx, [][]byte{{1}, {2}}); err != nil {
			t.Fatal(err)
		}
		ls := takeNow(t, l, 4, time.Minute)
		for _, x := range ls {
			if _, err := l.AckUnread(ctx, x.Token); err != nil {
				t.Fatal(err)
			}
		}
		ls = takeNow(t, l, 4, time.Minute)
		for _, x := range ls {
			if _, _, err := l.Nack(ctx, x.Token, 0, zkqueue.Policy{}); err != nil {
				t.Fatal(err)
			}
		}
		for range 3 {
			if _, err := q.Take(ctx, 3, zkqueue.Room{}, false); err != nil && !errors.Is(err, zkqueue.ErrEmpty) {
				t.Fatal(err)
			}
		}
		if n, err := q.Len(ctx); err != nil || n != 0 {
			t.Fatalf("left %d, %v", n, err)
		}
		return n.Load()
	}
	without, with := count(false), count(true)
	if with != without {
		t.Fatalf("%d requests with groups, %d without; want as many", with, without)
	}
}

// A group key is checked, and refused by a queue without groups.
func TestGroupKeyChecked(t *testing.T) {
	root := zktest.Root(t)
	q, _ := groupedQueue(t, root, 0, 1)
	plain, err := zkqueue.New(zktest.Conn(t), root+"/plain")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q     *zkqueue.Queue
		group string
	}{{q, "a/b"}, {q, ".."}, {q, string(make([]byte, 129))}, {plain, "a"}} {
		d := zkqueue.Draft{Payload: []byte("x")}
		d.Group = c.group
		if _, err := c.q.PublishDraft(context.Background(), d); !errors.Is(err, zkqueue.ErrBadGroup) {
			t.Errorf("group %.10q: %v, want ErrBadGroup", c.group, err)
		}
	}
	if n, err := q.Len(context.Background()); err != nil || n != 0 {
		t.Fatalf("len %d, %v: want nothing written", n, err)
	}
}

// A head nacked with a delay stays in flight until the delay ends (the
// sweeper requeues it), and its group waits for it. In a priority queue a
// group's order is its publish order: a more urgent message waits behind
// its group's earlier, less urgent one, while the queue's other messages
// go first by priority.
func TestGroupsDelayedNackAndPriorities(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	q, l := groupedQueue(t, root, 0, 1, zkqueue.WithPriorities())
	for _, m := range []struct {
		group, payload string
		prio           int
	}{{"a", "a1", 5}, {"a", "a2", 0}, {"", "plain", 3}} {
		d := zkqueue.Draft{Payload: []byte(m.payload), Priority: m.prio}
		d.Group = m.group
		if _, err := q.PublishDraft(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	ls := takeNow(t, l, 10, time.Minute)
	if len(ls) != 2 || string(ls[0].Payload) != "plain" || string(ls[1].Payload) != "a1" {
		t.Fatalf("take: %v, want plain then a1", payloads(ls))
	}
	if _, out, err := l.Nack(ctx, ls[1].Token, 300*time.Millisecond, zkqueue.Policy{}); err != nil || out != zkqueue.Delayed {
		t.Fatalf("delayed nack: %v, %v", out, err)
	}
	if ls := takeNow(t, l, 10, time.Minute); len(ls) != 0 {
		t.Fatalf("took %v while a1 waits for its delay", payloads(ls))
	}
	sw := zkqueue.NewLeaseSweeper(zktest.Conn(t), root+"/items", root+"/leases", root+"/dead",
		zkqueue.SweeperConfig{Groups: root + "/groups"})
	// Two leases: plain's (live for a minute) and a1's, released at
	// the end of its delay.
	sweepUntil(ctx, t, "a1's delay", sw, zkqueue.Policy{}, 1)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, want := range []string{"a1", "a2"} {
		ls, err := l.Take(wctx, 10, zkqueue.Room{}, time.Minute, true)
		if err != nil || len(ls) != 1 || string(ls[0].Payload) != want {
			t.Fatalf("take: %v, %v; want %s", payloads(ls), err, want)
		}
		if _, err := l.Ack(ctx, ls[0].Token); err != nil {
			t.Fatal(err)
		}
	}
	assertGroupsIdle(t, root)
}
