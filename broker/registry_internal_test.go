package broker

import (
	"context"
	"path"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
)

func newTestBroker(t *testing.T) *Broker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := New(ctx, Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t), SessionTimeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// An election node of this session other than the current one (a create
// whose answer was lost) is removed, so it cannot stall the election.
func TestElectionOrphansRemoved(t *testing.T) {
	b := newTestBroker(t)
	var me string
	deadline := time.Now().Add(20 * time.Second)
	for me == "" {
		children, _, err := b.conn.Children(b.electionPath())
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range children {
			if ok, st, _ := b.conn.Exists(b.electionPath() + "/" + c); ok && st.EphemeralOwner == b.conn.SessionID() {
				me = c
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no election node")
		}
		time.Sleep(20 * time.Millisecond)
	}
	orphan, err := b.conn.Create(b.electionPath()+"/n-", []byte(b.cfg.ID), zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	children, _, err := b.conn.Children(b.electionPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.dropOrphans(children, me); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := b.conn.Exists(orphan); ok {
		t.Fatalf("orphan %s still there", path.Base(orphan))
	}
	if ok, _, _ := b.conn.Exists(b.electionPath() + "/" + me); !ok {
		t.Fatal("the current election node was removed")
	}
}
