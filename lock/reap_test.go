package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/lock"
)

func newReaper(t *testing.T, conn *zk.Conn, dir string) *lock.Reaper {
	t.Helper()
	r, err := lock.NewReaper(conn, dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A Reaper deletes a lock's node only once it stayed empty for a whole
// pass interval: a held lock and a lock used between two passes stay.
func TestReaperDeletesIdleLocksOnly(t *testing.T) {
	dir := zktest.Root(t) + "/locks"
	conn := zktest.Conn(t)
	ctx := testCtx(t, time.Minute)
	held := newMutex(t, conn, dir+"/held")
	used := newMutex(t, conn, dir+"/used")
	newMutex(t, conn, dir+"/idle")
	g, err := held.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := newReaper(t, conn, dir)
	if n, err := r.Reap(ctx); err != nil || n != 0 {
		t.Fatalf("first pass: got %d, %v; want 0 deleted (nothing was seen idle before)", n, err)
	}
	ug, err := used.Lock(ctx) // used between the passes
	if err != nil {
		t.Fatal(err)
	}
	if err := ug.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Reap(ctx); err != nil || n != 1 {
		t.Fatalf("second pass: got %d, %v; want 1 deleted (idle)", n, err)
	}
	if got := children(t, conn, dir); len(got) != 2 {
		t.Fatalf("after the second pass: %v, want held and used", got)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := r.Reap(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := children(t, conn, dir); len(got) != 0 {
		t.Fatalf("after two more passes: %v, want none", got)
	}
}

// A contender whose lock node is deleted between NewMutex and its create
// makes the node again and gets its lock.
func TestLockRecreatesReapedNode(t *testing.T) {
	p := zktest.Root(t) + "/locks/gone"
	conn := zktest.Conn(t)
	ctx := testCtx(t, time.Minute)
	m := newMutex(t, conn, p, lock.WithOwner("alice"))
	deleted := false
	reset := lock.SetCreateHook(func(c *zk.Conn, prefix string, data []byte) (string, error) {
		if !deleted {
			deleted = true
			if err := c.Delete(p, -1); err != nil {
				return "", err
			}
		}
		return c.Create(prefix, data, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	})
	defer reset()
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("Lock after the lock's node was deleted: %v", err)
	}
	h, err := lock.Current(ctx, conn, p)
	if err != nil || h.Key != g.Key() || h.Owner != "alice" {
		t.Fatalf("Current = %+v, %v; want the grant, owned by alice", h, err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Contenders racing a reaper that runs without pause always get their
// locks, round after round, on the same and on new names.
func TestLockRacesReaper(t *testing.T) {
	dir := zktest.Root(t) + "/locks"
	conn := zktest.Conn(t)
	ctx := testCtx(t, 2*time.Minute)
	r := newReaper(t, conn, dir)
	reapCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	reaped := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for reapCtx.Err() == nil {
			n, err := r.Reap(reapCtx)
			if err != nil && reapCtx.Err() == nil && !errors.Is(err, zk.ErrNoNode) {
				t.Errorf("Reap: %v", err)
				return
			}
			reaped += n
		}
	}()
	// Each Mutex makes its node once; the reaper deletes it while the
	// other names are used, so most Locks find it gone or racing.
	var ms []*lock.Mutex
	for i := range 7 {
		ms = append(ms, newMutex(t, conn, fmt.Sprintf("%s/n%d", dir, i)))
	}
	const rounds = 300
	for i := range rounds {
		g, err := ms[i%len(ms)].Lock(ctx)
		if err != nil {
			t.Fatalf("round %d: Lock raced with the reaper: %v", i, err)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	wg.Wait()
	if reaped == 0 {
		t.Fatalf("the reaper deleted nothing in %d rounds: no race was run", rounds)
	}
	t.Logf("%d rounds, %d lock nodes reaped meanwhile", rounds, reaped)
}

// With IfOwner, UnlockKey and Revoke act only on the owner's grants and
// change nothing otherwise.
func TestOwnerConditions(t *testing.T) {
	p := zktest.Root(t) + "/lock"
	conn := zktest.Conn(t)
	ctx := testCtx(t, time.Minute)
	g, err := newMutex(t, conn, p, lock.WithOwner("alice"), lock.WithValue([]byte("v"))).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Revoke(ctx, conn, p, lock.IfOwner("bob")); !errors.Is(err, lock.ErrNotOwner) {
		t.Fatalf("Revoke by bob: got %v, want ErrNotOwner", err)
	}
	if err := lock.UnlockKey(ctx, conn, g.Key(), g.Token(), lock.IfOwner("bob")); !errors.Is(err, lock.ErrNotOwner) {
		t.Fatalf("UnlockKey by bob: got %v, want ErrNotOwner", err)
	}
	h, err := lock.Current(ctx, conn, p)
	if err != nil || h.Revoked || h.Key != g.Key() || string(h.Value) != "v" || h.Owner != "alice" {
		t.Fatalf("after bob's tries: %+v, %v; want alice's grant, not revoked", h, err)
	}
	if h, err = lock.Revoke(ctx, conn, p, lock.IfOwner("alice")); err != nil || !h.Revoked {
		t.Fatalf("Revoke by alice: %+v, %v", h, err)
	}
	waitClosed(t, g.Revoked(), "Revoked")
	if h, err = lock.Current(ctx, conn, p); err != nil || string(h.Value) != "v" || h.Owner != "alice" {
		t.Fatalf("after the revocation: %+v, %v; want value and owner kept", h, err)
	}
	if err := lock.UnlockKey(ctx, conn, g.Key(), g.Token(), lock.IfOwner("alice")); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, g.Lost(), "Lost")
}
