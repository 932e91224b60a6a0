package semaphore_test

import (
	"errors"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/lockdelay"
	"github.com/qbroker/qbroker/semaphore"
)

// deletedAt watches p and returns a channel that gets the time p was seen
// deleted.
func deletedAt(t *testing.T, conn *zk.Conn, p string) <-chan time.Time {
	t.Helper()
	ok, _, w, err := conn.ExistsW(p)
	if err != nil || !ok {
		t.Fatalf("watch %s: exists %v, %v", p, ok, err)
	}
	c := make(chan time.Time, 1)
	go func() {
		ev := <-w
		if ev.Type == zk.EventNodeDeleted {
			c <- time.Now()
		}
		close(c)
	}()
	return c
}

func markers(children []string) []string {
	var out []string
	for _, c := range children {
		if strings.HasPrefix(c, lockdelay.Prefix) {
			out = append(out, c)
		}
	}
	return out
}

func waitLost(t *testing.T, l *semaphore.Lease, what string) {
	t.Helper()
	select {
	case <-l.Lost():
	case <-time.After(time.Minute):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// The holder of the last permit, with a lock-delay, is cut from ZooKeeper
// past its session: its lease goes with the session, but its permit stays
// unavailable until the delay has passed since then (TryAcquire is
// refused meanwhile, and the waiting contender is not granted); the
// waiter then gets it, and no node is left once all are done. The
// contenders have no delay of their own: the lost lease's holds them off.
func TestDelayAfterSessionExpiry(t *testing.T) {
	const delay = 3 * time.Second
	root := zktest.Root(t) + "/sem"
	admin := zktest.Conn(t)
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	connH, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 2*time.Second)
	other := newSem(t, zktest.Conn(t), root, 2)
	h := newSem(t, connH, root, 2, semaphore.WithDelay(delay))
	b := newSem(t, zktest.Conn(t), root, 2)
	c := newSem(t, zktest.Conn(t), root, 2)
	ctx := testCtx(t, 2*time.Minute)
	lo, err := other.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	lh, err := h.Acquire(ctx, 1) // the last permit
	if err != nil {
		t.Fatal(err)
	}
	leasesDir := root + "/leases"
	if got := markers(children(t, admin, leasesDir)); !slices.Equal(got, []string{lockdelay.MarkerName(path.Base(lh.Key()))}) {
		t.Fatalf("markers while held: got %v, want the holder's", got)
	}
	gone := deletedAt(t, admin, lh.Key())
	bRes := async(ctx, b, 1)
	zktest.WaitFor(t, 30*time.Second, "b's waiter", func() bool { return waitersOf(t, admin, root) == 1 })

	proxy.Cut()
	var lostAt time.Time
	select {
	case lostAt = <-gone:
	case <-time.After(time.Minute):
		t.Fatal("the holder's lease outlived its session")
	}
	if l, err := c.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNoPermit) && time.Since(lostAt) < delay {
		t.Fatalf("TryAcquire during the delay: got (%v, %v), want ErrNoPermit", l, err)
	}
	lb := await(t, bRes, "b's grant after the delay")
	// b's clock starts when it notes the loss, after the watch that
	// timed lostAt fired: allow for that event's delivery.
	waited := time.Since(lostAt)
	if waited < delay-200*time.Millisecond {
		t.Fatalf("b was granted %v after the holder's lease went, want at least the delay %v", waited, delay)
	}
	t.Logf("b granted %v after the lost holder's lease went (delay %v)", waited.Round(time.Millisecond), delay)
	if lb.Token() <= lh.Token() {
		t.Fatalf("token %d after %d: want greater", lb.Token(), lh.Token())
	}
	if got := markers(children(t, admin, leasesDir)); len(got) != 0 {
		t.Fatalf("markers after the delay: %v, want none", got)
	}
	proxy.Restore()
	waitLost(t, lh, "the lost holder's Lost")
	if !errors.Is(lh.Err(), semaphore.ErrLost) {
		t.Fatalf("lost holder's Err: got %v, want ErrLost", lh.Err())
	}
	release(t, ctx, lb)
	release(t, ctx, lo)
	release(t, ctx, lh)
	for _, d := range []string{leasesDir, root + "/queue"} {
		if got := children(t, admin, d); len(got) != 0 {
			t.Fatalf("nodes left in %s: %v", d, got)
		}
	}
}

// Release and ReleaseKey free the permits of a lease with a delay at
// once: the waiter is granted without waiting (the delay is a minute,
// longer than await waits), and no marker is left.
func TestDelayReleaseFreesAtOnce(t *testing.T) {
	root := zktest.Root(t) + "/sem"
	admin := zktest.Conn(t)
	a := newSem(t, zktest.Conn(t), root, 1, semaphore.WithDelay(lockdelay.Max))
	b := newSem(t, zktest.Conn(t), root, 1, semaphore.WithDelay(lockdelay.Max))
	ctx := testCtx(t, 2*time.Minute)
	la, err := a.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	bRes := async(ctx, b, 1)
	zktest.WaitFor(t, 30*time.Second, "b's waiter", func() bool { return waitersOf(t, admin, root) == 1 })
	release(t, ctx, la)
	lb := await(t, bRes, "b's grant after Release")
	// Released by key, from another session.
	aRes := async(ctx, a, 1)
	zktest.WaitFor(t, 30*time.Second, "a's waiter", func() bool { return waitersOf(t, admin, root) == 1 })
	if err := semaphore.ReleaseKey(ctx, admin, lb.Key(), lb.Token()); err != nil {
		t.Fatal(err)
	}
	la = await(t, aRes, "a's grant after ReleaseKey")
	waitLost(t, lb, "b's Lost")
	release(t, ctx, la)
	l, err := b.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatalf("TryAcquire after Release: %v", err)
	}
	release(t, ctx, l)
	for _, d := range []string{root + "/leases", root + "/queue"} {
		if got := children(t, admin, d); len(got) != 0 {
			t.Fatalf("nodes left in %s: %v", d, got)
		}
	}
}

// New refuses a delay out of 0..lockdelay.Max.
func TestDelayInvalid(t *testing.T) {
	conn := zktest.Conn(t)
	root := zktest.Root(t) + "/sem"
	for _, d := range []time.Duration{-time.Second, lockdelay.Max + time.Millisecond} {
		if _, err := semaphore.New(conn, root, 1, semaphore.WithDelay(d)); !errors.Is(err, semaphore.ErrInvalid) {
			t.Errorf("delay %v: got %v, want ErrInvalid", d, err)
		}
	}
}
