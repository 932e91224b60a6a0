package zkqueue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// runRegistry runs a Registry of conn until the test ends.
func runRegistry(t *testing.T, conn *zk.Conn) *zkqueue.Registry {
	t.Helper()
	r := zkqueue.NewRegistry(conn, zkqueue.RegistryConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

// A registration outlives its session: when the session expires (the
// process is cut off from ZooKeeper for longer than the session timeout),
// the running Registry makes it again under the new session, and the
// group counts it again. Closed, it is gone for good.
func TestRegistrationSurvivesSessionExpiry(t *testing.T) {
	ctx := context.Background()
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	conn := zktest.ConnTo(t, []string{proxy.Addr()})
	observer := zktest.Conn(t)
	dir := zktest.Root(t) + "/q/consumers"
	g, err := zkqueue.NewConsumerGroup(conn, dir, "p", zkqueue.ConsumerGroupConfig{Registry: runRegistry(t, conn)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := g.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old := zktest.Owner(observer, r.Path())
	if old == 0 || old != conn.SessionID() {
		t.Fatalf("registration owned by 0x%x, the session is 0x%x", old, conn.SessionID())
	}

	proxy.Cut()
	zktest.WaitFor(t, 30*time.Second, "the session expired on the server", func() bool { return zktest.Owner(observer, r.Path()) == 0 })
	proxy.Restore()
	zktest.WaitFor(t, 30*time.Second, "the registration made again by the new session", func() bool {
		now := zktest.Owner(observer, r.Path())
		return now != 0 && now != old && now == conn.SessionID()
	})
	if n, err := g.Count(ctx); err != nil || n != 1 {
		t.Fatalf("Count: got %d, %v; want 1", n, err)
	}

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if zktest.Owner(observer, r.Path()) != 0 {
		t.Fatal("a closed registration is still there")
	}
	if n, err := g.Count(ctx); err != nil || n != 0 {
		t.Fatalf("Count after Close: got %d, %v; want 0", n, err)
	}
}

// A registration under this process's id that its Registry did not make
// (left by its previous process, whose session lives on) does not count
// for this process, and the running Registry deletes it; another
// process's registrations are left alone.
func TestRegistryDeletesItsPreviousProcesssRegistrations(t *testing.T) {
	ctx := context.Background()
	conn, prev, other := zktest.Conn(t), zktest.Conn(t), zktest.Conn(t)
	dir := zktest.Root(t) + "/q/consumers"
	before, err := zkqueue.NewConsumerGroup(prev, dir, "p", zkqueue.ConsumerGroupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	stray, err := before.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o, err := zkqueue.NewConsumerGroup(other, dir, "o", zkqueue.ConsumerGroupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := o.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g, err := zkqueue.NewConsumerGroup(conn, dir, "p", zkqueue.ConsumerGroupConfig{Registry: runRegistry(t, conn)})
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := g.Consumers(ctx); err != nil || len(ids) != 1 || ids[0] != "o" {
		t.Fatalf("Consumers: got %v, %v; want [o]", ids, err)
	}
	zktest.WaitFor(t, 20*time.Second, "the previous process's registration deleted", func() bool {
		return zktest.Owner(conn, stray.Path()) == 0
	})
	if zktest.Owner(conn, kept.Path()) == 0 {
		t.Fatal("another process's registration was deleted")
	}
}

// A registration closed while ZooKeeper is unreachable (shorter than the
// session timeout: the session lives on) is deleted once it is back.
func TestRegistrationClosedWhileCutOff(t *testing.T) {
	ctx := context.Background()
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	conn := zktest.ConnTo(t, []string{proxy.Addr()})
	observer := zktest.Conn(t)
	dir := zktest.Root(t) + "/q/consumers"
	g, err := zkqueue.NewConsumerGroup(conn, dir, "p", zkqueue.ConsumerGroupConfig{Registry: runRegistry(t, conn)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := g.Register(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sid := zktest.Owner(observer, r.Path())
	proxy.Cut()
	zktest.WaitFor(t, 20*time.Second, "the client to lose its connection", func() bool { return conn.State() != zk.StateHasSession })
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	zktest.WaitFor(t, 20*time.Second, "the closed registration deleted", func() bool { return zktest.Owner(observer, r.Path()) == 0 })
	if conn.SessionID() != sid {
		t.Fatalf("the session changed (0x%x, was 0x%x): the cut outlasted it", conn.SessionID(), sid)
	}
}
