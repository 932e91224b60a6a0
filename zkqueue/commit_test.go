package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// Concurrent transactions through one Batcher each get their own result,
// also when one of them spoils a combined Multi.
func TestBatcherIsolatesFailures(t *testing.T) {
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	if err := zkutil.EnsurePath(conn, root, nil); err != nil {
		t.Fatal(err)
	}
	const n = 400
	for i := 0; i < n; i++ {
		if _, err := conn.Create(fmt.Sprintf("%s/n%03d", root, i), nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	b := zkqueue.NewCommitter([]*zk.Conn{conn, zktest.Conn(t)}, zkqueue.CommitterConfig{Workers: 2, MaxOps: 64, MaxBytes: 64 << 10})
	defer b.Close()
	var wg sync.WaitGroup
	errs := make([]error, n+n/4)
	for i := 0; i < n+n/4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			// Every fifth node is deleted twice: one of the two must fail
			// with NoNode, everything else must succeed.
			node := i
			if i >= n {
				node = (i - n) * 4
			}
			_, errs[i] = b.Do(context.Background(), &zk.DeleteRequest{Path: fmt.Sprintf("%s/n%03d", root, node), Version: -1})
		}(i)
	}
	wg.Wait()
	noNode := 0
	for i, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, zk.ErrNoNode):
			noNode++
		default:
			t.Errorf("transaction %d: %v", i, err)
		}
	}
	if noNode != n/4 {
		t.Errorf("%d transactions failed with NoNode, want %d (one per doubly deleted node)", noNode, n/4)
	}
	children, _, err := conn.Children(root)
	if err != nil || len(children) != 0 {
		t.Errorf("left %d nodes (%v), want none", len(children), err)
	}
	// A two-op transaction stays atomic inside a batch: its create must
	// not survive its failed check.
	_, err = b.Do(context.Background(), &zk.CreateRequest{Path: root + "/x", Acl: zk.WorldACL(zk.PermAll)}, &zk.CheckVersionRequest{Path: root + "/missing", Version: 0})
	if !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("failed transaction: got %v, want ErrNoNode", err)
	}
	if ok, _, _ := conn.Exists(root + "/x"); ok {
		t.Fatal("the create of a failed transaction was committed")
	}
	if _, err := b.Do(context.Background(), &zk.CreateRequest{Path: root + "/y", Acl: zk.WorldACL(zk.PermAll)}); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if _, err := b.Do(context.Background(), &zk.DeleteRequest{Path: root + "/y", Version: -1}); !errors.Is(err, zkqueue.ErrCommitterClosed) {
		t.Fatalf("Do after Close: got %v, want ErrCommitterClosed", err)
	}
}
