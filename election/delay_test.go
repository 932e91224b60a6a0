package election_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/lock"
	"github.com/qbroker/qbroker/lockdelay"
)

func markerCount(t *testing.T, conn *zk.Conn, p string) int {
	t.Helper()
	n := 0
	for _, c := range children(t, conn, p) {
		if strings.HasPrefix(c, lockdelay.Prefix) {
			n++
		}
	}
	return n
}

// A leader with a lock-delay is cut from ZooKeeper past its session: the
// next candidate (without a delay of its own) does not lead until the
// delay has passed since the leader's node went, then leads; no node is
// left once all are done.
func TestDelayAfterLeaderSessionExpiry(t *testing.T) {
	const delay = 3 * time.Second
	root := zktest.Root(t) + "/election"
	admin := zktest.Conn(t)
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	connA, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 2*time.Second)
	a := newElection(t, connA, root, election.WithDelay(delay))
	b := newElection(t, zktest.Conn(t), root)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := a.Campaign(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if n := markerCount(t, admin, root); n != 1 {
		t.Fatalf("markers while leading: %d, want 1", n)
	}
	aToken := a.Token()
	ok, _, w, err := admin.ExistsW(a.Key())
	if err != nil || !ok {
		t.Fatalf("watch the leader's node: %v %v", ok, err)
	}
	bRes := campaign(ctx, b, "b")
	zktest.WaitFor(t, 20*time.Second, "b's node", func() bool { return b.Key() != "" })

	proxy.Cut()
	select {
	case ev := <-w:
		if ev.Type != zk.EventNodeDeleted {
			t.Fatalf("leader's node: got %v, want deleted", ev)
		}
	case <-time.After(time.Minute):
		t.Fatal("the leader's node outlived its session")
	}
	lostAt := time.Now()
	if err := waitErr(t, bRes, 60*time.Second, "b to lead after the delay"); err != nil {
		t.Fatal(err)
	}
	// b's clock starts when it notes the loss, after the watch that
	// timed lostAt fired: allow for that event's delivery.
	waited := time.Since(lostAt)
	if waited < delay-200*time.Millisecond {
		t.Fatalf("b led %v after the leader's node went, want at least the delay %v", waited, delay)
	}
	t.Logf("b led %v after the lost leader's node went (delay %v)", waited.Round(time.Millisecond), delay)
	if b.Token() <= aToken {
		t.Fatalf("token %d after %d: want greater", b.Token(), aToken)
	}
	proxy.Restore()
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	if got := children(t, admin, root); len(got) != 0 {
		t.Fatalf("nodes left: %v", got)
	}
}

// Resign and ResignKey free an election with a delay at once: the next
// candidate leads without waiting (the delay is a minute, longer than the
// test waits).
func TestDelayResignFreesAtOnce(t *testing.T) {
	root := zktest.Root(t) + "/election"
	admin := zktest.Conn(t)
	a := newElection(t, zktest.Conn(t), root, election.WithDelay(lockdelay.Max))
	b := newElection(t, zktest.Conn(t), root, election.WithDelay(lockdelay.Max))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := a.Campaign(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	bRes := campaign(ctx, b, "b")
	zktest.WaitFor(t, 20*time.Second, "b's node", func() bool { return b.Key() != "" })
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, bRes, 20*time.Second, "b to lead after Resign"); err != nil {
		t.Fatal(err)
	}
	aRes := campaign(ctx, a, "a")
	zktest.WaitFor(t, 20*time.Second, "a's node", func() bool { return a.Key() != "" })
	if err := election.ResignKey(ctx, admin, b.Key()); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, aRes, 20*time.Second, "a to lead after ResignKey"); err != nil {
		t.Fatal(err)
	}
	if err := a.Resign(ctx); err != nil {
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
		if _, err := election.New(conn, zktest.Root(t), election.WithDelay(d)); !errors.Is(err, election.ErrInvalid) {
			t.Errorf("WithDelay(%v): got %v, want ErrInvalid", d, err)
		}
	}
}

// Fencing tokens of locks and leaderships are one space: each is the
// zxid that created the grant's or the candidate's node, and ZooKeeper
// orders every write of the ensemble, whatever the session, path or
// kind. So a lock granted after a leadership has a greater token, and a
// leadership won after that lock a greater one still: a resource can
// fence locks and leaderships with one "highest token seen".
func TestTokensOneSpaceAcrossKinds(t *testing.T) {
	root := zktest.Root(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := zktest.Conn(t)
	e := newElection(t, zktest.Conn(t), root+"/election")
	m, err := lock.NewMutex(zktest.Conn(t), root+"/lock")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rw, err := lock.NewRWMutex(zktest.Conn(t), root+"/other/rw")
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	var last int64
	var lastWhat string
	after := func(what string, token int64) {
		t.Helper()
		if token <= last {
			t.Fatalf("%s's token %d after %s's %d: want greater", what, token, lastWhat, last)
		}
		last, lastWhat = token, what
	}
	for round := range 3 {
		if err := e.Campaign(ctx, []byte("leader")); err != nil {
			t.Fatal(err)
		}
		after("leadership", e.Token())
		g, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		after("lock", g.Token())
		r, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		after("read lock", r.Token())
		// Held together, released in another order each round: the
		// order of grants alone sets the order of tokens.
		if round%2 == 0 {
			_ = e.Resign(ctx)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		_ = e.Resign(ctx)
		if h, err := lock.Current(ctx, admin, root+"/lock"); !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("Current after Unlock: %+v %v", h, err)
		}
	}
}

// Abandon ends the leadership as a loss would: the next candidate leads
// only once the delay has passed, and no node is left.
func TestDelayAbandon(t *testing.T) {
	const delay = 1500 * time.Millisecond
	root := zktest.Root(t) + "/election"
	admin := zktest.Conn(t)
	a := newElection(t, zktest.Conn(t), root, election.WithDelay(delay))
	b := newElection(t, zktest.Conn(t), root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Campaign(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	done := a.Done()
	bRes := campaign(ctx, b, "b")
	zktest.WaitFor(t, 20*time.Second, "b's node", func() bool { return b.Key() != "" })
	abandoned := time.Now()
	if err := a.Abandon(ctx); err != nil {
		t.Fatal(err)
	}
	if !isClosed(done) {
		t.Fatal("Done open after Abandon")
	}
	if err := waitErr(t, bRes, 30*time.Second, "b to lead after the delay"); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(abandoned); waited < delay {
		t.Fatalf("b led %v after Abandon, want at least the delay %v", waited, delay)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if got := children(t, admin, root); len(got) != 0 {
		t.Fatalf("nodes left: %v", got)
	}
}

// A candidate that arrives after the leader was lost is held off too:
// the marker is among the names it finds at its first look.
func TestDelayCandidateAfterLoss(t *testing.T) {
	const delay = 1500 * time.Millisecond
	root := zktest.Root(t) + "/election"
	a := newElection(t, zktest.Conn(t), root, election.WithDelay(delay))
	b := newElection(t, zktest.Conn(t), root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Campaign(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	abandoned := time.Now()
	if err := a.Abandon(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Campaign(ctx, []byte("b")); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(abandoned); waited < delay {
		t.Fatalf("b led %v after a's loss, want at least the delay %v", waited, delay)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
