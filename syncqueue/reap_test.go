package syncqueue_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/syncqueue"
)

// enterAll enters every participant at once and fails unless all enter.
func enterAll(ctx context.Context, t *testing.T, ps ...*syncqueue.DoubleBarrier) {
	t.Helper()
	errc := make(chan error, len(ps))
	for _, p := range ps {
		go func() { errc <- p.Enter(ctx) }()
	}
	for range ps {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// A round whose participants all Close (leave without Leave, as a
// crashed or cancelled one does) leaves ready behind: the next round's
// first arrival must not take it for its own and enter alone; it enters
// with the second arrival. The reaper then deletes the idle barrier, stale
// ready and all, and a later round makes it again.
func TestDoubleBarrierStaleReadyAndReaper(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := zktest.Root(t) + "/barriers"
	path := dir + "/b"
	conn := zktest.Conn(t)
	newP := func(id string) *syncqueue.DoubleBarrier {
		t.Helper()
		db, err := syncqueue.NewDoubleBarrier(zktest.Conn(t), path, 2, id)
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	a, b := newP("a"), newP("b")
	enterAll(ctx, t, a, b)
	if a.Key() == "" || b.Key() == "" {
		t.Fatalf("Key after Enter: %q, %q; want the participant nodes", a.Key(), b.Key())
	}
	for _, p := range []*syncqueue.DoubleBarrier{a, b} {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if p.Key() != "" {
			t.Fatalf("Key after Close: %q, want none", p.Key())
		}
	}
	if c := childrenOf(t, conn, path); !slices.Equal(c, []string{"ready"}) {
		t.Fatalf("after a round that closed: %v, want [ready]", c)
	}

	c := newP("c")
	sctx, scancel := short(ctx)
	if err := c.Enter(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Enter alone over a stale ready: got %v, want DeadlineExceeded", err)
	}
	scancel()
	d := newP("d")
	enterAll(ctx, t, c, d)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	r, err := syncqueue.NewDoubleBarrierReaper(conn, dir)
	if err != nil {
		t.Fatal(err)
	}
	for pass, want := range []int{0, 1} {
		n, err := r.Reap(ctx)
		if err != nil || n != want {
			t.Fatalf("pass %d: Reap = %d, %v; want %d", pass, n, err, want)
		}
	}
	if ok, _, err := conn.Exists(path); err != nil || ok {
		t.Fatalf("barrier node after the reaper: exists %v, %v", ok, err)
	}
	e, f := newP("e"), newP("f") // NewDoubleBarrier made the node again
	if err := conn.Delete(path, -1); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := conn.Exists(path); ok {
		t.Fatal("barrier node not deleted")
	}
	enterAll(ctx, t, e, f) // Enter makes it again
	errc := make(chan error, 1)
	go func() { errc <- e.Leave(ctx) }()
	if err := f.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if c := childrenOf(t, conn, path); len(c) != 0 {
		t.Fatalf("after everyone left: %v", c)
	}
}
