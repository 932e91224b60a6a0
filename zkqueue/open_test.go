package zkqueue_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

func openQueue(t *testing.T, c *zkqueue.Catalog, name string) *zkqueue.Handles {
	t.Helper()
	h, err := c.Open(name, zkqueue.OpenConfig{ProcessID: "p"})
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	return h
}

// Open lays a queue's parts out under its node and creates nothing: a
// queue that does not exist (or is marked for deletion) is not found and
// leaves no node behind.
func TestCatalogOpen(t *testing.T) {
	conn := zktest.Conn(t)
	c := newCatalog(t, conn, zkqueue.CatalogConfig{})
	s := fifo(time.Minute)
	s.Kind = zkqueue.KindPriority
	mustCreate(t, c, "q", s)
	h := openQueue(t, c, "q")
	p := c.Path("q")
	for _, tc := range []struct{ got, want string }{
		{h.Path, p}, {h.Items.Path(), p + "/items"}, {h.Delayed.Path(), p + "/delayed"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
	if h.Spec.Kind != zkqueue.KindPriority || h.Stale() {
		t.Fatalf("spec %v, stale %v", h.Spec, h.Stale())
	}
	if _, err := h.Items.PublishPriority(context.Background(), 3, []byte("x")); err != nil {
		t.Fatalf("a priority queue's priority: %v", err)
	}

	if _, err := c.Open("missing", zkqueue.OpenConfig{ProcessID: "p"}); !errors.Is(err, zkqueue.ErrQueueNotFound) {
		t.Fatalf("Open of a missing queue: got %v, want ErrQueueNotFound", err)
	}
	if zktest.Exists(t, conn, c.Path("missing")) {
		t.Fatal("Open created a missing queue's node")
	}
	mustCreate(t, c, "m", fifo(time.Minute))
	hm := openQueue(t, c, "m")
	markQueue(t, conn, c, "m")
	zktest.WaitFor(t, 20*time.Second, "the handles stale", hm.Stale)
	if _, err := c.Open("m", zkqueue.OpenConfig{ProcessID: "p"}); !errors.Is(err, zkqueue.ErrQueueNotFound) {
		t.Fatalf("Open of a marked queue: got %v, want ErrQueueNotFound", err)
	}
}

// Run moves due delayed messages into the queue and expires those that
// outlive the TTL, counting them through OpenConfig.Expired, and returns
// once the handles go stale (the queue is deleted).
func TestHandlesRun(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	c := newCatalog(t, conn, zkqueue.CatalogConfig{})
	s := fifo(time.Minute)
	s.MessageTTL = time.Second
	mustCreate(t, c, "q", s)
	var expired atomic.Int64
	h, err := c.Open("q", zkqueue.OpenConfig{ProcessID: "p", Expired: func(n int) { expired.Add(int64(n)) }})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx, func(err error) { t.Logf("run: %v", err) }) }()
	t.Cleanup(func() { <-done })

	if _, err := h.Delayed.PublishAll(ctx, []zkqueue.Draft{{Payload: []byte("later")}}, []time.Time{time.Now().Add(200 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 20*time.Second, "the delayed message moved", func() bool {
		n, err := h.Items.Len(ctx)
		return err == nil && n == 1
	})
	zktest.WaitFor(t, 20*time.Second, "the message expired", func() bool {
		n, err := h.Items.Len(ctx)
		return err == nil && n == 0 && expired.Load() == 1
	})
	if err := c.Delete(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run went on after the queue was deleted")
	}
}
