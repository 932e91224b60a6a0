package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// openStream is a subscribed Consume stream whose deliveries arrive on
// msgs (shared by the streams of a test); cancel ends it.
type openStream struct {
	cancel context.CancelFunc
	msgs   chan *pb.Message
	ended  chan error
}

func subscribe(t *testing.T, c pb.QueueClient, queue string, msgs chan *pb.Message) *openStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := c.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue}}); err != nil {
		t.Fatal(err)
	}
	o := &openStream{cancel: cancel, msgs: msgs, ended: make(chan error, 1)}
	go func() {
		for {
			d, err := s.Recv()
			if err != nil {
				o.ended <- err
				return
			}
			o.msgs <- d.GetMessage()
		}
	}()
	return o
}

// delivers checks that the open streams still deliver: it publishes one
// message and expects it on msgs.
func delivers(t *testing.T, c pb.QueueClient, queue, payload string, msgs chan *pb.Message) {
	t.Helper()
	if _, err := c.Publish(context.Background(), &pb.PublishRequest{Queue: queue, Messages: []*pb.OutMessage{{Payload: []byte(payload)}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		if string(m.GetPayload()) != payload {
			t.Fatalf("stream got %q, want %q", m.GetPayload(), payload)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the open streams delivered nothing within 30s")
	}
}

// consumersOf returns the consumer registrations of queue and their
// owning sessions.
func consumersOf(t *testing.T, observer *zk.Conn, root, queue string) map[string]int64 {
	t.Helper()
	dir := root + "/queues/" + queue + "/consumers"
	children, _, err := observer.Children(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, c := range children {
		if ok, st, err := observer.Exists(dir + "/" + c); err == nil && ok {
			out[c] = st.EphemeralOwner
		}
	}
	return out
}

func waitConsumers(t *testing.T, c pb.QueueClient, queue string, want uint64) {
	t.Helper()
	var last uint64
	zktest.WaitFor(t, 30*time.Second, fmt.Sprintf("Stats consumers == %d", want), func() bool {
		st, err := c.Stats(context.Background(), &pb.StatsRequest{Name: queue})
		if err == nil {
			last = st.GetConsumers()
		}
		return err == nil && last == want
	})
}

// Streams that end while ZooKeeper is unreachable (the broker keeps its
// session: the cut is shorter than the session timeout) leave no
// registration once it is back: the failed deletes are retried.
func TestRegistrationsRemovedAfterZooKeeperCut(t *testing.T) {
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	root := zktest.Root(t)
	reg := prometheus.NewRegistry()
	tb := startBroker(t, []string{proxy.Addr()}, root, func(c *broker.Config) {
		c.SessionTimeout = 20 * time.Second
		c.Registerer = reg
	})
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: "q"})
	var streams []*openStream
	msgs := make(chan *pb.Message, 16)
	for range 4 {
		streams = append(streams, subscribe(t, tb.client, "q", msgs))
	}
	waitConsumers(t, tb.client, "q", 4)
	observer := zktest.Conn(t)

	proxy.Cut()
	waitHealth(t, tb, healthpb.HealthCheckResponse_NOT_SERVING, 10*time.Second)
	for _, s := range streams[1:] {
		s.cancel()
	}
	// The broker has ended the three streams (their unregistration failed).
	zktest.WaitFor(t, 20*time.Second, "three streams ended on the broker", func() bool {
		return metric(t, reg, "qbroker_consumers", map[string]string{"queue": "q"}) == 1
	})
	// The outage lasts a few more seconds: the ZooKeeper client fails the
	// requests queued meanwhile (the registrations' deletes) at each of
	// its reconnect attempts, about one a second.
	time.Sleep(3 * time.Second)
	proxy.Restore()
	waitHealth(t, tb, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	waitConsumers(t, tb.client, "q", 1)
	zktest.WaitFor(t, 30*time.Second, "one registration left in ZooKeeper", func() bool {
		return len(consumersOf(t, observer, root, "q")) == 1
	})
	delivers(t, tb.client, "q", "after the cut", msgs)
}

// A session expiry (a partition longer than the session timeout) deletes
// the broker's ephemeral nodes: once ZooKeeper is back, brokers/<id> and
// the registrations of the streams still open exist again, owned by the
// new session, and Stats counts them. The queue did not change, so the
// broker keeps its one handle of it (the streams' and later calls').
func TestRegistrationsRecreatedAfterSessionExpiry(t *testing.T) {
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	root := zktest.Root(t)
	tb := startBroker(t, []string{proxy.Addr()}, root, func(c *broker.Config) { c.SessionTimeout = 2 * time.Second })
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: "q"})
	var streams []*openStream
	msgs := make(chan *pb.Message, 16)
	for range 3 {
		streams = append(streams, subscribe(t, tb.client, "q", msgs))
	}
	waitConsumers(t, tb.client, "q", 3)
	before, err := tb.b.QueueHandle(context.Background(), "q")
	if err != nil {
		t.Fatal(err)
	}
	observer := zktest.Conn(t)
	brokerNode := root + "/brokers/" + tb.b.ID()
	old := zktest.Owner(observer, brokerNode)
	if old == 0 {
		t.Fatal("broker not registered")
	}
	for name, o := range consumersOf(t, observer, root, "q") {
		if o != old {
			t.Fatalf("registration %s owned by 0x%x, the broker's session is 0x%x", name, o, old)
		}
	}

	proxy.Cut()
	zktest.WaitFor(t, 30*time.Second, "the session expired on the server", func() bool {
		return zktest.Owner(observer, brokerNode) == 0 && len(consumersOf(t, observer, root, "q")) == 0
	})
	proxy.Restore()
	waitHealth(t, tb, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	var now int64
	zktest.WaitFor(t, 30*time.Second, "brokers/<id> registered by the new session", func() bool {
		now = zktest.Owner(observer, brokerNode)
		return now != 0 && now != old
	})
	// Streams the expiry ended (if any) are not counted; the others are,
	// under the new session.
	open := 0
	for _, s := range streams {
		select {
		case err := <-s.ended:
			t.Logf("a stream ended with the session: %v", err)
		default:
			open++
		}
	}
	zktest.WaitFor(t, 30*time.Second, "the open streams registered by the new session", func() bool {
		cs := consumersOf(t, observer, root, "q")
		for _, o := range cs {
			if o != now {
				return false
			}
		}
		return len(cs) == open
	})
	waitConsumers(t, tb.client, "q", uint64(open))
	if open == 0 {
		t.Fatal("no stream survived the session expiry")
	}
	delivers(t, tb.client, "q", "after the expiry", msgs)
	if after, err := tb.b.QueueHandle(context.Background(), "q"); err != nil || after != before {
		t.Errorf("after the expiry the broker uses another handle of q (%v): its streams and its calls no longer share one", err)
	}
}

// A broker restarted with the same id while its previous process's
// session is still alive (not expired yet) takes its registration over:
// brokers/<id> is owned by the new session and survives the old one's end;
// the old process's consumer registrations are not counted and are
// removed.
func TestRestartedBrokerTakesOverItsRegistration(t *testing.T) {
	root := zktest.Root(t)
	const id = "restarted-1"
	// The previous process's session and its nodes.
	prev := zktest.Conn(t)
	if err := zkutil.EnsurePath(prev, root+"/brokers", nil); err != nil {
		t.Fatal(err)
	}
	brokerNode := root + "/brokers/" + id
	if _, err := prev.Create(brokerNode, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	tb := newBroker(t, root, func(c *broker.Config) { c.ID = id })
	observer := zktest.Conn(t)
	if o := zktest.Owner(observer, brokerNode); o == 0 || o == prev.SessionID() {
		t.Fatalf("brokers/%s owned by 0x%x, the previous session is 0x%x", id, o, prev.SessionID())
	}
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: "q"})
	for _, name := range []string{id + "~0123456789abcdef", id + "-0000000007"} {
		if _, err := prev.Create(root+"/queues/q/consumers/"+name, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	msgs := make(chan *pb.Message, 16)
	subscribe(t, tb.client, "q", msgs)
	waitConsumers(t, tb.client, "q", 1)
	zktest.WaitFor(t, 30*time.Second, "the previous process's registrations removed", func() bool {
		return len(consumersOf(t, observer, root, "q")) == 1
	})
	prev.Close() // the previous session ends
	zktest.WaitFor(t, 10*time.Second, "the previous session gone", func() bool {
		_, err := observer.Sync(root)
		return err == nil
	})
	if o := zktest.Owner(observer, brokerNode); o == 0 {
		t.Fatalf("brokers/%s vanished with the previous session", id)
	}
	delivers(t, tb.client, "q", "m", msgs)
}

// A broker names the messages it publishes with its publisher tag while it
// consumes their queue (so that the other brokers leave them to it: it
// remembers their data), and without one before: a broker that does not
// consume a queue remembers nothing of what it publishes.
func TestPublisherTag(t *testing.T) {
	const id = "tag-test-broker"
	tb := newBroker(t, zktest.Root(t), func(c *broker.Config) { c.ID = id })
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: "tagged"})
	publish := func(payload string) string {
		t.Helper()
		r, err := tb.client.Publish(context.Background(), &pb.PublishRequest{Queue: "tagged", Messages: []*pb.OutMessage{{Payload: []byte(payload)}}})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetIds()[0]
	}
	tagOf := func(msgID string) string {
		t.Helper()
		n, ok := zkqueue.ParseName(msgID)
		if !ok {
			t.Fatalf("message id %q does not parse", msgID)
		}
		return n.Tag
	}
	if before := publish("before"); tagOf(before) != "" {
		t.Fatalf("published %s with no consumer: want no tag", before)
	}
	msgs := make(chan *pb.Message, 1)
	subscribe(t, tb.client, "tagged", msgs)
	select {
	case m := <-msgs:
		if string(m.GetPayload()) != "before" {
			t.Fatalf("got %q, want before", m.GetPayload())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery within 30s")
	}
	if after := publish("after"); tagOf(after) != zkqueue.PublisherTag(id) {
		t.Fatalf("published %s while consuming: want tag %s", after, zkqueue.PublisherTag(id))
	}
}
