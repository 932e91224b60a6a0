package broker_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

func publishDedup(t *testing.T, c pb.QueueClient, queue string, ids ...string) *pb.PublishResponse {
	t.Helper()
	req := &pb.PublishRequest{Queue: queue}
	for _, id := range ids {
		req.Messages = append(req.Messages, &pb.OutMessage{Payload: []byte("p-" + id), DedupId: id})
	}
	resp, err := c.Publish(context.Background(), req)
	if err != nil {
		t.Fatalf("Publish %v: %v", ids, err)
	}
	return resp
}

// A dedup id published on broker A, then on broker B: one message, and B
// answers with A's id. A batch with one repeat publishes the others.
func TestDedupAcrossBrokers(t *testing.T) {
	root := zktest.Root(t)
	a, b := newBroker(t, root), newBroker(t, root)
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "q"})
	first := publishDedup(t, a.client, "q", "order-1")
	if !slices.Equal(first.GetDuplicates(), []bool{false}) {
		t.Fatalf("first publish: duplicates %v", first.GetDuplicates())
	}
	again := publishDedup(t, b.client, "q", "order-1")
	if again.GetIds()[0] != first.GetIds()[0] || !slices.Equal(again.GetDuplicates(), []bool{true}) {
		t.Fatalf("repeat on B: %v %v, want %s [true]", again.GetIds(), again.GetDuplicates(), first.GetIds()[0])
	}
	batch := publishDedup(t, b.client, "q", "order-2", "order-1", "order-3")
	if !slices.Equal(batch.GetDuplicates(), []bool{false, true, false}) || batch.GetIds()[1] != first.GetIds()[0] {
		t.Fatalf("batch: %v %v", batch.GetIds(), batch.GetDuplicates())
	}
	// A publish without dedup ids reports no flags.
	if resp, err := a.client.Publish(context.Background(), &pb.PublishRequest{Queue: "q",
		Messages: []*pb.OutMessage{{Payload: []byte("plain")}}}); err != nil || len(resp.GetDuplicates()) != 0 {
		t.Fatalf("plain publish: %v, %v", resp, err)
	}
	if st := stats(t, a.client, "q"); st.GetReady() != 4 {
		t.Fatalf("ready %d, want 4", st.GetReady())
	}
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", MaxMessages: 10})
	var got []string
	for _, m := range ms {
		got = append(got, string(m.GetPayload()))
	}
	if want := []string{"p-order-1", "p-order-2", "p-order-3", "plain"}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
}

// A queue's window is configurable and reported; past it an id is
// accepted again, and the leader deletes the buckets of past windows.
// Bad windows and ids are refused.
func TestDedupWindow(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	a := newBroker(t, root)
	info, err := a.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "w", DedupWindow: durationpb.New(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if got := info.GetDedupWindow().AsDuration(); got != time.Second {
		t.Fatalf("dedup window %v, want 1s", got)
	}
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "d"})
	if info, err := a.client.GetQueue(ctx, &pb.GetQueueRequest{Name: "d"}); err != nil || info.GetDedupWindow().AsDuration() != 5*time.Minute {
		t.Fatalf("default window: %v, %v", info.GetDedupWindow(), err)
	}
	for _, w := range []time.Duration{time.Millisecond, 2 * time.Hour, -time.Second} {
		_, err := a.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "bad", DedupWindow: durationpb.New(w)})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("window %v: %v, want InvalidArgument", w, err)
		}
	}
	for _, id := range []string{"a/b", "..", string(make([]byte, 129)), "é"} {
		_, err := a.client.Publish(ctx, &pb.PublishRequest{Queue: "w", Messages: []*pb.OutMessage{{Payload: []byte("x"), DedupId: id}}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("dedup id %.10q: %v, want InvalidArgument", id, err)
		}
	}
	first := publishDedup(t, a.client, "w", "k").GetIds()[0]
	zktest.WaitFor(t, 30*time.Second, "the id accepted again", func() bool {
		resp := publishDedup(t, a.client, "w", "k")
		if resp.GetDuplicates()[0] && resp.GetIds()[0] != first {
			t.Fatalf("repeat answered %s, want %s", resp.GetIds()[0], first)
		}
		return !resp.GetDuplicates()[0]
	})
	if st := stats(t, a.client, "w"); st.GetReady() != 2 {
		t.Fatalf("ready %d, want 2", st.GetReady())
	}
	conn := zktest.Conn(t)
	dir := root + "/queues/w/dedup"
	zktest.WaitFor(t, 60*time.Second, "the leader deleting past buckets", func() bool {
		children, _, err := conn.Children(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range children {
			// Both publishes' buckets end up deleted: no bucket
			// holds a record once no publish can use it.
			if n, _, err := conn.Children(dir + "/" + c); err == nil && len(n) > 0 {
				return false
			}
		}
		return true
	})
}
