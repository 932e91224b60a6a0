package lock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/lock"
)

// Lock, then Current describes the grant; Unlock is idempotent, closes
// Lost and removes the node; the next grant has a greater token.
func TestLockUnlock(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	conn := zktest.Conn(t)
	m := newMutex(t, conn, root, lock.WithValue([]byte("me")))
	ctx := testCtx(t, time.Minute)
	if _, err := lock.Current(ctx, conn, root); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Current of a free lock: got %v, want ErrNotHeld", err)
	}
	var last int64
	for round := range 3 {
		g, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if g.Token() <= last {
			t.Fatalf("round %d: token %d after %d, want greater", round, g.Token(), last)
		}
		last = g.Token()
		h, err := lock.Current(ctx, conn, root)
		if err != nil {
			t.Fatal(err)
		}
		if h.Key != g.Key() || h.Token != g.Token() || string(h.Value) != "me" || h.Revoked || h.Shared {
			t.Fatalf("Current = %+v, want the grant %s %d", h, g.Key(), g.Token())
		}
		if isClosed(g.Lost()) || isClosed(g.Revoked()) || g.Err() != nil {
			t.Fatal("a fresh grant is lost or revoked")
		}
		for range 2 {
			if err := g.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if !isClosed(g.Lost()) || g.Err() != nil {
			t.Fatalf("after Unlock: Lost closed %v, Err %v; want closed, nil", isClosed(g.Lost()), g.Err())
		}
		if got := children(t, conn, root); len(got) != 0 {
			t.Fatalf("nodes after Unlock: %v", got)
		}
	}
}

// TryLock takes a free lock and fails with ErrLocked, leaving no node,
// on a held one.
func TestTryLock(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	conn := zktest.Conn(t)
	a := newMutex(t, conn, root)
	b := newMutex(t, zktest.Conn(t), root)
	ctx := testCtx(t, time.Minute)
	g, err := a.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryLock(ctx); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryLock of a held lock: got %v, want ErrLocked", err)
	}
	// Another contender of the same Mutex is refused just the same.
	if _, err := a.TryLock(ctx); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("second TryLock through the holder's Mutex: got %v, want ErrLocked", err)
	}
	if got := children(t, conn, root); len(got) != 1 {
		t.Fatalf("nodes after the refused TryLocks: %v, want only the holder's", got)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g2, err := b.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	if err := g2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A Lock whose ctx ends while it waits returns ctx.Err() and leaves no
// node; one whose ctx has ended already creates none.
func TestLockCancelled(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	conn := zktest.Conn(t)
	holder := newMutex(t, conn, root)
	ctx := testCtx(t, time.Minute)
	g, err := holder.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan string, 1)
	t.Cleanup(lock.SetWaitingHook(func(key, _ string) {
		select {
		case waiting <- key:
		default:
		}
	}))
	m := newMutex(t, zktest.Conn(t), root)
	wctx, cancel := context.WithCancel(ctx)
	res := async(wctx, m.Lock)
	select {
	case <-waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the contender never waited")
	}
	cancel()
	if r := await(t, res, "the cancelled Lock"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled Lock: got %v, want context.Canceled", r.err)
	}
	if got := children(t, conn, root); len(got) != 1 || root+"/"+got[0] != g.Key() {
		t.Fatalf("nodes after the cancel: %v, want only the holder's %s", got, g.Key())
	}
	if _, err := m.Lock(wctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock with an ended ctx: got %v, want context.Canceled", err)
	}
	if got := children(t, conn, root); len(got) != 1 {
		t.Fatalf("nodes after a Lock with an ended ctx: %v", got)
	}
}

// Close ends a waiting Lock (ErrClosed, its node deleted); later calls
// fail with ErrClosed.
func TestClose(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	conn := zktest.Conn(t)
	holder := newMutex(t, conn, root)
	ctx := testCtx(t, time.Minute)
	g, err := holder.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := lock.NewMutex(zktest.Conn(t), root)
	if err != nil {
		t.Fatal(err)
	}
	res := async(ctx, m.Lock)
	zktest.WaitFor(t, 30*time.Second, "the waiter's node", func() bool { return len(children(t, conn, root)) == 2 })
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if r := await(t, res, "the closed Lock"); !errors.Is(r.err, lock.ErrClosed) {
		t.Fatalf("Lock ended by Close: got %v, want ErrClosed", r.err)
	}
	if _, err := m.TryLock(ctx); !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("TryLock after Close: got %v, want ErrClosed", err)
	}
	if got := children(t, conn, root); len(got) != 1 {
		t.Fatalf("nodes after Close: %v, want only the holder's", got)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestNew(t *testing.T) {
	conn := zktest.Conn(t)
	for _, p := range []string{"", "/", "rel", "/a/", "/a//b", "/a/./b"} {
		if _, err := lock.NewMutex(conn, p); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("NewMutex(%q): got %v, want ErrInvalid", p, err)
		}
		if _, err := lock.NewRWMutex(conn, p); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("NewRWMutex(%q): got %v, want ErrInvalid", p, err)
		}
	}
	if _, err := lock.NewMutex(nil, "/a"); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("NewMutex(nil conn): got %v, want ErrInvalid", err)
	}
	if _, err := lock.NewMutex(conn, "/a", lock.WithValue(make([]byte, 1<<20))); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("NewMutex with a 1 MiB value: got %v, want ErrInvalid", err)
	}
	root := zktest.Root(t) + "/x/lock"
	m := newMutex(t, conn, root, lock.WithoutCreate())
	ctx := testCtx(t, time.Minute)
	if _, err := m.Lock(ctx); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("Lock without the lock's node: got %v, want zk.ErrNoNode", err)
	}
	newMutex(t, conn, root)
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// UnlockKey deletes a grant's node given its key and token: the holder
// sees Lost close; a wrong token, a second call or a path that is not a
// lock node are refused.
func TestUnlockKey(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	conn := zktest.Conn(t)
	m := newMutex(t, zktest.Conn(t), root)
	ctx := testCtx(t, time.Minute)
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.UnlockKey(ctx, conn, g.Key(), g.Token()+1); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("UnlockKey with another token: got %v, want ErrNotHeld", err)
	} else if strings.Count(err.Error(), "lock: ") != 1 {
		t.Fatalf("UnlockKey with another token: got %q, want the package named once", err)
	}
	for _, key := range []string{root, root + "/x", "rel", root + "/lock-0000000001"} {
		if err := lock.UnlockKey(ctx, conn, key, g.Token()); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("UnlockKey(%q): got %v, want ErrInvalid", key, err)
		}
	}
	if isClosed(g.Lost()) {
		t.Fatal("refused UnlockKeys ended the grant")
	}
	if err := lock.UnlockKey(ctx, conn, g.Key(), g.Token()); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, g.Lost(), "Lost after UnlockKey")
	if err := g.Err(); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Err after UnlockKey: got %v, want ErrLost", err)
	}
	if err := lock.UnlockKey(ctx, conn, g.Key(), g.Token()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second UnlockKey: got %v, want ErrNotHeld", err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatalf("Unlock of a lost grant: %v", err)
	}
}

// Closing the holder's connection ends its grant.
func TestLostOnConnectionClosed(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	conn, _ := zktest.ConnCounting(t, []string{zktest.Addr(t)}, 4*time.Second)
	m := newMutex(t, conn, root)
	ctx := testCtx(t, time.Minute)
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other := newMutex(t, zktest.Conn(t), root)
	res := async(ctx, other.Lock)
	conn.Close()
	waitClosed(t, g.Lost(), "Lost after the connection closed")
	// Closing the session deletes the node: the watch sees either that or
	// its own end first.
	if !errors.Is(g.Err(), lock.ErrLost) {
		t.Fatalf("Err: got %v, want ErrLost", g.Err())
	}
	r := await(t, res, "the next contender")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestOrder(t *testing.T) {
	const n1, n2, n3 = "0123456789abcdef", "fedcba9876543210", "00000000000000ff"
	for _, tc := range []struct {
		name     string
		children []string
		holders  []string
		me       string
		waitsFor string
	}{
		{"lowest holds", []string{"lock-" + n1 + "-0000000002", "lock-" + n2 + "-0000000001", "junk", "lock-xyz-0000000000"},
			[]string{"lock-" + n2 + "-0000000001"}, "lock-" + n1 + "-0000000002", "lock-" + n2 + "-0000000001"},
		{"readers share", []string{"read-" + n1 + "-0000000001", "read-" + n2 + "-0000000002", "write-" + n3 + "-0000000003", "read-" + n3 + "-0000000004"},
			[]string{"read-" + n1 + "-0000000001", "read-" + n2 + "-0000000002"}, "read-" + n3 + "-0000000004", "write-" + n3 + "-0000000003"},
		{"writer waits for the node before", []string{"read-" + n1 + "-0000000001", "read-" + n2 + "-0000000002", "write-" + n3 + "-0000000003"},
			[]string{"read-" + n1 + "-0000000001", "read-" + n2 + "-0000000002"}, "write-" + n3 + "-0000000003", "read-" + n2 + "-0000000002"},
		{"numbers, not strings", []string{"lock-" + n1 + "-0000000010", "lock-" + n2 + "--000000005", "lock-" + n3 + "-0000000009"},
			[]string{"lock-" + n2 + "--000000005"}, "lock-" + n1 + "-0000000010", "lock-" + n3 + "-0000000009"},
		{"a reader behind readers holds", []string{"read-" + n1 + "-0000000001", "read-" + n2 + "-0000000002"},
			[]string{"read-" + n1 + "-0000000001", "read-" + n2 + "-0000000002"}, "read-" + n2 + "-0000000002", ""},
		{"a Mutex counts as a writer", []string{"lock-" + n1 + "-0000000001", "read-" + n2 + "-0000000002"},
			[]string{"lock-" + n1 + "-0000000001"}, "read-" + n2 + "-0000000002", "lock-" + n1 + "-0000000001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holders, waitsFor := lock.Order(tc.children, tc.me)
			if !slices.Equal(holders, tc.holders) || waitsFor != tc.waitsFor {
				t.Errorf("got holders %v, %s waits for %q; want %v, %q", holders, tc.me, waitsFor, tc.holders, tc.waitsFor)
			}
		})
	}
}
