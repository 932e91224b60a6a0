package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/semaphore"
)

// Thirty-two contenders on two sessions (as on two brokers) take one of
// four permits 2,000 times in all, each holding it briefly: until the
// four permits are held (or fewer when fewer acquisitions are left), so
// that the semaphore is full and every release has waiters to wake. Never
// more than four hold at once: each holder creates an ephemeral marker
// under a check node and counts the markers there (ZooKeeper's view), and
// an in-process count agrees. Herd-free: a release wakes the first waiter
// alone (its watch on the leases), a grant the waiter behind it alone (its
// watch on the granted waiter's node); with every waiter watching the
// leases, each release would wake all 28 waiters. No node is left once
// all are done.
func TestContention(t *testing.T) {
	const contenders, permits, total = 32, 4, 2000
	root := zktest.Root(t)
	semPath, check := root+"/sem", root+"/check"
	var (
		leaseWakes, queueWakes atomic.Int64
		mu                     sync.Mutex
		queueWoken             = map[string]int{} // waiter -> wakeups for the waiter before it
	)
	t.Cleanup(semaphore.SetWokenHook(func(key, pred string) {
		if pred == "" {
			leaseWakes.Add(1)
			return
		}
		queueWakes.Add(1)
		mu.Lock()
		queueWoken[key]++
		mu.Unlock()
	}))
	conns := []*zk.Conn{zktest.Conn(t), zktest.Conn(t)}
	if err := createAll(conns[0], check); err != nil {
		t.Fatal(err)
	}
	sems := []*semaphore.Semaphore{newSem(t, conns[0], semPath, permits), newSem(t, conns[1], semPath, permits)}
	ctx := testCtx(t, 3*time.Minute)

	var maxMarkers atomic.Int32
	var next atomic.Int64
	b := newBatch(permits)
	errc := make(chan error, contenders)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range contenders {
		conn, s := conns[i%2], sems[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; next.Add(1) <= total; r++ {
				if err := holdBriefly(ctx, conn, s, fmt.Sprintf("%s/c%02d-%d", check, i, r), check, b, &maxMarkers); err != nil {
					errc <- fmt.Errorf("contender %d round %d: %w", i, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	if m := maxMarkers.Load(); m != permits {
		t.Errorf("at most %d markers at once in ZooKeeper, want %d", m, permits)
	}
	if b.max != permits {
		t.Errorf("at most %d holders at once in the process, want %d", b.max, permits)
	}
	lw, qw := leaseWakes.Load(), queueWakes.Load()
	if lw > total || lw == 0 {
		t.Errorf("%d wakeups of first waiters for %d releases, want 1 to %d (at most one per release)", lw, total, total)
	}
	if qw > total {
		t.Errorf("%d wakeups for a waiter ahead gone, for %d grants, want at most one per grant", qw, total)
	}
	mu.Lock()
	for k, n := range queueWoken {
		if n > 1 {
			t.Errorf("waiter %s woke %d times for the waiter before it, want once", k, n)
		}
	}
	mu.Unlock()
	for _, s := range sems {
		_ = s.Close()
	}
	for _, d := range []string{semPath + "/queue", semPath + "/leases", check} {
		if got := children(t, conns[0], d); len(got) != 0 {
			t.Errorf("%d nodes left in %s: %v", len(got), d, got)
		}
	}
	t.Logf("%d acquisitions by %d contenders on 2 sessions, %d permits: %v (%.0f/s); at most %d holders; "+
		"wakeups: %d of first waiters for %d releases, %d for a waiter ahead gone", total, contenders, permits,
		elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), b.max, lw, total, qw)
}

// batch makes holders hold until the semaphore is full: each waits until
// as many hold as there are permits, or as acquisitions are under way when
// that is fewer.
type batch struct {
	permits int

	mu          sync.Mutex
	holding     int
	outstanding int
	max         int
	full        chan struct{} // closed when the current batch is complete
}

func newBatch(permits int) *batch { return &batch{permits: permits, full: make(chan struct{})} }

func (b *batch) start() {
	b.mu.Lock()
	b.outstanding++
	b.mu.Unlock()
}

// hold counts a new holder and returns a channel closed once the batch is
// complete.
func (b *batch) hold() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holding++
	b.max = max(b.max, b.holding)
	full := b.full
	b.check()
	return full
}

func (b *batch) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holding--
	b.outstanding--
	b.check()
}

func (b *batch) check() {
	if b.holding > 0 && b.holding >= min(b.permits, b.outstanding) {
		close(b.full)
		b.full = make(chan struct{})
	}
}

// holdBriefly takes a permit, creates its marker under check, counts the
// markers, waits for the batch, and gives everything back.
func holdBriefly(ctx context.Context, conn *zk.Conn, s *semaphore.Semaphore, marker, check string, b *batch, maxMarkers *atomic.Int32) error {
	b.start()
	l, err := s.Acquire(ctx, 1)
	if err != nil {
		return err
	}
	if _, err := conn.Create(marker, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		return fmt.Errorf("marker: %w", err)
	}
	markers, _, err := conn.Children(check)
	if err != nil {
		return err
	}
	raise(maxMarkers, int32(len(markers)))
	select {
	case <-b.hold():
	case <-ctx.Done():
		return ctx.Err()
	}
	markers, _, err = conn.Children(check)
	if err != nil {
		return err
	}
	raise(maxMarkers, int32(len(markers)))
	if err := conn.Delete(marker, -1); err != nil {
		return err
	}
	b.done()
	return l.Release(ctx)
}

func raise(max *atomic.Int32, n int32) {
	for {
		m := max.Load()
		if n <= m || max.CompareAndSwap(m, n) {
			return
		}
	}
}

func createAll(conn *zk.Conn, p string) error {
	for _, q := range []string{"/t", p[:len(p)-len("/check")], p} {
		if _, err := conn.Create(q, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", q, err)
		}
	}
	return nil
}
