package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/zktest"
)

// A packed queue's option is stored with it: CreateQueue answers it,
// GetQueue and ListQueues show it, on another broker too, and creating the
// queue again without it is refused. Packed storage with a SYNC queue,
// fairness or a message TTL is refused with InvalidArgument naming both,
// and creates nothing.
func TestPackedQueueConfig(t *testing.T) {
	root := zktest.Root(t)
	b := newBroker(t, root)
	ctx := context.Background()
	for _, req := range []*pb.CreateQueueRequest{
		{Name: "packed-fifo", Packed: true},
		{Name: "packed-prio", Kind: pb.QueueKind_QUEUE_KIND_PRIORITY, Packed: true},
	} {
		info, err := b.client.CreateQueue(ctx, req)
		if err != nil || !info.GetPacked() {
			t.Fatalf("CreateQueue(%s): got packed %v, %v; want true", req.GetName(), info.GetPacked(), err)
		}
	}
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "plain"})

	other := newBroker(t, root) // reads the configuration from ZooKeeper
	for _, c := range []pb.QueueClient{b.client, other.client} {
		for name, want := range map[string]bool{"packed-fifo": true, "packed-prio": true, "plain": false} {
			info, err := c.GetQueue(ctx, &pb.GetQueueRequest{Name: name})
			if err != nil || info.GetPacked() != want {
				t.Errorf("GetQueue(%s): got packed %v, %v; want %v", name, info.GetPacked(), err, want)
			}
		}
	}
	list, err := other.client.ListQueues(ctx, &pb.ListQueuesRequest{Prefix: "packed-"})
	if err != nil || len(list.GetQueues()) != 2 || !list.GetQueues()[0].GetPacked() || !list.GetQueues()[1].GetPacked() {
		t.Errorf("ListQueues(packed-): got %v, %v; want both packed", list.GetQueues(), err)
	}
	// The same configuration again succeeds; another is refused.
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "packed-fifo", Packed: true})
	if _, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "packed-fifo"}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("CreateQueue(packed-fifo) unpacked: got %v, want AlreadyExists", err)
	}
	if _, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "plain", Packed: true}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("CreateQueue(plain) packed: got %v, want AlreadyExists", err)
	}

	for _, tc := range []struct {
		req  *pb.CreateQueueRequest
		want string
	}{
		{&pb.CreateQueueRequest{Name: "bad-sync", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 2, Packed: true}, "SYNC"},
		{&pb.CreateQueueRequest{Name: "bad-fair", Fairness: &pb.Fairness{Key: "header:tenant"}, Packed: true}, "fairness"},
		{&pb.CreateQueueRequest{Name: "bad-ttl", MessageTtl: durationpb.New(time.Hour), Packed: true}, "message_ttl"},
	} {
		_, err := b.client.CreateQueue(ctx, tc.req)
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, "packed") || !strings.Contains(msg, tc.want) {
			t.Errorf("CreateQueue(%s): got %v, want InvalidArgument naming packed and %s", tc.req.GetName(), err, tc.want)
		}
		if _, err := b.client.GetQueue(ctx, &pb.GetQueueRequest{Name: tc.req.GetName()}); status.Code(err) != codes.NotFound {
			t.Errorf("GetQueue(%s) after a refused create: got %v, want NotFound", tc.req.GetName(), err)
		}
	}
}

// A packed queue served by two brokers: batches published through one are
// stored as packs and consumed at least once through the other by a
// Consume stream; a nack in the middle of a pack redelivers that message
// alone (after what the broker holds claimed already); what the stream's broker claimed beyond the stream's credit goes
// back, never delivered, when the stream ends, and the other broker
// delivers it with its delivery count unchanged. Every message is acked
// exactly once, none is left ready or in flight.
func TestPackedQueueOverBrokers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := zktest.Root(t)
	a, b := newBroker(t, root), newBroker(t, root)
	ca, err := qbroker.Dial(ctx, a.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	cb, err := qbroker.Dial(ctx, b.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	const queue, batches, each = "packed-two", 3, 50
	if _, err := ca.CreateQueue(ctx, queue, qbroker.QueueOptions{Packed: true}); err != nil {
		t.Fatal(err)
	}
	for i := range batches {
		msgs := make([]qbroker.OutMessage, each)
		for j := range msgs {
			msgs[j].Payload = []byte(fmt.Sprintf("%03d", i*each+j))
		}
		ids, err := ca.PublishBatch(ctx, queue, msgs)
		if err != nil || len(ids) != each || !strings.Contains(ids[0], "#") {
			t.Fatalf("batch %d: ids %v, %v", i, ids, err)
		}
	}
	if s, err := ca.Stats(ctx, queue); err != nil || s.Ready != batches*each {
		t.Fatalf("stats: %+v, %v; want %d ready", s, err, batches*each)
	}
	acked := map[string]int{}
	deliveries := map[string]int{}
	var nacked string
	cons, err := cb.Consume(ctx, queue, qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce, Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	for len(acked) < 40 {
		m, ok := <-cons.Messages()
		if !ok {
			t.Fatalf("stream ended: %v", cons.Err())
		}
		p := string(m.Payload)
		deliveries[p]++
		if p == "007" && nacked == "" {
			nacked = m.ID
			if err := m.Nack(ctx, 0); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if p == "007" && m.DeliveryCount != 2 {
			t.Fatalf("%s redelivered with count %d, want 2", p, m.DeliveryCount)
		}
		if err := m.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		acked[p]++
	}
	if err := cons.Close(); err != nil {
		t.Fatal(err)
	}
	// The rest, on the other broker: none delivered before, bar what the
	// stream had sent and the test not read when it closed (released,
	// counted).
	unread := 0
	zktest.WaitFor(t, 30*time.Second, "the rest drained through the other broker", func() bool {
		ms, err := ca.Receive(ctx, queue, qbroker.ReceiveOptions{Max: 100, Mode: qbroker.AtLeastOnce})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			p := string(m.Payload)
			deliveries[p]++
			switch m.DeliveryCount - deliveries[p] {
			case 0:
			case 1: // sent on the stream, unread when it closed
				if unread++; unread > 10 {
					t.Fatalf("%d messages delivered on the stream unread, more than its prefetch", unread)
				}
			default:
				t.Fatalf("%s: delivery count %d, delivered %d times", p, m.DeliveryCount, deliveries[p])
			}
			if err := m.Ack(ctx); err != nil {
				t.Fatal(err)
			}
			acked[p]++
		}
		return len(acked) == batches*each
	})
	for p, n := range acked {
		if n != 1 {
			t.Fatalf("%s acked %d times", p, n)
		}
	}
	if deliveries["007"] != 2 {
		t.Fatalf("the nacked message was delivered %d times, want 2", deliveries["007"])
	}
	s, err := ca.Stats(ctx, queue)
	if err != nil || s.Ready != 0 || s.InFlight != 0 {
		t.Fatalf("after the drain: %+v, %v", s, err)
	}
}

// A packed single-active queue: the active stream's broker claims whole
// packs, but what it buffered goes back when the broker's last stream of
// the queue ends (a broker keeps the turn while it has a stream in line,
// which then takes from the buffer), so the next stream, on another
// broker, takes over at once, not once the buffered leases (30 s)
// expire.
func TestPackedSingleActiveHandover(t *testing.T) {
	root := zktest.Root(t)
	a, b := newBroker(t, root), newBroker(t, root)
	const queue = "packed-sac"
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: queue, SingleActiveConsumer: true, Packed: true,
		VisibilityTimeout: durationpb.New(30 * time.Second)})
	publishN(t, a.client, queue, 500) // a batch: packs of up to 100+
	first := openSAC(t, "first", a.client, queue, 0)
	zktest.WaitFor(t, 30*time.Second, "first receiving", func() bool { return first.count() >= 5 })
	standby := openSAC(t, "standby", b.client, queue, 0)
	zktest.WaitFor(t, 30*time.Second, "two consumers", func() bool {
		st, err := a.client.Stats(context.Background(), &pb.StatsRequest{Name: queue})
		return err == nil && st.GetConsumers() == 2
	})
	ended := time.Now()
	first.end(t)
	zktest.WaitFor(t, 20*time.Second, "the standby taking over", func() bool { return standby.count() > 0 })
	took := standby.firstAt().Sub(ended)
	t.Logf("takeover %v after the active stream ended (visibility timeout 30s)", took.Round(time.Millisecond))
	standby.end(t)
}
