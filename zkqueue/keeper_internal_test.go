package zkqueue

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// keeperOn returns a keeper on a new session to servers, woken by the
// session's events and run until the test ends.
func keeperOn(t *testing.T, servers []string, timeout time.Duration) (*keeper, *zk.Conn) {
	t.Helper()
	k := newKeeper(nil)
	conn, err := zkutil.Connect(servers, timeout, nil, func(ev zk.Event) {
		if ev.Type == zk.EventSession && ev.State == zk.StateHasSession {
			k.Wake()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	k.Bind(conn, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); k.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait(); conn.Close() })
	if err := zkutil.WaitConnected(conn, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return k, conn
}

// A create whose answer was lost (the node exists, made by this very
// session) is recognized as ours, and dropping it deletes it.
func TestKeepAdoptsItsOwnNode(t *testing.T) {
	k, conn := keeperOn(t, []string{zktest.Addr(t)}, 4*time.Second)
	root := zktest.Root(t)
	ensurePath(t, conn, root)
	p := root + "/lost-answer"
	if _, err := conn.Create(p, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	e := k.Keep(p, nil)
	own, unknown := e.State()
	if own != conn.SessionID() || unknown {
		t.Fatalf("owner 0x%x unknown %v, want the session 0x%x", own, unknown, conn.SessionID())
	}
	k.Drop(e)
	if ok, _, err := conn.Exists(p); err != nil || ok {
		t.Fatalf("dropped node still there (%v)", err)
	}
	if known, _ := k.Tracked(p); known {
		t.Fatal("a settled node stays in the keeper")
	}
}

// A node of another session under a kept name (the previous process's,
// not expired yet) is replaced by one of the keeper's session, which
// survives the other session's end; a stray node is deleted; a node whose
// parent is missing is not created.
func TestKeepReplacesAndRemovesStrays(t *testing.T) {
	k, conn := keeperOn(t, []string{zktest.Addr(t)}, 4*time.Second)
	prev := zktest.Conn(t)
	root := zktest.Root(t)
	ensurePath(t, prev, root)
	kept, stray, marker := root+"/kept", root+"/stray", root+"/marker"
	for _, p := range []string{kept, stray, marker} {
		if _, err := prev.Create(p, []byte("old"), zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	e := k.Keep(kept, []byte("new"))
	if o := zktest.Owner(conn, kept); o != conn.SessionID() {
		t.Fatalf("kept node owned by 0x%x, want 0x%x", o, conn.SessionID())
	}
	if data, _, err := conn.Get(kept); err != nil || string(data) != "new" {
		t.Fatalf("kept node data %q (%v), want %q", data, err, "new")
	}
	if known, wanted := k.Tracked(kept); !known || !wanted {
		t.Fatalf("kept node: known %v wanted %v", known, wanted)
	}
	k.Stray(stray)
	zktest.WaitFor(t, 20*time.Second, "the stray node deleted", func() bool { return !zktest.Exists(t, conn, stray) })
	zktest.WaitFor(t, 20*time.Second, "the stray node forgotten", func() bool { known, _ := k.Tracked(stray); return !known })
	prev.Close()
	zktest.WaitFor(t, 20*time.Second, "the previous session's nodes gone", func() bool { return !zktest.Exists(t, conn, marker) })
	if !zktest.Exists(t, conn, kept) {
		t.Fatal("the kept node vanished with the previous session")
	}

	orphan := k.Keep(root+"/missing/child", nil)
	if zktest.Exists(t, conn, root+"/missing") {
		t.Fatal("Keep created a missing parent")
	}
	k.Drop(orphan)
	k.Drop(e)
	if zktest.Exists(t, conn, kept) {
		t.Fatal("dropped node still there")
	}
}

// A session expiry (a partition longer than the session timeout) deletes
// the kept nodes; once ZooKeeper is back they exist again, owned by the
// new session. A node dropped during the partition is not created again.
func TestKeepRecreatesAfterSessionExpiry(t *testing.T) {
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	k, conn := keeperOn(t, []string{proxy.Addr()}, 2*time.Second)
	observer := zktest.Conn(t)
	root := zktest.Root(t)
	ensurePath(t, observer, root)
	a, b := root+"/a", root+"/b"
	k.Keep(a, nil)
	eb := k.Keep(b, nil)
	old := zktest.Owner(observer, a)
	if old == 0 || zktest.Owner(observer, b) != old {
		t.Fatalf("nodes owned by 0x%x and 0x%x", old, zktest.Owner(observer, b))
	}

	proxy.Cut()
	zktest.WaitFor(t, 30*time.Second, "the session expired on the server", func() bool {
		return zktest.Owner(observer, a) == 0 && zktest.Owner(observer, b) == 0
	})
	k.Drop(eb)
	proxy.Restore()
	var now int64
	zktest.WaitFor(t, 30*time.Second, "the kept node created by a new session", func() bool {
		now = zktest.Owner(observer, a)
		return now != 0 && now != old
	})
	if now != conn.SessionID() {
		t.Fatalf("node owned by 0x%x, the keeper's session is 0x%x", now, conn.SessionID())
	}
	zktest.WaitFor(t, 30*time.Second, "the dropped node forgotten", func() bool { known, _ := k.Tracked(b); return !known })
	if zktest.Exists(t, observer, b) {
		t.Fatal("a node dropped during the partition was created again")
	}
}

// State returns what the keeper knows of e: the session owning the node
// it made, and whether an outcome is unknown.
func (e *keptNode) State() (owner int64, unknown bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.owner, e.unknown
}

func ensurePath(t *testing.T, conn *zk.Conn, p string) {
	t.Helper()
	if err := zkutil.EnsurePath(conn, p, nil); err != nil {
		t.Fatal(err)
	}
}
