package counter_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/counter"
	"github.com/qbroker/qbroker/internal/zktest"
)

func newCounter(t testing.TB, conn *zk.Conn, p string, opts ...counter.Option) *counter.Counter {
	t.Helper()
	c, err := counter.New(conn, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// valueNodes returns the value nodes under the counter p.
func valueNodes(t testing.TB, conn *zk.Conn, p string) []string {
	t.Helper()
	kids, _, err := conn.Children(p)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range kids {
		if _, ok := counter.ParseName(k); ok {
			out = append(out, k)
		}
	}
	return out
}

// addConcurrently runs workers goroutines of adds Adds of 1 each, the
// workers alternating between conns, and checks that the Adds returned
// every value from 1 to workers*adds once. With shared, the workers on a
// connection share one Counter (as a broker's clients do); else each
// has its own.
func addConcurrently(t *testing.T, ctx context.Context, conns []*zk.Conn, p string, workers, adds int, shared bool) {
	t.Helper()
	var mu sync.Mutex
	seen := make(map[int64]bool, workers*adds)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	var conflicts atomic.Int64
	var writes atomic.Int64
	defer func() { t.Logf("%d writes, %d conflicts", writes.Load(), conflicts.Load()) }()
	hooks := []counter.Option{counter.WithConflictHook(func() { conflicts.Add(1) }),
		counter.WithWriteHook(func(counter.Write) { writes.Add(1) })}
	var counters []*counter.Counter
	for _, conn := range conns {
		counters = append(counters, newCounter(t, conn, p, hooks...))
	}
	for w := range workers {
		c := counters[w%len(conns)]
		if !shared {
			c = newCounter(t, conns[w%len(conns)], p, hooks...)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range adds {
				v, err := c.Add(ctx, 1)
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				mu.Lock()
				dup := seen[v]
				seen[v] = true
				mu.Unlock()
				if dup {
					errs <- fmt.Errorf("worker %d: Add returned %d twice", w, v)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for v := int64(1); v <= int64(workers*adds); v++ {
		if !seen[v] {
			t.Fatalf("no Add returned %d", v)
		}
	}
}

// 16 goroutines add 1 a thousand times each, over two ZooKeeper sessions
// with a Counter each (as two brokers would): the sum is exact and every
// Add returned a distinct value, 1 to 16,000.
func TestAddsSumExactly(t *testing.T) {
	const workers, adds = 16, 1000
	p := zktest.Root(t) + "/hits"
	conns := []*zk.Conn{zktest.Conn(t), zktest.Conn(t)}
	ctx := testCtx(t, 5*time.Minute)
	start := time.Now()
	addConcurrently(t, ctx, conns, p, workers, adds, true)
	t.Logf("%d Adds by %d goroutines over 2 sessions in %v", workers*adds, workers, time.Since(start).Round(time.Millisecond))
	got, err := newCounter(t, conns[1], p).Get(ctx)
	if err != nil || got != workers*adds {
		t.Fatalf("Get: got %d, %v; want %d", got, err, workers*adds)
	}
}

// With rollovers every few writes, concurrent Adds over two sessions, a
// Counter per goroutine (no combining: every Add a write of its own),
// still sum exactly, and one value node is left, of a later epoch.
func TestRolloverKeepsEveryAdd(t *testing.T) {
	defer counter.SetMaxVersion(3)()
	const workers, adds = 8, 100
	p := zktest.Root(t) + "/rolled"
	conns := []*zk.Conn{zktest.Conn(t), zktest.Conn(t)}
	ctx := testCtx(t, 3*time.Minute)
	addConcurrently(t, ctx, conns, p, workers, adds, false)
	got, err := newCounter(t, conns[0], p).Get(ctx)
	if err != nil || got != workers*adds {
		t.Fatalf("Get: got %d, %v; want %d", got, err, workers*adds)
	}
	nodes := valueNodes(t, conns[0], p)
	if len(nodes) != 1 {
		t.Fatalf("value nodes %v, want one", nodes)
	}
	// 800 writes, 4 to a node (versions 0..3), the first node made by
	// the first write: epoch 199.
	if e, _ := counter.ParseName(nodes[0]); e != workers*adds/4-1 {
		t.Fatalf("value node %s: epoch %d, want %d", nodes[0], e, workers*adds/4-1)
	}
	_, st, err := conns[0].Get(path.Join(p, nodes[0]))
	if err != nil || st.Version > 3 {
		t.Fatalf("value node's version %v, %v; want at most 3", st, err)
	}
}

// The ABA a version wrap (or a node made again at version 0) would allow:
// a Counter that last wrote the counter at some version tries its next
// Add on that state without reading, after others moved the counter on
// by whole rollovers, back to a node at the same version. A scheme
// keeping one node (a versioned write on a version that came round
// again) would apply the Add to the old value and lose the others'. Here
// the value node's name differs, the write is refused, and the Add lands
// on the current value.
func TestStaleStateAfterRolloverIsRefused(t *testing.T) {
	defer counter.SetMaxVersion(4)()
	p := zktest.Root(t) + "/aba"
	ctx := testCtx(t, time.Minute)
	connA, connB := zktest.Conn(t), zktest.Conn(t)
	var writesA []counter.Write
	var conflictsA int
	a := newCounter(t, connA, p, counter.WithWriteHook(func(w counter.Write) { writesA = append(writesA, w) }),
		counter.WithConflictHook(func() { conflictsA++ }))
	for range 3 {
		if _, err := a.Add(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	last := writesA[len(writesA)-1]
	b := newCounter(t, connB, p)
	// Five writes fill a node (versions 0..4): after 5 more, a's node is
	// gone and another stands at a's version.
	for range 5 {
		if _, err := b.Add(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	nodes := valueNodes(t, connB, p)
	_, st, err := connB.Get(path.Join(p, nodes[0]))
	if err != nil {
		t.Fatal(err)
	}
	if nodes[0] == last.Node || st.Version != last.Version {
		t.Fatalf("setup: value node %s at version %d; want another node than %s at version %d", nodes[0], st.Version, last.Node, last.Version)
	}
	got, err := a.Add(ctx, 1)
	if err != nil || got != 3+50+1 {
		t.Fatalf("Add on a stale state: got %d, %v; want %d", got, err, 54)
	}
	if conflictsA != 1 {
		t.Fatalf("a's conflicts: got %d, want 1 (its stale state refused)", conflictsA)
	}
}

// The operations' answers, one session after another.
func TestOperations(t *testing.T) {
	p := zktest.Root(t) + "/ops"
	ctx := testCtx(t, time.Minute)
	conn := zktest.Conn(t)
	c := newCounter(t, conn, p)
	if v, err := c.Get(ctx); err != nil || v != 0 {
		t.Fatalf("Get of a new counter: got %d, %v; want 0", v, err)
	}
	if ok, _, err := conn.Exists(p); err != nil || ok {
		t.Fatalf("after Get of a new counter: exists %v, %v; want nothing created", ok, err)
	}
	if ok, err := c.CompareAndSet(ctx, 1, 5); err != nil || ok {
		t.Fatalf("CompareAndSet(1, 5) on 0: got %v, %v; want false", ok, err)
	}
	if ok, err := c.CompareAndSet(ctx, 0, 5); err != nil || !ok {
		t.Fatalf("CompareAndSet(0, 5) on 0: got %v, %v; want true", ok, err)
	}
	if v, err := c.Add(ctx, -7); err != nil || v != -2 {
		t.Fatalf("Add(-7) on 5: got %d, %v; want -2", v, err)
	}
	if ok, err := c.CompareAndSet(ctx, -2, -2); err != nil || !ok {
		t.Fatalf("CompareAndSet(-2, -2): got %v, %v; want true", ok, err)
	}
	if old, err := c.Set(ctx, math.MaxInt64); err != nil || old != -2 {
		t.Fatalf("Set(MaxInt64): got %d, %v; want old -2", old, err)
	}
	if _, err := c.Add(ctx, 1); !errors.Is(err, counter.ErrOverflow) {
		t.Fatalf("Add(1) on MaxInt64: got %v, want ErrOverflow", err)
	}
	if _, err := c.Set(ctx, math.MinInt64); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Add(ctx, -1); !errors.Is(err, counter.ErrOverflow) {
		t.Fatalf("Add(-1) on MinInt64: got %v, want ErrOverflow", err)
	}
	if v, err := newCounter(t, zktest.Conn(t), p).Get(ctx); err != nil || v != math.MinInt64 {
		t.Fatalf("Get on another session: got %d, %v; want MinInt64", v, err)
	}
	nodes := valueNodes(t, conn, p)
	if len(nodes) != 1 {
		t.Fatalf("value nodes %v, want one", nodes)
	}
	if _, err := conn.Set(path.Join(p, nodes[0]), []byte("twelve"), -1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Add(ctx, 1); !errors.Is(err, counter.ErrCorrupt) {
		t.Fatalf("Add on corrupt data: got %v, want ErrCorrupt", err)
	}
	for _, bad := range []string{"", "rel", "/", "/a/", "/a//b"} {
		if _, err := counter.New(conn, bad); !errors.Is(err, counter.ErrInvalid) {
			t.Errorf("New(%q): got %v, want ErrInvalid", bad, err)
		}
	}
}

// A Get after another session's Add sees it, whatever the Counter knew.
func TestGetSeesOtherSessionsWrites(t *testing.T) {
	p := zktest.Root(t) + "/fresh"
	ctx := testCtx(t, time.Minute)
	a, b := newCounter(t, zktest.Conn(t), p), newCounter(t, zktest.Conn(t), p)
	for i := int64(1); i <= 20; i++ {
		if _, err := b.Add(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if v, err := a.Get(ctx); err != nil || v != i {
			t.Fatalf("Get after Add %d: got %d, %v", i, v, err)
		}
	}
}

// An Add whose write is on its way when its context ends reports an
// unknown outcome (the write may still be applied); an Add still queued
// behind it, or whose context ended before, reports the context's error
// and is never applied.
func TestAddOutcomeWhenContextEnds(t *testing.T) {
	p := zktest.Root(t) + "/cut"
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	c := newCounter(t, zktest.ConnTo(t, []string{proxy.Addr()}), p)
	ctx := testCtx(t, time.Minute)
	if _, err := c.Add(ctx, 1); err != nil { // the next Add writes at once, without a read
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Add(done, 1); !errors.Is(err, context.Canceled) || errors.Is(err, counter.ErrUnknownOutcome) {
		t.Fatalf("Add with an ended context: got %v, want Canceled alone", err)
	}
	proxy.Stall()
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := c.Add(short, 1)
	if !errors.Is(err, counter.ErrUnknownOutcome) {
		t.Fatalf("Add whose write is stalled: got %v, want ErrUnknownOutcome", err)
	}
	queued, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.Add(queued, 100); err == nil || errors.Is(err, counter.ErrUnknownOutcome) {
		t.Fatalf("Add queued behind a stalled write: got %v, want an error that is not ErrUnknownOutcome", err)
	}
	proxy.Resume()
	v, err := newCounter(t, zktest.Conn(t), p).Get(ctx)
	if err != nil || v != 1 && v != 2 {
		t.Fatalf("after the stall: got %d, %v; want 1 or 2 (the stalled Add applied or not, the queued one not)", v, err)
	}
	t.Logf("the Add of unknown outcome was applied: %v", v == 2)
}

// Get's confirmation is a transaction of its own, ordered with every
// write (it takes a zxid), not a read a lagging server could answer:
// between two creates, a Get (of a state its Counter knows: the check
// alone) moves the zxid by one.
func TestGetIsATransaction(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	ctx := testCtx(t, time.Minute)
	c := newCounter(t, conn, root+"/c")
	if _, err := c.Add(ctx, 1); err != nil {
		t.Fatal(err)
	}
	czxid := func(name string) int64 {
		t.Helper()
		if _, err := conn.Create(root+"/"+name, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
		_, st, err := conn.Get(root + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return st.Czxid
	}
	before := czxid("before")
	if v, err := c.Get(ctx); err != nil || v != 1 {
		t.Fatalf("Get: got %d, %v; want 1", v, err)
	}
	if after := czxid("after"); after != before+2 {
		t.Fatalf("zxids: %#x before the Get, %#x after; want the Get's own in between", before, after)
	}
}
