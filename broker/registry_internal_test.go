package broker

import (
	"context"
	"path"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
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
// whose answer was lost) is removed when the broker campaigns, so it
// cannot stall the election: here the broker's leadership ends (another
// client deletes its node) while an orphan of its session waits in the
// election, ahead of it; the broker campaigns again behind the orphan and
// leads. The test looks through a session of its own, and makes the
// orphan on the broker's session with the broker's zkqueue.Registry.
func TestElectionOrphansRemoved(t *testing.T) {
	b := newTestBroker(t)
	observer := zktest.Conn(t)
	reg, err := b.root.Broker(b.cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	session := func() int64 { // the broker's, as the owner of its registration
		ok, st, err := observer.Exists(reg)
		if err != nil || !ok {
			return 0
		}
		return st.EphemeralOwner
	}
	own := func() []string { // this session's election nodes
		t.Helper()
		children, _, err := observer.Children(b.root.Election())
		if err != nil {
			t.Fatal(err)
		}
		sid := session()
		var out []string
		for _, c := range children {
			if ok, st, _ := observer.Exists(b.root.Election() + "/" + c); ok && st.EphemeralOwner == sid {
				out = append(out, c)
			}
		}
		return out
	}
	waitLeading := func(what string, cond func() bool) {
		t.Helper()
		zktest.WaitFor(t, 30*time.Second, what, func() bool { return b.member.leading.Load() && cond() })
	}
	var me string
	waitLeading("the broker to lead", func() bool {
		nodes := own()
		if len(nodes) == 1 {
			me = nodes[0]
		}
		return me != ""
	})
	// The lowest sequence: the orphan is ahead of every campaign.
	orphan := b.root.Election() + "/n-0000000000"
	b.registry.Keep(orphan, []byte(b.cfg.ID))
	if ok, st, err := observer.Exists(orphan); err != nil || !ok || st.EphemeralOwner != session() {
		t.Fatalf("orphan not made on the broker's session (exists %v, err %v)", ok, err)
	}
	if err := observer.Delete(b.root.Election()+"/"+me, -1); err != nil {
		t.Fatal(err)
	}
	waitLeading("the broker to lead again, past its orphan", func() bool {
		nodes := own()
		return len(nodes) == 1 && nodes[0] != me && nodes[0] != path.Base(orphan)
	})
}

// Brokers that elect with the earlier code (their own EPHEMERAL_SEQUENTIAL
// n-<seq> nodes, the lowest leads) and brokers on package election share
// one election: a broker does not lead while an older broker's node is
// ahead of its own, and leads once that one is gone.
func TestElectionSharedWithOlderBrokers(t *testing.T) {
	root := zktest.Root(t)
	other := zktest.Conn(t)
	if err := zkutil.EnsurePath(other, root+"/election", nil); err != nil {
		t.Fatal(err)
	}
	old, err := other.Create(root+"/election/n-", []byte("older-broker"), zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := New(ctx, Config{ZooKeeper: []string{zktest.Addr(t)}, Root: root, SessionTimeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		children, _, err := other.Children(root + "/election")
		if err != nil {
			t.Fatal(err)
		}
		if len(children) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker's election node did not appear: %v", children)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b.member.leading.Load() {
		t.Fatal("the broker leads behind an older broker's node")
	}
	if err := other.Delete(old, -1); err != nil {
		t.Fatal(err)
	}
	for !b.member.leading.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the broker did not lead once the older broker's node was gone")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
