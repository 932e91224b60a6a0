package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// A combined Multi that fails on the version check of a sealed segment
// answers every transaction carrying that check with the failure and
// commits the others together: two Multis, not one per transaction.
func TestCommitStraddlingSeal(t *testing.T) {
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	seg := root + "/seg"
	if err := zkutil.EnsurePath(conn, seg, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Set(seg, sealedData, 0); err != nil {
		t.Fatal(err)
	}
	var txns [][]any
	for i := range 20 {
		if i%2 == 0 {
			// A publish into the sealed segment.
			txns = append(txns, []any{&zk.CheckVersionRequest{Path: seg, Version: 0},
				&zk.CreateRequest{Path: seg + "/qn-", Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagSequence}})
		} else {
			txns = append(txns, []any{&zk.CreateRequest{Path: fmt.Sprintf("%s/other%02d", root, i), Acl: zk.WorldACL(zk.PermAll)}})
		}
	}
	batch, multis := commitOnce(t, conn, txns)
	for i, r := range batch {
		out := <-r.done
		switch {
		case i%2 == 0 && !errors.Is(out.err, zk.ErrBadVersion):
			t.Errorf("publish %d into the sealed segment: %v, want ErrBadVersion", i, out.err)
		case i%2 == 1 && out.err != nil:
			t.Errorf("transaction %d: %v", i, out.err)
		}
	}
	if multis != 2 {
		t.Errorf("%d Multis, want 2", multis)
	}
	if children, _, err := conn.Children(seg); err != nil || len(children) != 0 {
		t.Errorf("sealed segment got %v (%v)", children, err)
	}
}

// A combined Multi that fails on one transaction's create of a node that
// already exists (a duplicate's dedup record) answers that transaction
// and commits the others together: two Multis, not one per transaction.
func TestCommitOneDuplicate(t *testing.T) {
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	if err := zkutil.EnsurePath(conn, root, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Create(root+"/dup", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	var txns [][]any
	for i := range 10 {
		ops := []any{&zk.CreateRequest{Path: fmt.Sprintf("%s/m%02d", root, i), Acl: zk.WorldACL(zk.PermAll)}}
		if i == 5 {
			ops = append(ops, &zk.CreateRequest{Path: root + "/dup", Acl: zk.WorldACL(zk.PermAll)})
		}
		txns = append(txns, ops)
	}
	batch, multis := commitOnce(t, conn, txns)
	for i, r := range batch {
		out := <-r.done
		switch {
		case i == 5 && (!errors.Is(out.err, zk.ErrNodeExists) || !errors.Is(out.res[1].Error, zk.ErrNodeExists)):
			t.Errorf("the duplicate: %v (%v), want ErrNodeExists at its second op", out.err, out.res)
		case i != 5 && out.err != nil:
			t.Errorf("transaction %d: %v", i, out.err)
		}
	}
	if multis != 2 {
		t.Errorf("%d Multis, want 2", multis)
	}
	if ok, _, _ := conn.Exists(root + "/m05"); ok {
		t.Error("the failed transaction's other op was applied")
	}
}

// Claims lost to another broker (deletes of nodes already gone) fail
// their own transactions only: each costs one Multi more, the others
// commit together. A failure another transaction of the batch may have
// caused (a delete of a node whose child an earlier transaction created)
// is settled by running each alone, so every caller still gets what it
// would have got alone.
func TestCommitLostClaims(t *testing.T) {
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	if err := zkutil.EnsurePath(conn, root, nil); err != nil {
		t.Fatal(err)
	}
	var txns [][]any
	for i := range 10 {
		p := fmt.Sprintf("%s/m%02d", root, i)
		if i != 3 && i != 7 {
			if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
				t.Fatal(err)
			}
		}
		txns = append(txns, []any{&zk.DeleteRequest{Path: p, Version: -1}, &zk.CreateRequest{Path: p + "~lease", Acl: zk.WorldACL(zk.PermAll)}})
	}
	batch, multis := commitOnce(t, conn, txns)
	for i, r := range batch {
		out := <-r.done
		lost := i == 3 || i == 7
		switch {
		case lost && (!errors.Is(out.err, zk.ErrNoNode) || !errors.Is(out.res[0].Error, zk.ErrNoNode)):
			t.Errorf("lost claim %d: %v (%v), want ErrNoNode at its delete", i, out.err, out.res)
		case !lost && out.err != nil:
			t.Errorf("claim %d: %v", i, out.err)
		}
		if ok, _, _ := conn.Exists(fmt.Sprintf("%s/m%02d~lease", root, i)); ok == lost {
			t.Errorf("claim %d: lease exists %v, want %v", i, ok, !lost)
		}
	}
	if multis != 3 {
		t.Errorf("%d Multis, want 3 (one per lost claim, one for the rest)", multis)
	}

	// A delete that fails because an earlier transaction of the batch
	// gave the node a child: each transaction runs alone (concurrently,
	// in either order), and each gets an answer consistent with that.
	if _, err := conn.Create(root+"/d", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	batch, multis = commitOnce(t, conn, [][]any{
		{&zk.CreateRequest{Path: root + "/d/c", Acl: zk.WorldACL(zk.PermAll)}},
		{&zk.DeleteRequest{Path: root + "/d", Version: -1}},
	})
	create, del := <-batch[0].done, <-batch[1].done
	childFirst := create.err == nil && errors.Is(del.err, zk.ErrNotEmpty)
	parentFirst := del.err == nil && errors.Is(create.err, zk.ErrNoNode)
	if !childFirst && !parentFirst {
		t.Errorf("create of the child: %v, delete of the parent: %v; want one to succeed and the other to fail for it", create.err, del.err)
	}
	if multis != 3 {
		t.Errorf("%d Multis, want 3 (the batch, then each alone)", multis)
	}
}

// Small transactions that arrive while every session has a Multi under
// way wait for it and then go out together: one Multi more, not one per
// idle worker.
func TestCommitterPipelinesSmallBatches(t *testing.T) {
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	conn := zktest.ConnTo(t, []string{proxy.Addr()})
	root := zktest.Root(t)
	if err := zkutil.EnsurePath(zktest.Conn(t), root, nil); err != nil {
		t.Fatal(err)
	}
	b, multis := countedCommitter(t, conn, 4)
	txn := func(name string) *batchReq {
		return &batchReq{done: make(chan batchResult, 1), ops: []any{&zk.CreateRequest{Path: root + "/" + name, Acl: zk.WorldACL(zk.PermAll)}}}
	}
	proxy.Stall()
	reqs := []*batchReq{txn("first")}
	b.reqs <- reqs[0]
	zktest.WaitFor(t, 10*time.Second, "the first Multi under way", func() bool { return b.inflight.Load() == 1 })
	for i := range pipelineOps - 1 { // fewer than go out on their own
		// One at a time, each taken before the next arrives: an idle
		// worker would send each alone.
		r := txn(fmt.Sprintf("m%02d", i))
		reqs = append(reqs, r)
		b.reqs <- r
		zktest.WaitFor(t, 10*time.Second, "the transaction taken", func() bool { return len(b.reqs) == 0 || b.inflight.Load() > 1 })
	}
	proxy.Resume()
	for i, r := range reqs {
		if out := <-r.done; out.err != nil {
			t.Errorf("transaction %d: %v", i, out.err)
		}
	}
	if n := multis.Load(); n != 2 {
		t.Errorf("%d Multis for %d transactions, want 2 (the first, then the rest together)", n, len(reqs))
	}
}

// countedCommitter returns a Committer of workers per session on conn,
// closed when the test ends, and the count of the Multis it sent.
func countedCommitter(t *testing.T, conn *zk.Conn, workers int) (*Committer, *atomic.Int32) {
	t.Helper()
	multis := new(atomic.Int32)
	b := NewCommitter([]*zk.Conn{conn}, CommitterConfig{Workers: workers, Observer: func(op string, _ time.Duration, _ error) {
		if op == "multi" {
			multis.Add(1)
		}
	}})
	t.Cleanup(b.Close)
	return b, multis
}

// commitOnce hands txns to one commit of a Committer of one worker, as one
// batch, and returns their requests (answered) and the Multis it took.
func commitOnce(t *testing.T, conn *zk.Conn, txns [][]any) ([]*batchReq, int32) {
	t.Helper()
	b, multis := countedCommitter(t, conn, 1)
	defer b.Close()
	batch := make([]*batchReq, len(txns))
	nops := 0
	for i, ops := range txns {
		batch[i] = &batchReq{done: make(chan batchResult, 1), ops: ops}
		nops += len(ops)
	}
	b.commit(b.conns[0], batch, nops)
	return batch, multis.Load()
}

// A check that failed after an earlier transaction of the same combined
// Multi changed its node (a seal batched before a publish) is not taken
// for the node's state: the batch falls back to running each alone. A
// check that failed on its own is.
func TestFailStaleOnlyOnItsOwnCheck(t *testing.T) {
	seal := &batchReq{done: make(chan batchResult, 1), ops: []any{&zk.SetDataRequest{Path: "/seg", Data: sealedData, Version: 0}}}
	publish := &batchReq{done: make(chan batchResult, 1), ops: []any{&zk.CheckVersionRequest{Path: "/seg", Version: 0},
		&zk.CreateRequest{Path: "/seg/qn-", Flags: zk.FlagSequence}}}
	ops := append(append([]any{}, seal.ops...), publish.ops...)
	res := []zk.MultiResponse{{}, {Error: zk.ErrBadVersion}, {Error: zk.ErrAPIError}}
	if _, ok := failStale([]*batchReq{seal, publish}, ops, res); ok {
		t.Fatal("a check failed by an earlier op of the batch was answered as the node's state")
	}
	other := &batchReq{done: make(chan batchResult, 1), ops: []any{&zk.DeleteRequest{Path: "/x", Version: -1}}}
	ops = append(append([]any{}, other.ops...), publish.ops...)
	rest, ok := failStale([]*batchReq{other, publish}, ops, res)
	if !ok || len(rest) != 1 || rest[0] != other {
		t.Fatalf("failStale = %v, %v; want the other transaction left to commit", rest, ok)
	}
	if out := <-publish.done; !errors.Is(out.err, zk.ErrBadVersion) {
		t.Fatalf("publish answered %v", out.err)
	}
}

// TestCommitterDeferred: deferred transactions wait for company, go with
// the next Multi that leaves, go on their own once deferOps ops wait or
// deferWait passed, and are committed by Close.
func TestCommitterDeferred(t *testing.T) {
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	if err := zkutil.EnsurePath(conn, root, nil); err != nil {
		t.Fatal(err)
	}
	b, multis := countedCommitter(t, conn, 4)
	b.deferWait = time.Hour // only company, or deferOps, sends them
	deferred := WithDeferredCommit(context.Background())
	create := func(name string) any {
		return &zk.CreateRequest{Path: root + "/" + name, Acl: zk.WorldACL(zk.PermAll)}
	}
	// do runs Do on a goroutine of its own; wait returns its error.
	do := func(ctx context.Context, ops ...any) (wait func() error) {
		errc := make(chan error, 1)
		go func() {
			_, err := b.Do(ctx, ops...)
			errc <- err
		}()
		return func() error {
			select {
			case err := <-errc:
				return err
			case <-time.After(20 * time.Second):
				return errors.New("not committed within 20s")
			}
		}
	}
	queued := func() int {
		b.deferMu.Lock()
		defer b.deferMu.Unlock()
		return len(b.deferred)
	}

	// Deferred ones wait, then go with a write nobody deferred.
	var waits []func() error
	for i := range 10 {
		waits = append(waits, do(deferred, create(fmt.Sprintf("d%02d", i))))
	}
	zktest.WaitFor(t, 10*time.Second, "10 deferred transactions", func() bool { return queued() == 10 })
	if n := multis.Load(); n != 0 {
		t.Fatalf("%d Multis while only deferred transactions waited", n)
	}
	if _, err := b.Do(context.Background(), create("plain")); err != nil {
		t.Fatal(err)
	}
	for i, wait := range waits {
		if err := wait(); err != nil {
			t.Errorf("deferred %d: %v", i, err)
		}
	}
	if n := multis.Load(); n != 1 {
		t.Errorf("%d Multis for 11 transactions, want 1 (the deferred ones along with the other)", n)
	}

	// deferOps ops of them go on their own, in one Multi.
	waits = waits[:0]
	for i := range deferOps {
		waits = append(waits, do(deferred, create(fmt.Sprintf("e%02d", i))))
	}
	for i, wait := range waits {
		if err := wait(); err != nil {
			t.Errorf("deferred %d: %v", i, err)
		}
	}
	if n := multis.Load(); n != 2 {
		t.Errorf("%d Multis after %d deferred ops more, want 2", n, deferOps)
	}

	// A lone one goes after deferWait; its failure is its own.
	b.deferMu.Lock()
	b.deferWait = time.Millisecond
	b.deferMu.Unlock()
	if _, err := b.Do(deferred, create("d00")); !errors.Is(err, zk.ErrNodeExists) {
		t.Errorf("deferred create of an existing node: %v, want %v", err, zk.ErrNodeExists)
	}

	// Close commits what waits.
	b.deferMu.Lock()
	b.deferWait = time.Hour
	b.deferMu.Unlock()
	wait := do(deferred, create("last"))
	zktest.WaitFor(t, 10*time.Second, "the deferred transaction", func() bool { return queued() == 1 })
	b.Close()
	if err := wait(); err != nil {
		t.Fatalf("deferred transaction at Close: %v", err)
	}
	children, _, err := conn.Children(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(children) != 10+1+deferOps+1 {
		t.Errorf("%d nodes, want %d", len(children), 10+1+deferOps+1)
	}
}
