package zkqueue_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

func group(t *testing.T, conn *zk.Conn, dir, id string) *zkqueue.ConsumerGroup {
	t.Helper()
	g, err := zkqueue.NewConsumerGroup(conn, dir, id, zkqueue.ConsumerGroupConfig{RankTTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// waitRank waits until g ranks its process rank of n.
func waitRank(t *testing.T, g *zkqueue.ConsumerGroup, what string, rank, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, m := g.Rank()
		if r == rank && m == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: rank %d of %d, want %d of %d", what, r, m, rank, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func count(t *testing.T, g *zkqueue.ConsumerGroup) int {
	t.Helper()
	n, err := g.Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Two processes rank themselves alike from the registrations: a process
// with several consumers counts once, a legacy sequential registration is
// read, a registration under this process's id that it did not make (its
// previous process's) is not counted, and a process without consumers
// takes the whole queue. Each process's Queue takes its share first.
func TestConsumerGroupRanks(t *testing.T) {
	ctx := context.Background()
	connA, connB, connC, prev := zktest.Conn(t), zktest.Conn(t), zktest.Conn(t), zktest.Conn(t)
	root := zktest.Root(t)
	dir := root + "/q/consumers"
	a, b := group(t, connA, dir, "a"), group(t, connB, dir, "b")
	if n := count(t, a); n != 0 {
		t.Fatalf("missing directory: %d consumers, want 0", n)
	}
	if _, err := a.Consumers(ctx); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("missing directory: got %v, want zk.ErrNoNode", err)
	}
	waitRank(t, a, "no registration", 0, 1)

	ra1, err := a.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ra2, err := a.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Register(ctx); err != nil {
		t.Fatal(err)
	}
	// a's previous process's registration, and one of an older process c.
	if _, err := prev.Create(dir+"/a~00000000000000ff", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := connC.Create(dir+"/c-0000000001", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	// a: its two, b's, c's; b also sees the stale a~...ff (only a knows it
	// is not one of its own).
	if n := count(t, a); n != 4 {
		t.Fatalf("a counts %d consumers, want 4", n)
	}
	if n := count(t, b); n != 5 {
		t.Fatalf("b counts %d consumers, want 5", n)
	}
	waitRank(t, a, "a with two consumers", 0, 3)
	waitRank(t, b, "b with one consumer", 1, 3)

	qa, err := zkqueue.New(connA, root+"/q/items", zkqueue.WithShare(a.Rank))
	if err != nil {
		t.Fatal(err)
	}
	qb, err := zkqueue.New(connB, root+"/q/items", zkqueue.WithShare(b.Rank))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qa.PublishBatch(ctx, [][]byte{[]byte("0"), []byte("1"), []byte("2"), []byte("3")}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		q    *zkqueue.Queue
		want string
	}{{qb, "1"}, {qa, "0"}, {qa, "3"}} {
		m, err := tc.q.TryDequeue(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Payload) != tc.want {
			t.Fatalf("took %s (%q), want the share's %q", m.ID, m.Payload, tc.want)
		}
	}

	for _, r := range []*zkqueue.Registration{ra1, ra2} {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	waitRank(t, a, "a without consumers", 0, 1)
	prev.Close() // the stale registration goes with its session
	waitRank(t, b, "b with c", 0, 2)
	if n := count(t, a); n != 2 {
		t.Fatalf("a counts %d consumers, want 2", n)
	}
}

// A process helps with another's share only once that share is stuck:
// its oldest message stayed at its head for the steal grace (200 ms).
// Here the other process (rank 1 of 2) takes nothing, as a broker paused
// with its consumers attached: this one takes its own share at once, then
// the other's, in queue order, after the grace.
func TestHelpsWithAStuckShare(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	q, err := zkqueue.New(conn, root+"/q", zkqueue.WithShare(func() (int, int) { return 0, 2 }))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.PublishBatch(ctx, [][]byte{[]byte("0"), []byte("1"), []byte("2"), []byte("3"), []byte("4"), []byte("5")}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var got []string
	var helped time.Duration
	for range 6 {
		m, err := q.TryDequeue(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got = append(got, string(m.Payload)); len(got) == 4 {
			helped = time.Since(start)
		}
	}
	if want := []string{"0", "2", "4", "1", "3", "5"}; !slices.Equal(got, want) {
		t.Fatalf("took %q, want %q: its own share, then the stuck one", got, want)
	}
	if helped < 200*time.Millisecond {
		t.Errorf("helped with the other share after %v, want at least the 200 ms grace", helped)
	}
	if _, err := q.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("empty queue: got %v, want ErrEmpty", err)
	}
}

// Two processes that publish and consume one queue each take first what
// they published (WithPublisher, WithOwners), whatever its sequence
// number, and claim it without reading it back: they remember its data.
func TestShareByPublisher(t *testing.T) {
	ctx := context.Background()
	connA, connB := zktest.Conn(t), zktest.Conn(t)
	root := zktest.Root(t)
	a, b := group(t, connA, root+"/q/consumers", "a"), group(t, connB, root+"/q/consumers", "b")
	for _, g := range []*zkqueue.ConsumerGroup{a, b} {
		if _, err := g.Register(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitRank(t, a, "a", 0, 2)
	waitRank(t, b, "b", 1, 2)
	var reads atomic.Int32
	countReads := func(op string, _ time.Duration, _ error) {
		if op == "get" || op == "multiread" {
			reads.Add(1)
		}
	}
	open := func(conn *zk.Conn, g *zkqueue.ConsumerGroup, id string) *zkqueue.Queue {
		q, err := zkqueue.New(conn, root+"/q/items", zkqueue.WithOwners(g.Share), zkqueue.WithPublisher(id), zkqueue.WithObserver(countReads))
		if err != nil {
			t.Fatal(err)
		}
		// A process remembers what it publishes while it consumes.
		if _, err := q.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
			t.Fatalf("%s: empty queue: got %v, want ErrEmpty", id, err)
		}
		return q
	}
	qa, qb := open(connA, a, "a"), open(connB, b, "b")
	// Sequence numbers 0-3 are a's, 4-7 b's: by sequence number alone,
	// each would own half of the other's.
	ids, err := qa.PublishBatch(ctx, [][]byte{[]byte("a0"), []byte("a1"), []byte("a2"), []byte("a3")})
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := zkqueue.ParseName(ids[0]); !ok || n.Tag != zkqueue.PublisherTag("a") {
		t.Fatalf("published %s: want a's tag %s", ids[0], zkqueue.PublisherTag("a"))
	}
	// A process that does not consume the queue would not remember what
	// it publishes: its messages carry no tag, and are shared.
	idle, err := zkqueue.New(connA, root+"/q/items", zkqueue.WithPublisher("a"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := idle.Publish(ctx, []byte("untagged")); err != nil {
		t.Fatal(err)
	} else if p, _ := zkqueue.ParseName(n); p.Tag != "" {
		t.Fatalf("published %s from a queue not consumed: want no tag", n)
	}
	if _, err := qb.PublishBatch(ctx, [][]byte{[]byte("b0"), []byte("b1"), []byte("b2"), []byte("b3")}); err != nil {
		t.Fatal(err)
	}
	reads.Store(0)
	for _, tc := range []struct {
		q    *zkqueue.Queue
		want []string
	}{{qb, []string{"b0", "b1", "b2", "b3"}}, {qa, []string{"a0", "a1", "a2", "a3"}}} {
		var got []string
		for range len(tc.want) {
			m, err := tc.q.TryDequeue(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, string(m.Payload))
		}
		if !slices.Equal(got, tc.want) {
			t.Fatalf("took %q, want %q: what this process published, in order", got, tc.want)
		}
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("%d reads, want none: every claim's data was remembered", n)
	}
	// The untagged message is a's by its sequence number (4).
	if m, err := qa.TryDequeue(ctx); err != nil || string(m.Payload) != "untagged" {
		t.Fatalf("a's last take: %v, %v; want the untagged message", m, err)
	}
}

func TestNewConsumerGroupValidates(t *testing.T) {
	conn := zktest.Conn(t)
	for _, tc := range []struct{ dir, id string }{
		{"", "a"}, {"rel/consumers", "a"}, {"/", "a"}, {"/q/consumers/", "a"}, {"/q/consumers", ""}, {"/q/consumers", "a/b"},
	} {
		if _, err := zkqueue.NewConsumerGroup(conn, tc.dir, tc.id, zkqueue.ConsumerGroupConfig{}); err == nil {
			t.Errorf("NewConsumerGroup(%q, %q): no error", tc.dir, tc.id)
		}
	}
	if _, err := zkqueue.NewConsumerGroup(nil, "/q/consumers", "a", zkqueue.ConsumerGroupConfig{}); err == nil {
		t.Error("nil conn: no error")
	}
}
