package broker_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

// The fencing tokens of one message's deliveries strictly increase across
// redeliveries (nack, lease expiry, a stream's end), across two brokers
// and across a broker restart; at-most-once deliveries carry none.
func TestFencingTokensAcrossBrokersAndRestart(t *testing.T) {
	root := zktest.Root(t)
	a := newBroker(t, root)
	b := newBroker(t, root)
	ctx := context.Background()
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "q", VisibilityTimeout: durationpb.New(time.Minute)})
	if _, err := a.client.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("x")}}}); err != nil {
		t.Fatal(err)
	}
	var last uint64
	get := func(c pb.QueueClient, vis time.Duration, after string) *pb.Message {
		t.Helper()
		var m *pb.Message
		waitFor(t, "the message after "+after, 30*time.Second, func() bool {
			ms := receive(t, c, &pb.ReceiveRequest{Queue: "q", Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE,
				VisibilityTimeout: durationpb.New(vis), Wait: durationpb.New(time.Second)})
			if len(ms) == 1 {
				m = ms[0]
			}
			return m != nil
		})
		if tok := m.GetFencingToken(); tok <= last {
			t.Fatalf("after %s: fencing token %d, want more than the previous delivery's %d", after, tok, last)
		}
		t.Logf("after %s: delivery %d, token %#x", after, m.GetDeliveryCount(), m.GetFencingToken())
		last = m.GetFencingToken()
		return m
	}
	nack := func(c pb.QueueClient, m *pb.Message) {
		t.Helper()
		if _, err := c.Nack(ctx, &pb.NackRequest{AckToken: m.GetAckToken()}); err != nil {
			t.Fatal(err)
		}
	}

	m := get(a.client, time.Minute, "the publish, on broker A")
	nack(a.client, m)
	m = get(b.client, time.Minute, "a nack, on broker B")
	nack(a.client, m)
	get(a.client, 200*time.Millisecond, "a nack on A of B's delivery, on broker A")
	m = get(b.client, time.Minute, "the lease's expiry, on broker B")

	// A restart of B (the leader or not): its successor on the same root
	// delivers with a greater token.
	nack(b.client, m)
	b.stop()
	c := newBroker(t, root)
	m = get(c.client, time.Minute, "a restart of broker B")

	// A Consume stream's end gives its lease back.
	nack(c.client, m)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stream, err := a.client.Consume(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "q", Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE}}); err != nil {
		t.Fatal(err)
	}
	d, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if tok := d.GetMessage().GetFencingToken(); tok <= last {
		t.Fatalf("on a Consume stream: token %d, want more than %d", tok, last)
	}
	last = d.GetMessage().GetFencingToken()
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	m = get(c.client, time.Minute, "a stream's end")
	if _, err := c.client.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()}); err != nil {
		t.Fatal(err)
	}

	// At most once: no token.
	if _, err := a.client.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("y")}}}); err != nil {
		t.Fatal(err)
	}
	ms := receive(t, a.client, &pb.ReceiveRequest{Queue: "q", Wait: durationpb.New(10 * time.Second)})
	if len(ms) != 1 || ms[0].GetFencingToken() != 0 {
		t.Fatalf("at most once: %v, want one message without a fencing token", ms)
	}
}
