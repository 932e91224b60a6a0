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

// A create whose answer was lost (the node exists, made by this very
// session) is recognized as ours, and dropping it deletes it.
func TestKeepAdoptsItsOwnNode(t *testing.T) {
	b := newTestBroker(t)
	p := b.brokersPath() + "/lost-answer"
	if _, err := b.conn.Create(p, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	e := b.keep(p, nil)
	e.mu.Lock()
	own, unknown := e.owner, e.unknown
	e.mu.Unlock()
	if own != b.conn.SessionID() || unknown {
		t.Fatalf("owner 0x%x unknown %v, want the session 0x%x", own, unknown, b.conn.SessionID())
	}
	b.drop(e)
	if ok, _, err := b.conn.Exists(p); err != nil || ok {
		t.Fatalf("dropped node still there (%v)", err)
	}
	if known, _ := b.reg.tracked(p); known {
		t.Fatal("a settled node stays in the registry")
	}
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
