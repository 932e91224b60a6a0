package syncqueue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/syncqueue"
)

func TestBarrier(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := zktest.Root(t) + "/a/barrier"
	b, err := syncqueue.NewBarrier(zktest.Conn(t), path)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := syncqueue.NewBarrier(zktest.Conn(t), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := waiter.Wait(ctx); err != nil {
		t.Fatalf("Wait on a barrier that is not set: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := b.Set(ctx); err != nil {
			t.Fatalf("Set %d: %v", i, err)
		}
	}
	if ok, err := waiter.IsSet(ctx); err != nil || !ok {
		t.Fatalf("IsSet = %v, %v; want true", ok, err)
	}
	const waiters = 3
	errc := make(chan error, waiters)
	for i := 0; i < waiters; i++ {
		go func() { errc <- waiter.Wait(ctx) }()
	}
	select {
	case err := <-errc:
		t.Fatalf("Wait returned %v while the barrier is set", err)
	case <-time.After(150 * time.Millisecond):
	}
	for i := 0; i < 2; i++ {
		if err := b.Remove(ctx); err != nil {
			t.Fatalf("Remove %d: %v", i, err)
		}
	}
	for i := 0; i < waiters; i++ {
		if err := <-errc; err != nil {
			t.Fatalf("Wait after Remove: %v", err)
		}
	}
}

// Five participants with their own sessions, arriving one after the other
// and finishing in the opposite order: nobody returns from Enter before all
// five called it, nobody returns from Leave before all five called it, and
// nothing is left under the barrier. Two rounds on one path.
func TestDoubleBarrierFive(t *testing.T) {
	const n = 5
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := zktest.Root(t) + "/db"
	bs := make([]*syncqueue.DoubleBarrier, n)
	for i := range bs {
		b, err := syncqueue.NewDoubleBarrier(zktest.Conn(t), path, n, fmt.Sprintf("p%d", i))
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = b
	}
	admin := zktest.Conn(t)
	for round := 0; round < 2; round++ {
		var entering, leaving atomic.Int32
		var wg sync.WaitGroup
		errc := make(chan error, 2*n)
		for i, b := range bs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i) * 40 * time.Millisecond)
				entering.Add(1)
				if err := b.Enter(ctx); err != nil {
					errc <- err
					return
				}
				if k := entering.Load(); k != n {
					errc <- fmt.Errorf("round %d: participant %d passed Enter with %d of %d entering", round, i, k, n)
				}
				time.Sleep(time.Duration(n-i) * 40 * time.Millisecond)
				leaving.Add(1)
				if err := b.Leave(ctx); err != nil {
					errc <- err
					return
				}
				if k := leaving.Load(); k != n {
					errc <- fmt.Errorf("round %d: participant %d returned from Leave with %d of %d leaving", round, i, k, n)
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Error(err)
		}
		if children, _, err := admin.Children(path); err != nil || len(children) != 0 {
			t.Fatalf("round %d: left under the barrier: %v, %v", round, children, err)
		}
	}
	if err := bs[0].Leave(ctx); !errors.Is(err, syncqueue.ErrNotEntered) {
		t.Errorf("Leave without Enter: got %v, want ErrNotEntered", err)
	}
}

// Cancelled waits return the context's error, remove the caller's nodes
// and leave no goroutine behind.
func TestCancelledWaitsLeaveNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root := zktest.Root(t)
	conn, conn2 := zktest.Conn(t), zktest.Conn(t)
	q := newQueue(t, conn, root+"/sq", 3)
	bar, err := syncqueue.NewBarrier(conn, root+"/barrier")
	if err != nil {
		t.Fatal(err)
	}
	db1, err := syncqueue.NewDoubleBarrier(conn, root+"/db", 2, "one")
	if err != nil {
		t.Fatal(err)
	}
	db2, err := syncqueue.NewDoubleBarrier(conn2, root+"/db", 2, "two")
	if err != nil {
		t.Fatal(err)
	}
	ignore := goleak.IgnoreCurrent()

	cancelQueueWaits(ctx, t, conn, q, root+"/sq")
	cancelBarrierWait(ctx, t, bar)
	cancelDoubleBarrierWaits(ctx, t, conn, db1, db2, root+"/db")
	goleak.VerifyNone(t, ignore)
}

// short is a context that expires 100ms into a wait that cannot end.
func short(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 100*time.Millisecond)
}

// childrenOf lists p's children, failing the test on error.
func childrenOf(t *testing.T, conn *zk.Conn, p string) []string {
	t.Helper()
	c, _, err := conn.Children(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// cancelQueueWaits: a Join that gives up removes its member node,
// JoinAsync + Leave stops the membership's goroutine, and Dequeue gives
// up both before the queue (at path) opens and on an open, empty queue.
func cancelQueueWaits(ctx context.Context, t *testing.T, conn *zk.Conn, q *syncqueue.Queue, path string) {
	t.Helper()
	sctx, scancel := short(ctx)
	if _, err := q.Join(sctx, "impatient"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Join past its deadline: got %v, want DeadlineExceeded", err)
	}
	scancel()
	if c := childrenOf(t, conn, path+"/members"); len(c) != 0 {
		t.Fatalf("members after a cancelled Join: %v", c)
	}
	m, err := q.JoinAsync(ctx, "async")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx); !errors.Is(err, syncqueue.ErrLeft) {
		t.Fatalf("Wait after Leave: got %v, want ErrLeft", err)
	}
	if c := childrenOf(t, conn, path+"/members"); len(c) != 0 {
		t.Fatalf("members after Leave: %v", c)
	}
	sctx, scancel = short(ctx)
	if _, err := q.Dequeue(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dequeue of a closed queue: got %v, want DeadlineExceeded", err)
	}
	scancel()
	if err := q.Open(ctx); err != nil {
		t.Fatal(err)
	}
	sctx, scancel = short(ctx)
	if _, err := q.Dequeue(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dequeue of an empty queue: got %v, want DeadlineExceeded", err)
	}
	scancel()
}

// cancelBarrierWait: Wait on a set barrier gives up at its deadline.
func cancelBarrierWait(ctx context.Context, t *testing.T, bar *syncqueue.Barrier) {
	t.Helper()
	if err := bar.Set(ctx); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := short(ctx)
	if err := bar.Wait(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a set barrier: got %v, want DeadlineExceeded", err)
	}
	scancel()
}

// cancelDoubleBarrierWaits: db1 entering alone gives up and leaves nothing
// under path; db1 leaving while db2 stays gives up and leaves only db2's
// nodes and "ready".
func cancelDoubleBarrierWaits(ctx context.Context, t *testing.T, conn *zk.Conn, db1, db2 *syncqueue.DoubleBarrier, path string) {
	t.Helper()
	sctx, scancel := short(ctx)
	if err := db1.Enter(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Enter alone: got %v, want DeadlineExceeded", err)
	}
	scancel()
	if c := childrenOf(t, conn, path); len(c) != 0 {
		t.Fatalf("double barrier after a cancelled Enter: %v", c)
	}
	errc := make(chan error, 1)
	go func() { errc <- db2.Enter(ctx) }()
	if err := db1.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	sctx, scancel = short(ctx)
	if err := db1.Leave(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Leave while another stays: got %v, want DeadlineExceeded", err)
	}
	scancel()
	for _, c := range childrenOf(t, conn, path) {
		if c != "ready" && c[:3] != "two" {
			t.Fatalf("node %s left after a cancelled Leave", c)
		}
	}
	if err := db2.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if c := childrenOf(t, conn, path); len(c) != 0 {
		t.Fatalf("double barrier after everyone left: %v", c)
	}
}

// Opening the queue wakes every consumer waiting for it: they share one
// exists watch per Queue.
func TestOpeningWakesAllWaitingConsumers(t *testing.T) {
	ctx := context.Background()
	path := zktest.Root(t) + "/sq"
	q := newQueue(t, zktest.Conn(t), path, 2)
	const consumers = 5
	got := make(chan error, consumers)
	for i := 0; i < consumers; i++ {
		go func() {
			_, err := q.Dequeue(ctx)
			got <- err
		}()
	}
	time.Sleep(50 * time.Millisecond)
	admin := newQueue(t, zktest.Conn(t), path, 2)
	if _, err := admin.PublishBatch(ctx, [][]byte{{1}, {2}, {3}, {4}, {5}}); err != nil {
		t.Fatal(err)
	}
	if err := admin.Open(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < consumers; i++ {
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiting Dequeue did not wake when the queue opened")
		}
	}
}
