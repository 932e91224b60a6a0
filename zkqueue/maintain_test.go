package zkqueue_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// runMaintain runs c.Maintain with cfg until the test ends.
func runMaintain(t *testing.T, c *zkqueue.Catalog, cfg zkqueue.MaintainConfig) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Maintain(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Maintain returned %v, want context.Canceled", err)
		}
	})
}

// Maintain releases expired leases (telling Released), finishes a
// deletion abandoned longer than AbandonedAfter, and deletes the dedup
// buckets of past windows; once that is done, its sweeps make no request
// while nothing happens, whatever the number of queues.
func TestCatalogMaintain(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	var reqs atomic.Int64
	c := newCatalog(t, conn, zkqueue.CatalogConfig{Observer: countAll(&reqs)})
	for _, n := range []string{"leased", "abandoned", "idle-1", "idle-2"} {
		mustCreate(t, c, n, fifo(time.Minute))
	}
	dedup := fifo(time.Minute)
	dedup.DedupWindow = time.Second
	mustCreate(t, c, "dedup", dedup)

	leased := openQueue(t, c, "leased")
	if _, err := leased.Items.Publish(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if ls, err := leased.Leases.Take(ctx, 1, zkqueue.Room{}, 300*time.Millisecond, false); err != nil || len(ls) != 1 {
		t.Fatalf("Take: %v, %v", ls, err)
	}
	d := openQueue(t, c, "dedup")
	if _, err := d.Items.PublishReceipts(ctx, []zkqueue.Draft{{Payload: []byte("x"), DedupID: "x"}}); err != nil {
		t.Fatal(err)
	}
	if n := len(queueNodes(t, conn, c.Path("dedup")+"/dedup")); n == 0 {
		t.Fatal("no dedup bucket after a publish with a dedup id")
	}
	markQueue(t, conn, c, "abandoned")

	var mu sync.Mutex
	var released []zkqueue.Expired
	var sweeps atomic.Int64
	runMaintain(t, c, zkqueue.MaintainConfig{
		Interval:       20 * time.Millisecond,
		AbandonedAfter: 200 * time.Millisecond,
		Ready:          func() bool { sweeps.Add(1); return true },
		Released: func(name string, e []zkqueue.Expired) {
			if name != "leased" {
				t.Errorf("released from %s, want leased", name)
			}
			mu.Lock()
			released = append(released, e...)
			mu.Unlock()
		},
		Error: func(err error) { t.Logf("sweep: %v", err) },
	})

	zktest.WaitFor(t, 20*time.Second, "the expired lease released", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(released) == 1
	})
	if released[0].Outcome != zkqueue.Requeued || string(released[0].Message.Payload) != "a" {
		t.Fatalf("released %q %v, want \"a\" requeued", released[0].Message.Payload, released[0].Outcome)
	}
	if n, err := leased.Items.Len(ctx); err != nil || n != 1 {
		t.Fatalf("Len after the release: got %d, %v; want 1", n, err)
	}
	zktest.WaitFor(t, 20*time.Second, "the abandoned deletion finished", func() bool { return !zktest.Exists(t, conn, c.Path("abandoned")) })
	zktest.WaitFor(t, 20*time.Second, "the dedup bucket of the past window deleted", func() bool {
		return len(queueNodes(t, conn, c.Path("dedup")+"/dedup")) == 0
	})

	// Idle: ten sweeps in a row without a request.
	last, since := reqs.Load(), sweeps.Load()
	zktest.WaitFor(t, 20*time.Second, "ten sweeps without a request", func() bool {
		if n := reqs.Load(); n != last {
			last, since = n, sweeps.Load()
		}
		return sweeps.Load()-since >= 10
	})
}

// Maintain skips its sweeps while Ready says no.
func TestCatalogMaintainWaitsUntilReady(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	c := newCatalog(t, conn, zkqueue.CatalogConfig{})
	mustCreate(t, c, "q", fifo(time.Minute))
	h := openQueue(t, c, "q")
	if _, err := h.Items.Publish(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Leases.Take(ctx, 1, zkqueue.Room{}, 100*time.Millisecond, false); err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	var asked, released atomic.Int64
	runMaintain(t, c, zkqueue.MaintainConfig{
		Interval: 20 * time.Millisecond,
		Ready:    func() bool { asked.Add(1); return ready.Load() },
		Released: func(string, []zkqueue.Expired) { released.Add(1) },
	})
	zktest.WaitFor(t, 20*time.Second, "sweeps past the lease's deadline", func() bool { return asked.Load() >= 20 })
	if released.Load() != 0 {
		t.Fatal("released a lease while not ready")
	}
	ready.Store(true)
	zktest.WaitFor(t, 20*time.Second, "the lease released once ready", func() bool { return released.Load() == 1 })
}
