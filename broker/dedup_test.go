package broker_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
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

// publishMsg publishes m to queue and returns the answer.
func publishMsg(t *testing.T, c pb.QueueClient, queue string, m *pb.OutMessage) *pb.PublishResponse {
	t.Helper()
	resp, err := c.Publish(context.Background(), &pb.PublishRequest{Queue: queue, Messages: []*pb.OutMessage{m}})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	return resp
}

// A message with a dedup id and a delay (or deliver_at) is delayed: its
// answer is a delayed id, it is not deliverable before due, and its
// repeats, on either broker, before and after it joined the queue, are
// answered with that id and publish nothing.
func TestDedupDelayed(t *testing.T) {
	root := zktest.Root(t)
	a, b := newBroker(t, root), newBroker(t, root)
	for _, tc := range []struct {
		name string
		due  func(m *pb.OutMessage, d time.Duration)
	}{
		{"delay", func(m *pb.OutMessage, d time.Duration) { m.Delay = durationpb.New(d) }},
		{"deliver_at", func(m *pb.OutMessage, d time.Duration) { m.DeliverAt = timestamppb.New(time.Now().Add(d)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := "q-" + strings.ReplaceAll(tc.name, "_", "-")
			createQueue(t, a.client, &pb.CreateQueueRequest{Name: q})
			const delay = 3 * time.Second
			msg := func() *pb.OutMessage {
				m := &pb.OutMessage{Payload: []byte("later"), DedupId: "job-1"}
				tc.due(m, delay)
				return m
			}
			published := time.Now()
			first := publishMsg(t, a.client, q, msg())
			id := first.GetIds()[0]
			if !zkqueue.IsDelayedID(id) || !slices.Equal(first.GetDuplicates(), []bool{false}) {
				t.Fatalf("first publish answered %v %v, want a delayed id, not a duplicate", first.GetIds(), first.GetDuplicates())
			}
			again := publishMsg(t, b.client, q, msg())
			ms := receive(t, a.client, &pb.ReceiveRequest{Queue: q})
			st := stats(t, a.client, q)
			if time.Since(published) < delay {
				if len(ms) != 0 {
					t.Fatalf("received %q before it was due", ms[0].GetPayload())
				}
				if st.GetDelayed() != 1 || st.GetReady() != 0 {
					t.Fatalf("before due: delayed %d ready %d, want 1 and 0", st.GetDelayed(), st.GetReady())
				}
			}
			if again.GetIds()[0] != id || !again.GetDuplicates()[0] {
				t.Fatalf("repeat on the other broker before due: %v %v, want %s [true]", again.GetIds(), again.GetDuplicates(), id)
			}
			m := receiveWait(t, a.client, q)
			if time.Since(published) < delay || string(m.GetPayload()) != "later" {
				t.Fatalf("delivered %q %v after publish, want %q after %v", m.GetPayload(), time.Since(published), "later", delay)
			}
			// Moved and delivered: a repeat on either broker is still
			// answered with the delayed id.
			for _, c := range []pb.QueueClient{a.client, b.client} {
				again := publishMsg(t, c, q, msg())
				if again.GetIds()[0] != id || !again.GetDuplicates()[0] {
					t.Fatalf("repeat after delivery: %v %v, want %s [true]", again.GetIds(), again.GetDuplicates(), id)
				}
			}
			if st := stats(t, a.client, q); st.GetDelayed() != 0 || st.GetReady() != 0 {
				t.Fatalf("after the repeats: delayed %d ready %d, want 0 and 0", st.GetDelayed(), st.GetReady())
			}
		})
	}
}

// The dedup record of a delayed message lives until the message is due
// plus the window, not just a window or two from its publish: a retry late
// in a delay longer than the window is still a repeat.
func TestDedupDelayedOutlivesWindow(t *testing.T) {
	root := zktest.Root(t)
	a := newBroker(t, root)
	const window, delay = time.Second, 8 * time.Second
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "q", DedupWindow: durationpb.New(window)})
	msg := func() *pb.OutMessage {
		return &pb.OutMessage{Payload: []byte("later"), DedupId: "job-1", Delay: durationpb.New(delay)}
	}
	published := time.Now()
	id := publishMsg(t, a.client, "q", msg()).GetIds()[0]
	// The records a message ready at once would have (its publish's
	// bucket and the next) are deleted by the leader once past.
	b := time.Now().UnixNano() / int64(window)
	conn := zktest.Conn(t)
	zktest.WaitFor(t, 30*time.Second, "the buckets of the publish's two windows deleted", func() bool {
		children, _, err := conn.Children(root + "/queues/q/dedup")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range children {
			if k, err := strconv.ParseInt(c, 10, 64); err == nil && k <= b+1 {
				return false
			}
		}
		return true
	})
	again := publishMsg(t, a.client, "q", msg())
	if time.Since(published) >= delay+window {
		t.Skip("the machine is too slow to repeat the publish before the message is due")
	}
	if again.GetIds()[0] != id || !again.GetDuplicates()[0] {
		t.Fatalf("repeat %v after publish: %v %v, want %s [true]", time.Since(published), again.GetIds(), again.GetDuplicates(), id)
	}
	if st := stats(t, a.client, "q"); st.GetDelayed()+st.GetReady() != 1 {
		t.Fatalf("delayed %d ready %d, want one message", st.GetDelayed(), st.GetReady())
	}
}
