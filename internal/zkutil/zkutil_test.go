package zkutil_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
)

func TestMain(m *testing.M) { zktest.Main(m) }

func create(t *testing.T, conn *zk.Conn, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if err := zkutil.EnsurePath(conn, p, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// A tree of several levels and more siblings than one Multi takes is
// deleted; deleting it again, or a path that never existed, is no error.
func TestDeleteTree(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	create(t, conn, root+"/a/b/c", root+"/a/d", root+"/e")
	ops := make([]any, 0, 600)
	for i := 0; i < 1200; i++ {
		ops = append(ops, &zk.CreateRequest{Path: fmt.Sprintf("%s/e/n%04d", root, i), Acl: zk.WorldACL(zk.PermAll)})
		if len(ops) == 600 {
			if _, err := conn.Multi(ops...); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	if err := zkutil.DeleteTree(ctx, conn, root, nil); err != nil {
		t.Fatal(err)
	}
	if zktest.Exists(t, conn, root) {
		t.Fatal("root still exists")
	}
	if err := zkutil.DeleteTree(ctx, conn, root, nil); err != nil {
		t.Fatalf("again: %v", err)
	}
}

// A child created between DeleteTree's listing of a parent and the
// parent's delete (a publisher's message, a consumer's registration) does
// not fail the deletion: the parent is listed again. Staged at each level.
func TestDeleteTreeChildCreatedAfterListing(t *testing.T) {
	conn := zktest.Conn(t)
	for _, level := range []string{"items", ""} {
		t.Run("level="+level, func(t *testing.T) {
			root := zktest.Root(t)
			create(t, conn, root+"/items/qn-0000000001", root+"/leases")
			target := root
			if level != "" {
				target += "/" + level
			}
			staged := 0
			zkutil.SetListedHook(func(p string) {
				if p != target || staged > 0 {
					return
				}
				staged++
				// A new child, and at the root one with a child of its own.
				if _, err := conn.Create(p+"/late-", nil, zk.FlagSequence, zk.WorldACL(zk.PermAll)); err != nil {
					t.Errorf("staging: %v", err)
				}
				if level == "" {
					create(t, conn, p+"/start/x")
				}
			})
			defer zkutil.SetListedHook(nil)
			if err := zkutil.DeleteTree(context.Background(), conn, root, nil); err != nil {
				t.Fatal(err)
			}
			if staged != 1 {
				t.Fatalf("staged %d times, want 1", staged)
			}
			if zktest.Exists(t, conn, root) {
				t.Fatal("root still exists")
			}
		})
	}
}

// Writers creating children all along the deletion (they stop when their
// parent is gone, as a queue's publishers get NoNode) do not stop it.
func TestDeleteTreeWithConcurrentCreates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	create(t, conn, root+"/items", root+"/leases")
	var created atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, parent := range []string{"items", "leases"} {
		for i := 0; i < 2; i++ {
			c := zktest.Conn(t)
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for n := 0; n < 500 && ctx.Err() == nil; n++ {
					_, err := c.Create(root+"/"+parent+"/qn-", nil, zk.FlagSequence, zk.WorldACL(zk.PermAll))
					if errors.Is(err, zk.ErrNoNode) {
						return
					}
					if err != nil {
						t.Errorf("create: %v", err)
						return
					}
					created.Add(1)
				}
			}()
		}
	}
	close(start)
	for created.Load() < 100 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if err := zkutil.DeleteTree(ctx, conn, root, nil); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if zktest.Exists(t, conn, root) {
		t.Fatal("root still exists")
	}
}

// With a guard, a tree created anew under the same path after the guarded
// version was deleted is left alone: the guard fails and DeleteTree
// returns ErrGuardChanged without deleting anything.
func TestDeleteTreeGuard(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	q := root + "/q"
	create(t, conn, q+"/items/m1", q+"/leases")
	st, err := conn.Set(q, []byte("marked"), 0)
	if err != nil {
		t.Fatal(err)
	}
	old := &zkutil.Guard{Path: q, Version: st.Version}

	// A deleter with the guard at the marked version deletes everything.
	if err := zkutil.DeleteTree(ctx, conn, q+"/items", old); err != nil {
		t.Fatal(err)
	}
	if zktest.Exists(t, conn, q+"/items") {
		t.Fatal("items survived the guarded delete")
	}

	// Someone else finished the deletion and created the node anew.
	if err := zkutil.DeleteTree(ctx, conn, q, nil); err != nil {
		t.Fatal(err)
	}
	create(t, conn, q+"/items/m2", q+"/leases/l1")
	for _, p := range []string{q + "/items", q + "/leases", q} {
		if err := zkutil.DeleteTree(ctx, conn, p, old); !errors.Is(err, zkutil.ErrGuardChanged) {
			t.Errorf("DeleteTree(%s) with a stale guard: got %v, want ErrGuardChanged", p, err)
		}
	}
	for _, p := range []string{q + "/items/m2", q + "/leases/l1"} {
		if !zktest.Exists(t, conn, p) {
			t.Errorf("%s of the new tree was deleted", p)
		}
	}

	// Marked at the same version as the old mark, the new tree is the
	// one a guard of that version deletes.
	if _, err := conn.Set(q, []byte("marked"), 0); err != nil {
		t.Fatal(err)
	}
	if err := zkutil.DeleteTree(ctx, conn, q, old); err != nil {
		t.Fatal(err)
	}
	if zktest.Exists(t, conn, q) {
		t.Fatal("marked tree survived")
	}
}

// A cancelled context stops the deletion with the context's error.
func TestDeleteTreeContext(t *testing.T) {
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	create(t, conn, root+"/a")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := zkutil.DeleteTree(ctx, conn, root, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if !zktest.Exists(t, conn, root+"/a") {
		t.Fatal("deleted despite the cancelled context")
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"a", "orders", "A-z_0.9", "...", strings.Repeat("x", zkutil.MaxNameLen)} {
		if err := zkutil.CheckName(ok); err != nil {
			t.Errorf("CheckName(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "a b", "é", "a\x00", "a:b", strings.Repeat("x", zkutil.MaxNameLen+1)} {
		if err := zkutil.CheckName(bad); err == nil {
			t.Errorf("CheckName(%q) = nil, want an error", bad)
		}
	}
}
