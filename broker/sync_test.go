package broker_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

type member struct {
	stream pb.Queue_JoinSyncClient
	cancel context.CancelFunc
}

func join(t *testing.T, c pb.QueueClient, queue, id string) *member {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := c.JoinSync(ctx, &pb.JoinSyncRequest{Queue: queue, MemberId: id})
	if err != nil {
		t.Fatal(err)
	}
	return &member{stream: s, cancel: cancel}
}

// next returns the member's next event, failing the test on error.
func (m *member) next(t *testing.T) *pb.SyncEvent {
	t.Helper()
	ev, err := m.stream.Recv()
	if err != nil {
		t.Fatalf("JoinSync stream: %v", err)
	}
	return ev
}

func waitJoined(t *testing.T, c pb.QueueClient, queue string, want uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := stats(t, c, queue)
		if st.GetSyncJoined() == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sync_joined = %d, want %d", st.GetSyncJoined(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A synchronizing queue over gRPC: consumers get FailedPrecondition until
// the N-th JoinSync stream arrives; a stream closed before the group is
// complete frees its place. Members join through both brokers.
func TestSyncQueueOverGRPC(t *testing.T) {
	root := zktest.Root(t)
	a, b := newBroker(t, root), newBroker(t, root)
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "g", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 3})
	publishN(t, a.client, "g", 2) // publishing before the opening is allowed

	notOpen := func(when string) {
		t.Helper()
		if _, err := b.client.Receive(context.Background(), &pb.ReceiveRequest{Queue: "g"}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("%s: Receive got %v, want FailedPrecondition", when, err)
		}
		s, err := a.client.Consume(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "g"}})
		if _, err := s.Recv(); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("%s: Consume got %v, want FailedPrecondition", when, err)
		}
	}
	notOpen("no members")

	m1 := join(t, a.client, "g", "m1")
	if ev := m1.next(t); ev.GetState() != pb.SyncEvent_STATE_JOINED || ev.GetJoined() != 1 || ev.GetRequired() != 3 {
		t.Fatalf("m1 first event %v, want JOINED 1 of 3", ev)
	}
	m2 := join(t, b.client, "g", "m2")
	m2.next(t)
	waitJoined(t, a.client, "g", 2)
	// A duplicate id is refused.
	dup := join(t, a.client, "g", "m2")
	if _, err := dup.stream.Recv(); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("duplicate member: got %v, want AlreadyExists", err)
	}
	notOpen("2 of 3 members")

	// m2 leaves before the group is complete: its place is free again.
	m2.cancel()
	waitJoined(t, a.client, "g", 1)
	m3 := join(t, b.client, "g", "m3")
	m3.next(t)
	waitJoined(t, a.client, "g", 2)
	notOpen("2 of 3 members after a leave")

	m4 := join(t, a.client, "g", "m4")
	for _, m := range []*member{m4, m3, m1} {
		for {
			ev := m.next(t)
			if ev.GetState() == pb.SyncEvent_STATE_OPEN {
				if ev.GetRequired() != 3 {
					t.Fatalf("open event %v", ev)
				}
				break
			}
		}
	}
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "g", MaxMessages: 10})
	if len(ms) != 2 || string(ms[0].GetPayload()) != "m00000" {
		t.Fatalf("after opening got %v, want the 2 messages in order", ms)
	}
	// An opened group admits nobody.
	late := join(t, b.client, "g", "m5")
	if _, err := late.stream.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("join of an opened group: got %v, want FailedPrecondition", err)
	}
	// Members leaving after the opening do not close the queue.
	m1.cancel()
	m3.cancel()
	m4.cancel()
	waitJoined(t, a.client, "g", 0)
	if st := stats(t, a.client, "g"); !st.GetSyncOpen() {
		t.Fatalf("queue closed after members left: %v", st)
	}
	// JoinSync on a FIFO queue is the wrong kind.
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "f"})
	wrong := join(t, a.client, "f", "x")
	if _, err := wrong.stream.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("JoinSync on a FIFO queue: got %v, want FailedPrecondition", err)
	}
}
