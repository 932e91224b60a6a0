package lock_test

import (
	"errors"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/lock"
	"github.com/qbroker/qbroker/lockdelay"
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

// A holder with a lock-delay is cut from ZooKeeper past its session: its
// node goes with the session, but no contender holds until the delay has
// passed since then (TryLock is refused meanwhile); the next in line then
// holds, and no node is left once all are done. The waiting contender
// has no delay of its own: the earlier holder's delay holds it off.
func TestDelayAfterSessionExpiry(t *testing.T) {
	const delay = 3 * time.Second
	root := zktest.Root(t) + "/lock"
	admin := zktest.Conn(t)
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	connA, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 2*time.Second)
	a := newMutex(t, connA, root, lock.WithDelay(delay))
	b := newMutex(t, zktest.Conn(t), root)
	c := newMutex(t, zktest.Conn(t), root)
	ctx := testCtx(t, 2*time.Minute)
	ga, err := a.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := markers(children(t, admin, root)); !slices.Equal(got, []string{lockdelay.MarkerName(path.Base(ga.Key()))}) {
		t.Fatalf("markers while held: got %v, want the holder's", got)
	}
	gone := deletedAt(t, admin, ga.Key())
	bRes := async(ctx, b.Lock)
	zktest.WaitFor(t, 30*time.Second, "b's node", func() bool { return len(children(t, admin, root)) == 3 })

	proxy.Cut()
	var lostAt time.Time
	select {
	case lostAt = <-gone:
	case <-time.After(time.Minute):
		t.Fatal("the holder's node outlived its session")
	}
	if _, err := c.TryLock(ctx); !errors.Is(err, lock.ErrLocked) && time.Since(lostAt) < delay {
		t.Fatalf("TryLock during the delay: got %v, want ErrLocked", err)
	}
	rb := await(t, bRes, "b's grant after the delay")
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	// b's clock starts when it notes the loss, after the watch that
	// timed lostAt fired: allow for that event's delivery.
	waited := time.Since(lostAt)
	if waited < delay-200*time.Millisecond {
		t.Fatalf("b held %v after the holder's node went, want at least the delay %v", waited, delay)
	}
	t.Logf("b held %v after the lost holder's node went (delay %v)", waited.Round(time.Millisecond), delay)
	if rb.g.Token() <= ga.Token() {
		t.Fatalf("token %d after %d: want greater", rb.g.Token(), ga.Token())
	}
	if got := markers(children(t, admin, root)); len(got) != 0 {
		t.Fatalf("markers after the delay: %v, want none", got)
	}
	proxy.Restore()
	waitClosed(t, ga.Lost(), "the lost holder's Lost")
	if err := rb.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ga.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := children(t, admin, root); len(got) != 0 {
		t.Fatalf("nodes left: %v", got)
	}
}

// Unlock and UnlockKey free a lock with a delay at once: the next in line
// holds without waiting (the delay is a minute, longer than await waits).
func TestDelayUnlockFreesAtOnce(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	admin := zktest.Conn(t)
	a := newMutex(t, zktest.Conn(t), root, lock.WithDelay(lockdelay.Max))
	b := newMutex(t, zktest.Conn(t), root, lock.WithDelay(lockdelay.Max))
	ctx := testCtx(t, 2*time.Minute)
	ga, err := a.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bRes := async(ctx, b.Lock)
	zktest.WaitFor(t, 30*time.Second, "b's node", func() bool { return len(children(t, admin, root)) == 3 })
	if err := ga.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	rb := await(t, bRes, "b's grant after Unlock")
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	// Released by key, from another session.
	aRes := async(ctx, a.Lock)
	zktest.WaitFor(t, 30*time.Second, "a's node", func() bool { return len(children(t, admin, root)) == 3 })
	if err := lock.UnlockKey(ctx, admin, rb.g.Key(), rb.g.Token()); err != nil {
		t.Fatal(err)
	}
	ra := await(t, aRes, "a's grant after UnlockKey")
	if ra.err != nil {
		t.Fatal(ra.err)
	}
	waitClosed(t, rb.g.Lost(), "b's Lost")
	if err := ra.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := b.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := children(t, admin, root); len(got) != 0 {
		t.Fatalf("nodes left: %v", got)
	}
}

// A lost reader's delay holds off writers, not readers, who would have
// shared the lock with it.
func TestDelayLostReader(t *testing.T) {
	root := zktest.Root(t) + "/rw"
	admin := zktest.Conn(t)
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	connA, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 2*time.Second)
	r1 := newRWMutex(t, connA, root, lock.WithDelay(lockdelay.Max))
	other := newRWMutex(t, zktest.Conn(t), root)
	ctx := testCtx(t, 2*time.Minute)
	g1, err := r1.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gone := deletedAt(t, admin, g1.Key())
	proxy.Cut()
	select {
	case <-gone:
	case <-time.After(time.Minute):
		t.Fatal("the reader's node outlived its session")
	}
	if got := markers(children(t, admin, root)); len(got) != 1 {
		t.Fatalf("markers after the reader's loss: %v, want its marker", got)
	}
	g2, err := other.TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock during a reader's delay: %v", err)
	}
	if err := g2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryLock(ctx); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("writer's TryLock during a reader's delay: got %v, want ErrLocked", err)
	}
	// A writer that waits is woken when the marker goes (here removed
	// as a Sweeper would after the delay, as a release by key does).
	wRes := async(ctx, other.Lock)
	zktest.WaitFor(t, 30*time.Second, "the writer waiting", func() bool { return len(children(t, admin, root)) == 2 })
	if err := lockdelay.Clear(admin, root, path.Base(g1.Key())); err != nil {
		t.Fatal(err)
	}
	rw := await(t, wRes, "the writer's grant once the marker went")
	if rw.err != nil {
		t.Fatal(rw.err)
	}
	if err := rw.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := children(t, admin, root); len(got) != 0 {
		t.Fatalf("nodes left: %v", got)
	}
}

// A delay below 0 or above lockdelay.Max is refused.
func TestDelayInvalid(t *testing.T) {
	conn := zktest.Conn(t)
	for _, d := range []time.Duration{-time.Second, lockdelay.Max + time.Millisecond} {
		if _, err := lock.NewMutex(conn, zktest.Root(t), lock.WithDelay(d)); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("WithDelay(%v): got %v, want ErrInvalid", d, err)
		}
	}
}

// Abandon releases as a loss would: the next in line holds only once the
// delay has passed, and no node is left.
func TestDelayAbandon(t *testing.T) {
	const delay = 1500 * time.Millisecond
	root := zktest.Root(t) + "/lock"
	admin := zktest.Conn(t)
	a := newMutex(t, zktest.Conn(t), root, lock.WithDelay(delay))
	b := newMutex(t, zktest.Conn(t), root)
	ctx := testCtx(t, time.Minute)
	ga, err := a.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bRes := async(ctx, b.Lock)
	zktest.WaitFor(t, 30*time.Second, "b's node", func() bool { return len(children(t, admin, root)) == 3 })
	abandoned := time.Now()
	if err := ga.Abandon(ctx); err != nil {
		t.Fatal(err)
	}
	if ga.Err() != nil {
		t.Fatalf("Err after Abandon: %v", ga.Err())
	}
	rb := await(t, bRes, "b's grant after the delay")
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	if waited := time.Since(abandoned); waited < delay {
		t.Fatalf("b held %v after Abandon, want at least the delay %v", waited, delay)
	}
	if err := rb.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := children(t, admin, root); len(got) != 0 {
		t.Fatalf("nodes left: %v", got)
	}
}

// A contender that arrives after the holder was lost is held off too.
func TestDelayContenderAfterLoss(t *testing.T) {
	const delay = 1500 * time.Millisecond
	root := zktest.Root(t) + "/lock"
	a := newMutex(t, zktest.Conn(t), root, lock.WithDelay(delay))
	b := newMutex(t, zktest.Conn(t), root)
	ctx := testCtx(t, time.Minute)
	ga, err := a.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	abandoned := time.Now()
	if err := ga.Abandon(ctx); err != nil {
		t.Fatal(err)
	}
	gb, err := b.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(abandoned); waited < delay {
		t.Fatalf("b held %v after a's loss, want at least the delay %v", waited, delay)
	}
	if err := gb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
