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
	var multis atomic.Int32
	b := NewCommitter([]*zk.Conn{conn}, CommitterConfig{Workers: 1, Observer: func(op string, _ time.Duration, _ error) {
		if op == "multi" {
			multis.Add(1)
		}
	}})
	defer b.Close()
	var batch []*batchReq
	nops := 0
	for i := range 10 {
		r := &batchReq{done: make(chan batchResult, 1), ops: []any{
			&zk.CreateRequest{Path: fmt.Sprintf("%s/m%02d", root, i), Acl: zk.WorldACL(zk.PermAll)}}}
		if i == 5 {
			r.ops = append(r.ops, &zk.CreateRequest{Path: root + "/dup", Acl: zk.WorldACL(zk.PermAll)})
		}
		batch = append(batch, r)
		nops += len(r.ops)
	}
	b.commit(b.conns[0], batch, nops)
	for i, r := range batch {
		out := <-r.done
		switch {
		case i == 5 && (!errors.Is(out.err, zk.ErrNodeExists) || !errors.Is(out.res[1].Error, zk.ErrNodeExists)):
			t.Errorf("the duplicate: %v (%v), want ErrNodeExists at its second op", out.err, out.res)
		case i != 5 && out.err != nil:
			t.Errorf("transaction %d: %v", i, out.err)
		}
	}
	if n := multis.Load(); n != 2 {
		t.Errorf("%d Multis, want 2", n)
	}
	if ok, _, _ := conn.Exists(root + "/m05"); ok {
		t.Error("the failed transaction's other op was applied")
	}
}
