package broker_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

// A queue nobody consumes sheds its expired messages, and counts them.
func TestTTLExpiresWithoutConsumers(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", MessageTtl: durationpb.New(time.Second)})
	publishN(t, b.client, "q", 3)
	waitFor(t, "the messages to expire", 30*time.Second, func() bool {
		st := stats(t, b.client, "q")
		return st.GetReady() == 0 && st.GetExpired() == 3
	})
	if st := stats(t, b.client, "q"); st.GetDead() != 0 {
		t.Fatalf("dead %d, want 0 (dropped)", st.GetDead())
	}
	info, err := b.client.GetQueue(context.Background(), &pb.GetQueueRequest{Name: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetMessageTtl().AsDuration() != time.Second || info.GetExpireToDeadLetter() {
		t.Fatalf("queue info: ttl %v, to dead %v", info.GetMessageTtl().AsDuration(), info.GetExpireToDeadLetter())
	}
}

// Expired messages go to the dead letters; a redriven one gets a fresh
// TTL and is delivered.
func TestTTLExpireToDeadLetterThenRedrive(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	const ttl = 5 * time.Second
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", MessageTtl: durationpb.New(ttl), ExpireToDeadLetter: true})
	publishN(t, b.client, "q", 1)
	waitFor(t, "the message to expire into the dead letters", 60*time.Second, func() bool {
		st := stats(t, b.client, "q")
		return st.GetReady() == 0 && st.GetDead() == 1 && st.GetExpired() == 1
	})
	if _, err := b.client.Redrive(context.Background(), &pb.RedriveRequest{Queue: "q"}); err != nil {
		t.Fatal(err)
	}
	redriven := time.Now()
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q"})
	if time.Since(redriven) >= ttl {
		t.Skip("the machine is too slow to receive within the TTL")
	}
	if len(ms) != 1 || string(ms[0].GetPayload()) != "m00000" {
		t.Fatalf("after redrive got %v, want m00000", ms)
	}
}

// A message leased when its TTL passes keeps its lease (Ack succeeds); one
// that comes back after its TTL expires instead of being delivered again.
func TestTTLInFlight(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	const ttl = time.Second
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", MessageTtl: durationpb.New(ttl)})
	publishN(t, b.client, "q", 2)
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", Mode: alo, MaxMessages: 2, VisibilityTimeout: durationpb.New(time.Minute)})
	if len(ms) != 2 {
		t.Skip("the machine is too slow to claim the messages within their TTL")
	}
	published := ms[0].GetPublishedAt().AsTime()
	waitFor(t, "the TTL to pass", 30*time.Second, func() bool { return time.Since(published) > ttl })
	if _, err := b.client.Ack(context.Background(), &pb.AckRequest{AckToken: ms[0].GetAckToken()}); err != nil {
		t.Fatalf("Ack of a leased message past its TTL: %v", err)
	}
	if _, err := b.client.Nack(context.Background(), &pb.NackRequest{AckToken: ms[1].GetAckToken()}); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	waitFor(t, "the nacked message to expire", 30*time.Second, func() bool {
		if got := receive(t, b.client, &pb.ReceiveRequest{Queue: "q"}); len(got) > 0 {
			t.Fatalf("an expired message was delivered again: %q", got[0].GetPayload())
		}
		st := stats(t, b.client, "q")
		return st.GetReady() == 0 && st.GetInFlight() == 0 && st.GetExpired() == 1
	})
}

// The TTL's bounds are checked.
func TestTTLBadInput(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	for name, req := range map[string]*pb.CreateQueueRequest{
		"too short":        {Name: "q", MessageTtl: durationpb.New(time.Millisecond)},
		"too long":         {Name: "q", MessageTtl: durationpb.New(15 * 24 * time.Hour)},
		"negative":         {Name: "q", MessageTtl: durationpb.New(-time.Second)},
		"dead without ttl": {Name: "q", ExpireToDeadLetter: true},
	} {
		if _, err := b.client.CreateQueue(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
	if _, err := b.client.GetQueue(context.Background(), &pb.GetQueueRequest{Name: "q"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a refused create left a queue: %v", err)
	}
}
