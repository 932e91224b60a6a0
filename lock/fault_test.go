package lock_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lock"
)

// A revocation request reaches the holder (Revoked closes) and the
// holder's value survives it; the holder decides to Unlock. With readers
// holding an RWMutex, every reader is asked.
func TestRevoke(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	conn := zktest.Conn(t)
	m := newMutex(t, zktest.Conn(t), root, lock.WithValue([]byte("holder-1")))
	ctx := testCtx(t, time.Minute)
	if _, err := lock.Revoke(ctx, conn, root); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Revoke of a free lock: got %v, want ErrNotHeld", err)
	}
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, err := lock.Revoke(ctx, conn, root)
	if err != nil {
		t.Fatal(err)
	}
	if h.Key != g.Key() || h.Token != g.Token() || string(h.Value) != "holder-1" || !h.Revoked {
		t.Fatalf("Revoke = %+v, want the holder %s", h, g.Key())
	}
	waitClosed(t, g.Revoked(), "the holder's Revoked")
	if isClosed(g.Lost()) {
		t.Fatal("a revocation ended the grant")
	}
	cur, err := lock.Current(ctx, conn, root)
	if err != nil {
		t.Fatal(err)
	}
	if !cur.Revoked || string(cur.Value) != "holder-1" {
		t.Fatalf("Current after Revoke = %+v, want revoked, value kept", cur)
	}
	// A second request is no error; the grant still holds until Unlock.
	if _, err := lock.Revoke(ctx, conn, root); err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if g.Err() != nil {
		t.Fatalf("Err after Unlock: %v", g.Err())
	}

	rwPath := zktest.Root(t) + "/rw"
	var readers []*lock.Grant
	for range 2 {
		rw := newRWMutex(t, zktest.Conn(t), rwPath)
		r, err := rw.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	if _, err := lock.Revoke(ctx, conn, rwPath); err != nil {
		t.Fatal(err)
	}
	for i, r := range readers {
		waitClosed(t, r.Revoked(), fmt.Sprint("reader ", i, "'s Revoked"))
		if err := r.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A resource guarded by fencing tokens, written as a user would: the node
// records the highest token it accepted beside the payload, and a write
// with a lower token is refused. The versioned setData makes the check and
// the write one step.
func fencedWrite(conn *zk.Conn, resource string, token int64, payload string) error {
	for {
		data, st, err := conn.Get(resource)
		if err != nil {
			return err
		}
		var highest int64
		if len(data) >= 8 {
			highest = int64(binary.BigEndian.Uint64(data))
		}
		if token < highest {
			return fmt.Errorf("token %d refused: %d seen: %w", token, highest, errStaleToken)
		}
		buf := binary.BigEndian.AppendUint64(nil, uint64(token))
		_, err = conn.Set(resource, append(buf, payload...), st.Version)
		if errors.Is(err, zk.ErrBadVersion) {
			continue // another writer came between: check again
		}
		return err
	}
}

var errStaleToken = errors.New("stale fencing token")

// The holder's session expires (its network cut for longer than the
// session timeout): the next contender holds with a greater token, the
// old holder's Lost closes once its client learns of the expiry, and the
// resource refuses the old holder's stale token.
func TestSessionExpiryFencing(t *testing.T) {
	root := zktest.Root(t)
	resource := root + "-resource"
	admin := zktest.Conn(t)
	if err := zkutil.EnsurePath(admin, resource, nil); err != nil {
		t.Fatal(err)
	}
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	connA, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 2*time.Second)
	a := newMutex(t, connA, root+"/lock")
	b := newMutex(t, zktest.Conn(t), root+"/lock")
	ctx := testCtx(t, 3*time.Minute)
	ga, err := a.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := fencedWrite(admin, resource, ga.Token(), "a"); err != nil {
		t.Fatal(err)
	}
	bRes := async(ctx, b.Lock)
	zktest.WaitFor(t, 30*time.Second, "b's node", func() bool { return len(children(t, admin, root+"/lock")) == 2 })

	proxy.Cut()
	rb := await(t, bRes, "b's grant after a's session expired")
	if rb.err != nil {
		t.Fatal(rb.err)
	}
	if rb.g.Token() <= ga.Token() {
		t.Fatalf("token %d after %d: want greater", rb.g.Token(), ga.Token())
	}
	if err := fencedWrite(admin, resource, rb.g.Token(), "b"); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	waitClosed(t, ga.Lost(), "the expired holder's Lost")
	if !errors.Is(ga.Err(), lock.ErrLost) {
		t.Fatalf("Err: got %v, want ErrLost", ga.Err())
	}
	// The old holder, late, tries to write as holder: refused.
	if err := zkutil.WaitConnected(connA, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := fencedWrite(connA, resource, ga.Token(), "a, late"); !errors.Is(err, errStaleToken) {
		t.Fatalf("write with the stale token: got %v, want it refused", err)
	}
	if data, _, _ := admin.Get(resource); !strings.HasSuffix(string(data), "b") {
		t.Fatalf("resource holds %q, want b's write", data[8:])
	}
	if err := ga.Unlock(ctx); err != nil {
		t.Fatalf("Unlock of the lost grant: %v", err)
	}
	if err := rb.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// An Unlock whose delete fails with the connection returns the error, and
// the grant's watcher deletes the node once the connection is back (the
// same session: nothing else would ever delete it), so the next contender
// gets the lock; Lost then closes and Unlock returns nil.
func TestUnlockDuringConnectionLoss(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	connA, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 20*time.Second)
	a := newMutex(t, connA, root)
	b := newMutex(t, zktest.Conn(t), root)
	ctx := testCtx(t, 2*time.Minute)
	g, err := a.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sid := connA.SessionID()
	bRes := async(ctx, b.Lock)
	proxy.Cut()
	zktest.WaitFor(t, 30*time.Second, "the connection to drop", func() bool { return connA.State() != zk.StateHasSession })
	if err := g.Unlock(ctx); err == nil || !zkutil.IsUnavailable(err) {
		t.Fatalf("Unlock without a connection: got %v, want an unavailable error", err)
	}
	if isClosed(g.Lost()) {
		t.Fatal("Lost closed while the node may still be there")
	}
	proxy.Restore()
	r := await(t, bRes, "b's grant once a's node is deleted in the background")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if connA.SessionID() != sid {
		t.Fatal("a's session changed: its expiry, not the retried Unlock, freed the lock")
	}
	waitClosed(t, g.Lost(), "Lost after the background unlock")
	if g.Err() != nil {
		t.Fatalf("Err after the background unlock: %v, want nil", g.Err())
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A create whose answer is lost with the connection may have made a node
// of our live session. When the connection is back at once, Lock adopts
// it; when it is not, Lock fails and the node is removed in the
// background once it is. Either way nobody waits behind an orphan. The
// hook stands in for the lost answer: it creates the node, then reports
// the connection lost (cutting it too, the second time).
func TestLostCreateAnswer(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	conn, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 20*time.Second)
	admin := zktest.Conn(t)
	m := newMutex(t, conn, root)
	ctx := testCtx(t, 2*time.Minute)
	cut := false
	var made string
	reset := lock.SetCreateHook(func(c *zk.Conn, prefix string, data []byte) (string, error) {
		key, err := c.Create(prefix, data, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
		if err != nil {
			return "", err
		}
		made = key
		if cut {
			proxy.Cut()
		}
		return "", zk.ErrConnectionClosed
	})
	defer reset()

	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("Lock after a lost create answer: %v", err)
	}
	if g.Key() != made {
		t.Fatalf("grant of %s, want the node the lost create made, %s", g.Key(), made)
	}
	if got := children(t, admin, root); len(got) != 1 {
		t.Fatalf("nodes: %v, want just the adopted one", got)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	cut = true
	sid := conn.SessionID()
	if _, err := m.Lock(ctx); err == nil || !zkutil.IsUnavailable(err) {
		t.Fatalf("Lock with the connection lost after the create: got %v, want an unavailable error", err)
	}
	reset()
	other := newMutex(t, admin, root)
	oRes := async(ctx, other.Lock)
	proxy.Restore()
	r := await(t, oRes, "another contender's grant behind the orphan")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if conn.SessionID() != sid {
		t.Fatal("the session changed: its expiry, not the cleanup, removed the orphan")
	}
	if ok, _, _ := admin.Exists(made); ok {
		t.Fatalf("orphan %s still there", made)
	}
	if err := r.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter whose session expires queues again with its new session and
// gets the lock: it never holds on the strength of its old node.
func TestWaiterSessionExpiry(t *testing.T) {
	root := zktest.Root(t) + "/lock"
	holder := newMutex(t, zktest.Conn(t), root)
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	connW, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 2*time.Second)
	w := newMutex(t, connW, root)
	admin := zktest.Conn(t)
	ctx := testCtx(t, 3*time.Minute)
	g, err := holder.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res := async(ctx, w.Lock)
	zktest.WaitFor(t, 30*time.Second, "the waiter's node", func() bool { return len(children(t, admin, root)) == 2 })
	old := children(t, admin, root)
	sid := connW.SessionID()
	proxy.Cut()
	zktest.WaitFor(t, 60*time.Second, "the waiter's node to go with its session", func() bool { return len(children(t, admin, root)) == 1 })
	proxy.Restore()
	zktest.WaitFor(t, 60*time.Second, "the waiter's new node", func() bool {
		if !pending(res) {
			r := <-res
			t.Fatalf("Lock returned %v, %v while the holder holds", r.g, r.err)
		}
		return len(children(t, admin, root)) == 2 && connW.SessionID() != sid
	})
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := await(t, res, "the waiter's grant")
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, n := range old {
		if root+"/"+n == r.g.Key() {
			t.Fatalf("granted on the old session's node %s", n)
		}
	}
	if err := r.g.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}
