package zkqueue

import (
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
	var multis atomic.Int32
	b := NewCommitter([]*zk.Conn{conn}, CommitterConfig{Workers: 1, Observer: func(op string, _ time.Duration, _ error) {
		if op == "multi" {
			multis.Add(1)
		}
	}})
	defer b.Close()
	var batch []*batchReq
	nops := 0
	for i := range 20 {
		r := &batchReq{done: make(chan batchResult, 1)}
		if i%2 == 0 {
			// A publish into the sealed segment.
			r.ops = []any{&zk.CheckVersionRequest{Path: seg, Version: 0},
				&zk.CreateRequest{Path: seg + "/qn-", Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagSequence}}
		} else {
			r.ops = []any{&zk.CreateRequest{Path: fmt.Sprintf("%s/other%02d", root, i), Acl: zk.WorldACL(zk.PermAll)}}
		}
		batch = append(batch, r)
		nops += len(r.ops)
	}
	b.commit(b.conns[0], batch, nops)
	for i, r := range batch {
		out := <-r.done
		switch {
		case i%2 == 0 && !errors.Is(out.err, zk.ErrBadVersion):
			t.Errorf("publish %d into the sealed segment: %v, want ErrBadVersion", i, out.err)
		case i%2 == 1 && out.err != nil:
			t.Errorf("transaction %d: %v", i, out.err)
		}
	}
	if n := multis.Load(); n != 2 {
		t.Errorf("%d Multis, want 2", n)
	}
	if children, _, err := conn.Children(seg); err != nil || len(children) != 0 {
		t.Errorf("sealed segment got %v (%v)", children, err)
	}
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
