package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// refused checks that err is ResourceExhausted with a message naming why.
func refused(t *testing.T, what string, err error, naming string) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), naming) {
		t.Fatalf("%s: got %v, want ResourceExhausted naming %q", what, err, naming)
	}
}

func publishOne(c pb.QueueClient, queue string, payload []byte) error {
	_, err := c.Publish(context.Background(), &pb.PublishRequest{Queue: queue, Messages: []*pb.OutMessage{{Payload: payload}}})
	return err
}

// A queue's max_depth refuses what would pass it, naming the quota, and
// writes nothing; consuming makes room. Without quotas there is no depth
// bound; the broker's --max-depth, when smaller, wins.
func TestQueueDepthQuota(t *testing.T) {
	root := zktest.Root(t)
	b := newBroker(t, root)
	ctx := context.Background()
	info, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "d", MaxDepth: 4})
	if err != nil || info.GetMaxDepth() != 4 || info.GetMaxBytes() != 0 {
		t.Fatalf("CreateQueue: %v, %v; want max_depth 4", info, err)
	}
	if _, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "d", MaxDepth: 5}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("the queue with another quota: got %v, want AlreadyExists", err)
	}
	publishN(t, b.client, "d", 3)
	two := &pb.PublishRequest{Queue: "d", Messages: []*pb.OutMessage{{Payload: []byte("a")}, {Payload: []byte("b")}}}
	_, err = b.client.Publish(ctx, two)
	refused(t, "a batch past max_depth", err, "max_depth")
	if st := stats(t, b.client, "d"); st.GetReady() != 3 {
		t.Fatalf("ready = %d after a refused batch, want 3", st.GetReady())
	}
	receive(t, b.client, &pb.ReceiveRequest{Queue: "d", MaxMessages: 2})
	zktest.WaitFor(t, 30*time.Second, "room after consuming", func() bool {
		_, err := b.client.Publish(ctx, two)
		return err == nil
	})

	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "free"})
	publishN(t, b.client, "free", 120)

	small := newBroker(t, root, func(c *broker.Config) { c.MaxDepth = 2 })
	refused(t, "past --max-depth", publishOne(small.client, "d", []byte("x")), "--max-depth")
	refused(t, "past --max-depth, queue without a quota", publishOne(small.client, "free", []byte("x")), "--max-depth")

	if _, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "huge", MaxDepth: 1 << 63}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a quota past 2^62: got %v, want InvalidArgument", err)
	}
}

// A queue's max_bytes counts the data it holds, ready or leased, from
// ZooKeeper's quota statistics; acked messages make room; deleting the
// queue removes the statistics.
func TestQueueBytesQuota(t *testing.T) {
	root := zktest.Root(t)
	b := newBroker(t, root)
	ctx := context.Background()
	info, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "b", MaxBytes: 2000})
	if err != nil || info.GetMaxBytes() != 2000 {
		t.Fatalf("CreateQueue: %v, %v; want max_bytes 2000", info, err)
	}
	if got, err := b.client.GetQueue(ctx, &pb.GetQueueRequest{Name: "b"}); err != nil || got.GetMaxBytes() != 2000 {
		t.Fatalf("GetQueue: %v, %v; want max_bytes 2000", got, err)
	}
	kb := make([]byte, 900)
	for range 2 {
		if err := publishOne(b.client, "b", kb); err != nil {
			t.Fatal(err)
		}
	}
	refused(t, "past max_bytes", publishOne(b.client, "b", kb), "max_bytes")
	// Leased, the messages still count.
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "b", MaxMessages: 2, Mode: alo})
	if len(ms) != 2 {
		t.Fatalf("received %d, want 2", len(ms))
	}
	refused(t, "past max_bytes, messages leased", publishOne(b.client, "b", kb), "max_bytes")
	for _, m := range ms {
		if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()}); err != nil {
			t.Fatal(err)
		}
	}
	zktest.WaitFor(t, 30*time.Second, "room after acking", func() bool {
		return publishOne(b.client, "b", kb) == nil
	})

	conn := zktest.Conn(t)
	quota := "/zookeeper/quota" + root + "/queues/b"
	if ok, _, err := conn.Exists(quota + "/zookeeper_stats"); err != nil || !ok {
		t.Fatalf("quota statistics of b: exists %v, %v", ok, err)
	}
	if _, err := b.client.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := conn.Exists(quota); err != nil || ok {
		t.Fatalf("quota statistics of a deleted queue: exists %v, %v", ok, err)
	}
}
