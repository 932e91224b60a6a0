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

// Invoke runs a Queue method in process; a method it does not serve, or
// a request of the wrong type, is refused.
func TestInvoke(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	if _, err := b.b.Invoke(ctx, pb.Queue_CreateQueue_FullMethodName, &pb.CreateQueueRequest{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	resp, err := b.b.Invoke(ctx, pb.Queue_Publish_FullMethodName, &pb.PublishRequest{Queue: "q",
		Messages: []*pb.OutMessage{{Payload: []byte("a")}}})
	if err != nil || len(resp.(*pb.PublishResponse).GetIds()) != 1 {
		t.Fatalf("Publish: %v, %v", resp, err)
	}
	st, err := b.client.Stats(ctx, &pb.StatsRequest{Name: "q"})
	if err != nil || st.GetReady() != 1 {
		t.Fatalf("Stats over gRPC: %v, %v; want 1 ready", st, err)
	}
	if _, err := b.b.Invoke(ctx, pb.Queue_Publish_FullMethodName, &pb.PublishRequest{Queue: "bad/name"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad name: %v, want InvalidArgument", err)
	}
	if _, err := b.b.Invoke(ctx, pb.Queue_Purge_FullMethodName, &pb.StatsRequest{Name: "q"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("wrong request type: %v, want InvalidArgument", err)
	}
	if _, err := b.b.Invoke(ctx, pb.Queue_Consume_FullMethodName, &pb.ConsumeRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("a stream: %v, want Unimplemented", err)
	}
	if st, _ := b.client.Stats(ctx, &pb.StatsRequest{Name: "q"}); st.GetReady() != 1 {
		t.Fatalf("ready %d after the refused calls, want 1", st.GetReady())
	}
}

// Members lists every live broker and marks one leader.
func TestMembers(t *testing.T) {
	root := zktest.Root(t)
	b1, b2 := newBroker(t, root), newBroker(t, root)
	zktest.WaitFor(t, 30*time.Second, "both brokers, one leader", func() bool {
		ms, err := b2.b.Members(context.Background())
		if err != nil || len(ms) != 2 {
			return false
		}
		leaders, ids := 0, map[string]bool{}
		for _, m := range ms {
			ids[m.ID] = true
			if m.Leader {
				leaders++
			}
			if m.Since.IsZero() {
				t.Fatalf("member %s without its registration time", m.ID)
			}
		}
		return leaders == 1 && ids[b1.b.ID()] && ids[b2.b.ID()]
	})
	b1.stop()
	zktest.WaitFor(t, 30*time.Second, "the second broker alone, leading", func() bool {
		ms, err := b2.b.Members(context.Background())
		return err == nil && len(ms) == 1 && ms[0].ID == b2.b.ID() && ms[0].Leader
	})
}
