package semaphore_test

import (
	"context"
	"errors"
	"path"
	"sync"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/lock"
	"github.com/qbroker/qbroker/semaphore"
)

// tracker counts, through the package's hooks, how often waiters started
// waiting for the leases (first in line) and woke from that wait.
type tracker struct {
	mu      sync.Mutex
	waiting int
	woken   int
}

func track(t *testing.T) *tracker {
	tr := &tracker{}
	t.Cleanup(semaphore.SetWaitingHook(func(_, pred string) {
		if pred == "" {
			tr.mu.Lock()
			tr.waiting++
			tr.mu.Unlock()
		}
	}))
	t.Cleanup(semaphore.SetWokenHook(func(_, pred string) {
		if pred == "" {
			tr.mu.Lock()
			tr.woken++
			tr.mu.Unlock()
		}
	}))
	return tr
}

func (tr *tracker) counts() (waiting, woken int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.waiting, tr.woken
}

// settled waits until the first waiter has looked at the leases after
// every change so far and waits again: it waited n times.
func (tr *tracker) settled(t *testing.T, n int) {
	t.Helper()
	zktest.WaitFor(t, 30*time.Second, "the first waiter waiting again", func() bool {
		w, _ := tr.counts()
		return w >= n
	})
}

// Three permits: three leases of one permit are granted at once, with
// distinct, growing tokens; TryAcquire then finds none; a waiter for two
// is not granted when one permit comes back, only when two have; bad
// counts are refused.
func TestPermits(t *testing.T) {
	tr := track(t)
	p := zktest.Root(t) + "/sem"
	conn := zktest.Conn(t)
	s := newSem(t, conn, p, 3)
	ctx := testCtx(t, time.Minute)

	var held []*semaphore.Lease
	for i := range 3 {
		l, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		if i > 0 && l.Token() <= held[i-1].Token() {
			t.Fatalf("token %d after %d, want growing", l.Token(), held[i-1].Token())
		}
		held = append(held, l)
	}
	if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNoPermit) {
		t.Fatalf("TryAcquire with every permit held: got %v, want ErrNoPermit", err)
	}
	if n := waitersOf(t, conn, p); n != 0 {
		t.Fatalf("TryAcquire left %d waiters", n)
	}
	for _, n := range []int{0, -1, semaphore.MaxLimit + 1} {
		if _, err := s.Acquire(ctx, n); !errors.Is(err, semaphore.ErrInvalid) {
			t.Errorf("Acquire(%d): got %v, want ErrInvalid", n, err)
		}
	}
	if _, err := s.Acquire(ctx, 4); !errors.Is(err, semaphore.ErrOverLimit) {
		t.Errorf("Acquire(4) of 3: got %v, want ErrOverLimit", err)
	}

	two := async(ctx, s, 2)
	tr.settled(t, 1)
	release(t, ctx, held[0])
	tr.settled(t, 2) // woke for the release, found one permit, waits again
	stillWaiting(t, two, "Acquire(2) with one permit free")
	release(t, ctx, held[1])
	l := await(t, two, "Acquire(2) with two permits free")
	if l.Permits() != 2 || l.Token() <= held[2].Token() {
		t.Fatalf("lease of %d permits, token %d; want 2, above %d", l.Permits(), l.Token(), held[2].Token())
	}
	hs, err := semaphore.Holders(ctx, conn, p)
	if err != nil || len(hs) != 2 || hs[0].Token != held[2].Token() || hs[1].Permits != 2 {
		t.Fatalf("Holders: %+v, %v; want the last single lease, then the lease of 2", hs, err)
	}
	release(t, ctx, l)
	release(t, ctx, held[2])
	if got := children(t, conn, p+"/leases"); len(got) != 0 {
		t.Fatalf("leases left: %v", got)
	}
}

// The limit lives in the semaphore's node: raising it grants the waiter
// at once; lowering it takes no lease back, and new grants wait until
// the permits in use are under the new limit; a waiter for more than the
// new limit fails when the limit drops under its count. Another Semaphore on the path with another limit
// uses the stored one.
func TestChangeLimit(t *testing.T) {
	tr := track(t)
	p := zktest.Root(t) + "/sem"
	conn := zktest.Conn(t)
	s := newSem(t, conn, p, 2)
	ctx := testCtx(t, time.Minute)
	a, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	c := async(ctx, s, 1)
	tr.settled(t, 1)
	if err := semaphore.SetLimit(ctx, conn, p, 3); err != nil {
		t.Fatal(err)
	}
	cl := await(t, c, "a waiter after the limit was raised to 3")

	other := newSem(t, zktest.Conn(t), p, 10)
	if n, err := other.Limit(ctx); err != nil || n != 3 {
		t.Fatalf("Limit through another Semaphore: got %d, %v; want the stored 3", n, err)
	}
	if err := semaphore.SetLimit(ctx, conn, p, 1); err != nil {
		t.Fatal(err)
	}
	d := async(ctx, other, 1)
	tr.settled(t, 2)
	release(t, ctx, a)
	tr.settled(t, 3)
	release(t, ctx, b)
	tr.settled(t, 4)
	stillWaiting(t, d, "a waiter while 1 permit is in use under a limit of 1")
	select {
	case <-cl.Lost():
		t.Fatal("a holder above the lowered limit lost its lease")
	default:
	}
	release(t, ctx, cl)
	dl := await(t, d, "a waiter once the permits in use are under the new limit")

	if err := semaphore.SetLimit(ctx, conn, p, 2); err != nil {
		t.Fatal(err)
	}
	big := async(ctx, s, 2)
	tr.settled(t, 5)
	if err := semaphore.SetLimit(ctx, conn, p, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-big:
		if !errors.Is(r.err, semaphore.ErrOverLimit) {
			t.Fatalf("a waiter for 2 under a limit of 1: got %v, want ErrOverLimit", r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a waiter for more than the limit still waits")
	}
	release(t, ctx, dl)
	if got := children(t, conn, p+"/queue"); len(got) != 0 {
		t.Fatalf("waiters left: %v", got)
	}
	if err := semaphore.SetLimit(ctx, conn, p, 0); !errors.Is(err, semaphore.ErrInvalid) {
		t.Fatalf("SetLimit(0): got %v, want ErrInvalid", err)
	}
}

// Revoke asks every holder, RevokeKey one; the holders see Revoked and
// keep their leases. ReleaseKey with another token or owner is refused;
// with the right one it ends the lease (Lost, ErrLost) and frees the
// permit for a waiter.
func TestRevokeAndReleaseKey(t *testing.T) {
	p := zktest.Root(t) + "/sem"
	conn := zktest.Conn(t)
	s := newSem(t, zktest.Conn(t), p, 2, semaphore.WithOwner("alice"), semaphore.WithValue([]byte("job-1")))
	ctx := testCtx(t, time.Minute)
	if _, err := semaphore.Revoke(ctx, conn, p); !errors.Is(err, semaphore.ErrNotHeld) {
		t.Fatalf("Revoke with no holder: got %v, want ErrNotHeld", err)
	}
	a, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	h, err := semaphore.RevokeKey(ctx, conn, b.Key())
	if err != nil || h.Token != b.Token() || string(h.Value) != "job-1" || h.Owner != "alice" {
		t.Fatalf("RevokeKey: %+v, %v", h, err)
	}
	<-b.Revoked()
	select {
	case <-a.Revoked():
		t.Fatal("RevokeKey reached another lease")
	default:
	}
	if _, err := semaphore.Revoke(ctx, conn, p, semaphore.IfOwner("bob")); !errors.Is(err, semaphore.ErrNotOwner) {
		t.Fatalf("Revoke by bob: got %v, want ErrNotOwner", err)
	}
	asked, err := semaphore.Revoke(ctx, conn, p)
	if err != nil || len(asked) != 2 {
		t.Fatalf("Revoke: %v, %v; want both holders", asked, err)
	}
	<-a.Revoked()

	waiter := async(ctx, s, 1)
	zktest.WaitFor(t, 30*time.Second, "the waiter", func() bool { return waitersOf(t, conn, p) == 1 })
	if err := semaphore.ReleaseKey(ctx, conn, a.Key(), a.Token()+1); !errors.Is(err, semaphore.ErrNotHeld) {
		t.Fatalf("ReleaseKey with another token: got %v, want ErrNotHeld", err)
	}
	if err := semaphore.ReleaseKey(ctx, conn, a.Key(), a.Token(), semaphore.IfOwner("bob")); !errors.Is(err, semaphore.ErrNotOwner) {
		t.Fatalf("ReleaseKey by bob: got %v, want ErrNotOwner", err)
	}
	if err := semaphore.ReleaseKey(ctx, conn, path.Dir(a.Key()), 1); !errors.Is(err, semaphore.ErrInvalid) {
		t.Fatalf("ReleaseKey of a non-lease: got %v, want ErrInvalid", err)
	}
	if err := semaphore.ReleaseKey(ctx, conn, a.Key(), a.Token()); err != nil {
		t.Fatal(err)
	}
	<-a.Lost()
	if !errors.Is(a.Err(), semaphore.ErrLost) {
		t.Fatalf("Err after ReleaseKey: got %v, want ErrLost", a.Err())
	}
	w := await(t, waiter, "the waiter after ReleaseKey")
	release(t, ctx, w)
	release(t, ctx, b)
	release(t, ctx, a) // ended already: nil
}

// Waiters that give up (their context ends, their Semaphore closes)
// leave no node; the waiter behind them gets the permit.
func TestWaiterGivesUp(t *testing.T) {
	p := zktest.Root(t) + "/sem"
	conn := zktest.Conn(t)
	s := newSem(t, conn, p, 1)
	ctx := testCtx(t, time.Minute)
	h, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	first := async(cctx, s, 1)
	closing := newSem(t, zktest.Conn(t), p, 1)
	second := async(ctx, closing, 1)
	third := async(ctx, s, 1)
	zktest.WaitFor(t, 30*time.Second, "three waiters", func() bool { return waitersOf(t, conn, p) == 3 })
	cancel()
	if r := <-first; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiter: got %v, want context.Canceled", r.err)
	}
	_ = closing.Close()
	if r := <-second; !errors.Is(r.err, semaphore.ErrClosed) {
		t.Fatalf("waiter of a closed Semaphore: got %v, want ErrClosed", r.err)
	}
	if n := waitersOf(t, conn, p); n != 1 {
		t.Fatalf("%d waiters left, want only the third", n)
	}
	release(t, ctx, h)
	l := await(t, third, "the waiter behind those that left")
	release(t, ctx, l)
	for _, d := range []string{"queue", "leases"} {
		if got := children(t, conn, p+"/"+d); len(got) != 0 {
			t.Fatalf("%s left: %v", d, got)
		}
	}
}

// A Reaper deletes a semaphore idle for a whole pass, not a busy one;
// the next Acquire makes it again with its Semaphore's limit.
func TestReaper(t *testing.T) {
	dir := zktest.Root(t)
	conn := zktest.Conn(t)
	ctx := testCtx(t, time.Minute)
	idle := newSem(t, conn, dir+"/idle", 2)
	busy := newSem(t, conn, dir+"/busy", 1)
	l, err := busy.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := semaphore.NewReaper(conn, dir)
	if err != nil {
		t.Fatal(err)
	}
	for pass, want := range []int{0, 1, 0} {
		if n, err := r.Reap(ctx); err != nil || n != want {
			t.Fatalf("pass %d: reaped %d, %v; want %d", pass, n, err, want)
		}
	}
	if got := children(t, conn, dir); len(got) != 1 || got[0] != "busy" {
		t.Fatalf("left %v, want busy", got)
	}
	l2, err := idle.Acquire(ctx, 2)
	if err != nil {
		t.Fatalf("Acquire of a reaped semaphore: %v", err)
	}
	if n, err := idle.Limit(ctx); err != nil || n != 2 {
		t.Fatalf("limit after recreation: %d, %v", n, err)
	}
	release(t, ctx, l2)
	release(t, ctx, l)
}

// A lease whose node is deleted, or whose session expires, ends: Lost
// closes and Err wraps ErrLost.
func TestLeaseLostWithSession(t *testing.T) {
	p := zktest.Root(t) + "/sem"
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	conn := zktest.ConnTo(t, []string{proxy.Addr()})
	s := newSem(t, conn, p, 1)
	ctx := testCtx(t, time.Minute)
	l, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	other := newSem(t, zktest.Conn(t), p, 1)
	next := async(ctx, other, 1)
	proxy.Cut()
	// The server expires the session; its lease goes and the waiter of
	// another session gets the permit.
	nl := await(t, next, "a waiter after the holder's session expired")
	proxy.Restore()
	select {
	case <-l.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("the lease of an expired session did not end")
	}
	if !errors.Is(l.Err(), semaphore.ErrLost) {
		t.Fatalf("Err: got %v, want ErrLost", l.Err())
	}
	release(t, ctx, nl)
}

// Lease tokens and lock tokens are zxids of one ensemble, so they compare
// across kinds: a lock granted after a lease has a greater token, and a
// lease granted after that lock a greater one still.
func TestTokensCompareWithLocks(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	ctx := testCtx(t, time.Minute)
	s := newSem(t, conn, root+"/sem", 1)
	m, err := lock.NewMutex(conn, root+"/lock")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	l1, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release(t, ctx, l1)
	l2, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !(l1.Token() < g.Token() && g.Token() < l2.Token()) {
		t.Fatalf("tokens: lease %d, lock %d, lease %d; want increasing in grant order", l1.Token(), g.Token(), l2.Token())
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	release(t, ctx, l2)
}
