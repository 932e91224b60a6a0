package zkqueue_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// countAll returns an Observer counting every request.
func countAll(n *atomic.Int64) zkqueue.Observer {
	return func(string, time.Duration, error) { n.Add(1) }
}

// The sweeper reads a lease once; while nothing changes and no deadline
// passes it has nothing to do (Due is false) and makes no request. An
// Extend or a delayed Nack that moves a deadline earlier is seen through
// the lease's data watch, and the lease is released at its new deadline.
func TestLeaseSweeper(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	items, err := zkqueue.New(conn, root+"/items")
	if err != nil {
		t.Fatal(err)
	}
	leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	var reqs atomic.Int64
	sw := zkqueue.NewLeaseSweeper(zktest.Conn(t), root+"/items", root+"/leases", root+"/dead",
		zkqueue.SweeperConfig{Observer: countAll(&reqs)})
	sweep := func(want int) []zkqueue.Expired {
		t.Helper()
		out, err := sw.Sweep(ctx, time.Now(), zkqueue.Policy{})
		if err != nil || len(out) != want {
			t.Fatalf("Sweep: got %d released, %v; want %d", len(out), err, want)
		}
		return out
	}

	// No leases: one listing, then nothing to do.
	if !sw.Due(time.Now()) {
		t.Fatal("a new sweeper is not due")
	}
	sweep(0)
	if sw.Due(time.Now()) || reqs.Load() != 1 {
		t.Fatalf("after sweeping no leases: due %v, %d requests; want false, 1", sw.Due(time.Now()), reqs.Load())
	}

	// A long lease: read once, then nothing to do.
	for _, p := range []string{"a", "b"} {
		if _, err := items.Publish(ctx, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := leases.Take(ctx, 2, zkqueue.Room{}, time.Hour, false)
	if err != nil || len(ls) != 2 {
		t.Fatalf("TakeLeases: %v, %v", ls, err)
	}
	zktest.WaitFor(t, 20*time.Second, "the leases' children watch", func() bool { return sw.Due(time.Now()) })
	sweep(0)
	if sw.InFlight() != 2 {
		t.Fatalf("InFlight: got %d, want 2", sw.InFlight())
	}
	before := reqs.Load()
	if sw.Due(time.Now()) {
		t.Fatal("due with two live, unchanged leases")
	}

	again := releaseAtNewDeadlines(ctx, t, leases, sw, ls, before, &reqs)
	deadLetterPastMaxDeliveries(ctx, t, leases, sw, again)
}

// sweepUntil sweeps whenever sw is due until n leases have been released,
// and returns them.
func sweepUntil(ctx context.Context, t *testing.T, what string, sw *zkqueue.LeaseSweeper, p zkqueue.Policy, n int) []zkqueue.Expired {
	t.Helper()
	var released []zkqueue.Expired
	zktest.WaitFor(t, 20*time.Second, what, func() bool {
		if sw.Due(time.Now()) {
			out, err := sw.Sweep(ctx, time.Now(), p)
			if err != nil {
				t.Fatal(err)
			}
			released = append(released, out...)
		}
		return len(released) == n
	})
	return released
}

// releaseAtNewDeadlines extends ls[0] to a shorter deadline and Nacks
// ls[1] with a short delay: sw sees both through the leases' data watches
// without a request (reqs stays at before) and requeues both at their new
// deadlines. It returns the two messages leased again.
func releaseAtNewDeadlines(ctx context.Context, t *testing.T, leases *zkqueue.Leases, sw *zkqueue.LeaseSweeper, ls []zkqueue.Lease, before int64, reqs *atomic.Int64) []zkqueue.Lease {
	t.Helper()
	if _, err := leases.Extend(ctx, ls[0].Token, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, out, err := leases.Nack(ctx, ls[1].Token, 300*time.Millisecond, zkqueue.Policy{}); err != nil || out != zkqueue.Delayed {
		t.Fatalf("Nack: %v, %v", out, err)
	}
	zktest.WaitFor(t, 20*time.Second, "the leases' data watches", func() bool { return sw.Due(time.Now()) })
	if reqs.Load() != before {
		t.Fatalf("%d requests while nothing changed", reqs.Load()-before)
	}
	released := sweepUntil(ctx, t, "both leases released", sw, zkqueue.Policy{}, 2)
	for _, e := range released {
		if e.Outcome != zkqueue.Requeued {
			t.Errorf("outcome %v, want Requeued", e.Outcome)
		}
	}
	again, err := leases.Take(ctx, 2, zkqueue.Room{}, time.Hour, false)
	if err != nil || len(again) != 2 || again[0].Deliveries != 2 || again[1].Deliveries != 2 {
		t.Fatalf("redelivery: %+v, %v; want 2 messages delivered twice", again, err)
	}
	return again
}

// deadLetterPastMaxDeliveries lets the leases ls, delivered twice, expire
// under MaxDeliveries 2: both are dead-lettered.
func deadLetterPastMaxDeliveries(ctx context.Context, t *testing.T, leases *zkqueue.Leases, sw *zkqueue.LeaseSweeper, ls []zkqueue.Lease) {
	t.Helper()
	for _, l := range ls {
		if _, err := leases.Extend(ctx, l.Token, 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	dead := sweepUntil(ctx, t, "dead-lettering", sw, zkqueue.Policy{MaxDeliveries: 2, DeadLetter: true}, 2)
	if n, err := leases.DeadCount(ctx); err != nil || n != 2 || dead[0].Outcome != zkqueue.DeadLettered {
		t.Fatalf("dead letters: %d, %v, outcome %v", n, err, dead[0].Outcome)
	}
}

// A sweeper whose leases parent is missing says so with ErrNoNode, and
// creates nothing.
func TestLeaseSweeperMissingParent(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	sw := zkqueue.NewLeaseSweeper(conn, root+"/items", root+"/leases", root+"/dead", zkqueue.SweeperConfig{})
	if _, err := sw.Sweep(context.Background(), time.Now(), zkqueue.Policy{}); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("got %v, want ErrNoNode", err)
	}
	if ok, _, err := conn.Exists(root); err != nil || ok {
		t.Fatalf("root exists: %v, %v", ok, err)
	}
}
