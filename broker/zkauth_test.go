package broker_test

import (
	"context"
	"errors"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
)

const testDigest = "qbroker:s3cret-for-tests"

func withDigest(c *broker.Config) { c.ZKDigest = testDigest }

// authedConn is a ZooKeeper session with the brokers' credential.
func authedConn(t *testing.T) *zk.Conn {
	t.Helper()
	conn := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := zkutil.Authenticate(ctx, conn, testDigest); err != nil {
		t.Fatal(err)
	}
	return conn
}

// walk returns p and every node below it.
func walk(t *testing.T, conn *zk.Conn, p string) []string {
	t.Helper()
	children, _, err := conn.Children(p)
	if err != nil {
		t.Fatalf("children %s: %v", p, err)
	}
	out := []string{p}
	for _, c := range children {
		out = append(out, walk(t, conn, path.Join(p, c))...)
	}
	return out
}

// messages returns the paths of the message nodes of the queue whose items
// parent is items: the children of its segments.
func messages(t *testing.T, conn *zk.Conn, items string) []string {
	t.Helper()
	var out []string
	for _, p := range walk(t, conn, items) {
		if strings.Count(strings.TrimPrefix(p, items), "/") == 2 {
			out = append(out, p)
		}
	}
	return out
}

// With a digest credential the broker works end to end, every node it
// created carries the brokers' ACL, and a ZooKeeper client without the
// credential can neither read nor change anything: not a message, not a
// lease, not the queue's metadata, not the token key.
func TestZKDigestClosesTheTree(t *testing.T) {
	root := zktest.Root(t)
	b := newBroker(t, root, withDigest)
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "orders"})
	publishN(t, b.client, "orders", 3)
	leased := receive(t, b.client, &pb.ReceiveRequest{Queue: "orders", Mode: alo})
	if len(leased) != 1 || string(leased[0].GetPayload()) != "m00000" {
		t.Fatalf("received %v, want m00000", leased)
	}

	admin := authedConn(t)
	want, _ := zkutil.DigestACL(testDigest, false)
	nodes := walk(t, admin, root)
	for _, p := range nodes {
		acl, _, err := admin.GetACL(p)
		if err != nil {
			t.Fatal(err)
		}
		if p != root && !zkutil.SameACL(acl, want) { // the root is zktest's
			t.Errorf("%s has ACL %v, want %v", p, acl, want)
		}
	}
	q := root + "/queues/orders"
	items := messages(t, admin, q+"/items")
	if len(items) != 2 {
		t.Fatalf("messages = %v; want 2", items)
	}
	leases, _, err := admin.Children(q + "/leases")
	if err != nil || len(leases) != 1 {
		t.Fatalf("leases = %v, %v; want 1", leases, err)
	}

	plain := zktest.Conn(t)
	noAuth := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, zk.ErrNoAuth) {
			t.Errorf("%s without the credential: got %v, want ErrNoAuth", what, err)
		}
	}
	noAuth("delete a message", plain.Delete(items[0], -1))
	noAuth("delete a lease", plain.Delete(q+"/leases/"+leases[0], -1))
	_, err = plain.Create(q+"/items/qn-0000009999", []byte("garbage"), 0, zk.WorldACL(zk.PermAll))
	noAuth("create a message", err)
	_, err = plain.Create(path.Dir(items[0])+"/qn-1-0000009999", []byte("garbage"), 0, zk.WorldACL(zk.PermAll))
	noAuth("create a message in a segment", err)
	_, err = plain.Create(q+"/items/s0000000000000000002", nil, 0, zk.WorldACL(zk.PermAll))
	noAuth("create a segment", err)
	_, err = plain.Set(q, []byte(`{"kind":"sync"}`), -1)
	noAuth("set the metadata", err)
	_, err = plain.Set(q+"/leases/"+leases[0], nil, -1)
	noAuth("set a lease", err)
	_, _, err = plain.Get(root + "/token-key")
	noAuth("read the token key", err)
	_, _, err = plain.Children(q + "/items")
	noAuth("list the messages", err)
	_, err = plain.SetACL(q, zk.WorldACL(zk.PermAll), -1)
	noAuth("open the queue's ACL", err)

	// Nothing changed: the messages are all there, in order.
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: leased[0].GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"m00001", "m00002"} {
		ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "orders", Mode: alo})
		if len(ms) != 1 || string(ms[0].GetPayload()) != want {
			t.Fatalf("received %v, want %s", ms, want)
		}
		if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: ms[0].GetAckToken()}); err != nil {
			t.Fatal(err)
		}
	}
}

// With ZKWorldRead anyone reads the broker's nodes but cannot change them.
func TestZKWorldRead(t *testing.T) {
	root := zktest.Root(t)
	b := newBroker(t, root, withDigest, func(c *broker.Config) { c.ZKWorldRead = true })
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	plain := zktest.Conn(t)
	if _, _, err := plain.Get(root + "/queues/q"); err != nil {
		t.Fatalf("read with world read: %v", err)
	}
	if _, err := plain.Set(root+"/queues/q", nil, -1); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("set with world read: got %v, want ErrNoAuth", err)
	}
	// The key that signs ack tokens stays secret.
	if _, _, err := plain.Get(root + "/token-key"); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("read the token key with world read: got %v, want ErrNoAuth", err)
	}
}

// A root made without authentication is open to anyone: a broker with a
// credential refuses it, saying what to run; with ZKMigrateACL it closes
// the whole tree, and the messages stored before are still delivered.
func TestZKOpenRootRefusedOrMigrated(t *testing.T) {
	root := zktest.Root(t)
	open := newBroker(t, root)
	createQueue(t, open.client, &pb.CreateQueueRequest{Name: "old"})
	publishN(t, open.client, "old", 2)
	open.stop()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := broker.New(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: root, ZKDigest: testDigest, SessionTimeout: 4 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "--zk-migrate-acl") || !strings.Contains(err.Error(), "writable by anyone") || strings.Contains(err.Error(), "Config.") {
		t.Fatalf("broker on an open root: got %v, want a refusal naming --zk-migrate-acl (the flag, not a Go field)", err)
	}

	b := newBroker(t, root, withDigest, func(c *broker.Config) { c.ZKMigrateACL = true })
	plain := zktest.Conn(t)
	items := messages(t, authedConn(t), root+"/queues/old/items")
	if len(items) != 2 {
		t.Fatalf("messages = %v; want 2", items)
	}
	if err := plain.Delete(items[0], -1); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("delete after migration: got %v, want ErrNoAuth", err)
	}
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "old", MaxMessages: 2})
	if len(ms) != 2 {
		t.Fatalf("received %d messages after migration, want 2", len(ms))
	}
	// A second start finds the tree closed and starts without migrating.
	newBroker(t, root, withDigest)
}

// The client sends the credential again after a reconnection: the broker
// keeps working once its connection to ZooKeeper was cut and restored.
func TestZKDigestSurvivesReconnect(t *testing.T) {
	root := zktest.Root(t)
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	b := startBroker(t, []string{proxy.Addr()}, root, withDigest, func(c *broker.Config) { c.ZKSessions = 1 })
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	publish := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("after")}}})
		return err
	}
	proxy.Cut()
	zktest.WaitFor(t, 30*time.Second, "publishes to fail while cut off", func() bool { return publish() != nil })
	proxy.Restore()
	zktest.WaitFor(t, 30*time.Second, "a publish after the reconnection", func() bool { return publish() == nil })
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q"})
	if len(ms) != 1 || string(ms[0].GetPayload()) != "after" {
		t.Fatalf("received %v, want after", ms)
	}
}

// A node injected into a queue's items where ACLs do not stop it (the
// `create .../items/qn-0000009999 garbage` of any ZooKeeper client) is
// never delivered, in either mode; it is counted once, and Purge deletes
// it. Metadata that is not a valid spec makes the queue absent rather
// than served with it.
func TestForeignNodeNeverDelivered(t *testing.T) {
	root := zktest.Root(t)
	reg := prometheus.NewRegistry()
	b := newBroker(t, root, func(c *broker.Config) { c.Registerer = reg })
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	plain := zktest.Conn(t)
	items := root + "/queues/q/items"
	for _, name := range []string{"qn-0000009999", "qn-0000000000"} {
		if _, err := plain.Create(items+"/"+name, []byte("garbage"), 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	publishN(t, b.client, "q", 2)
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", Mode: alo, MaxMessages: 10})
	ms = append(ms, receive(t, b.client, &pb.ReceiveRequest{Queue: "q", MaxMessages: 10})...)
	if len(ms) != 2 || string(ms[0].GetPayload()) != "m00000" || string(ms[1].GetPayload()) != "m00001" {
		t.Fatalf("received %v, want m00000 and m00001 only", ms)
	}
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: ms[0].GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	if ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", MaxMessages: 10, Wait: durationpb.New(200 * time.Millisecond)}); len(ms) != 0 {
		t.Fatalf("received %v after the real messages, want none", ms)
	}
	if n := counterSum(t, reg, "qbroker_bad_message_nodes_total"); n != 2 {
		t.Errorf("qbroker_bad_message_nodes_total = %v, want 2", n)
	}
	r, err := b.client.Purge(ctx, &pb.PurgeRequest{Name: "q"})
	if err != nil || r.GetPurged() != 2 {
		t.Fatalf("Purge = %v, %v; want the 2 foreign nodes", r, err)
	}
	if left := messages(t, plain, items); len(left) != 0 {
		t.Fatalf("left after Purge: %v", left)
	}

	// A FIFO queue turned into a sync queue without a group size is no
	// queue at all.
	if _, err := plain.Set(root+"/queues/q", []byte(`{"v":1,"kind":"sync","visibility_ms":30000}`), -1); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "the queue refused", func() bool {
		_, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("x")}}})
		return status.Code(err) == codes.NotFound
	})
}
