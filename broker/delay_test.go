package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func publishDelayed(t *testing.T, c pb.QueueClient, queue, payload string, delay time.Duration) string {
	t.Helper()
	resp, err := c.Publish(context.Background(), &pb.PublishRequest{Queue: queue, Messages: []*pb.OutMessage{
		{Payload: []byte(payload), Delay: durationpb.New(delay)}}})
	if err != nil {
		t.Fatalf("Publish delayed: %v", err)
	}
	return resp.GetIds()[0]
}

// receiveWait receives one message, waiting up to 30s for it.
func receiveWait(t *testing.T, c pb.QueueClient, queue string) *pb.Message {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ms := receive(t, c, &pb.ReceiveRequest{Queue: queue, Wait: durationpb.New(5 * time.Second)})
		if len(ms) > 0 {
			return ms[0]
		}
	}
	t.Fatal("no message within 60s")
	return nil
}

// A delayed message is invisible (counted as delayed) until due, and
// delivered after.
func TestDelayedDeliveredWhenDue(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	const delay = 2 * time.Second
	published := time.Now()
	id := publishDelayed(t, b.client, "q", "later", delay)
	if id == "" {
		t.Fatal("no id")
	}
	if ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q"}); len(ms) != 0 && time.Since(published) < delay {
		t.Fatalf("received %q before it was due", ms[0].GetPayload())
	}
	if st := stats(t, b.client, "q"); time.Since(published) < delay && (st.GetDelayed() != 1 || st.GetReady() != 0) {
		t.Fatalf("before due: delayed %d ready %d, want 1 and 0", st.GetDelayed(), st.GetReady())
	}
	m := receiveWait(t, b.client, "q")
	if got := time.Since(published); got < delay {
		t.Fatalf("delivered %v after publish, before its delay of %v", got, delay)
	}
	if string(m.GetPayload()) != "later" {
		t.Fatalf("got %q, want %q", m.GetPayload(), "later")
	}
	if st := stats(t, b.client, "q"); st.GetDelayed() != 0 || st.GetReady() != 0 {
		t.Fatalf("after delivery: delayed %d ready %d, want 0 and 0", st.GetDelayed(), st.GetReady())
	}
}

// A delayed message survives the broker that took it: stopped before the
// message is due, another broker started later delivers it.
func TestDelayedSurvivesBrokerRestart(t *testing.T) {
	root := zktest.Root(t)
	a := newBroker(t, root)
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "q"})
	published := time.Now()
	publishDelayed(t, a.client, "q", "survivor", 3*time.Second)
	a.stop()
	if time.Since(published) >= 3*time.Second {
		t.Skip("the machine is too slow to stop the broker before the message is due")
	}
	b := newBroker(t, root)
	m := receiveWait(t, b.client, "q")
	if string(m.GetPayload()) != "survivor" {
		t.Fatalf("got %q, want %q", m.GetPayload(), "survivor")
	}
}

// Two brokers serving a queue both move its due messages: each is
// delivered exactly once.
func TestDelayedMoveRaceExactlyOnce(t *testing.T) {
	root := zktest.Root(t)
	a, b := newBroker(t, root), newBroker(t, root)
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "q"})
	// Both open the queue, so both run its scheduler.
	stats(t, a.client, "q")
	stats(t, b.client, "q")
	const n = 200
	due := timestamppb.New(time.Now().Add(2 * time.Second))
	for i := 0; i < n; i += 50 {
		req := &pb.PublishRequest{Queue: "q"}
		for j := i; j < i+50; j++ {
			req.Messages = append(req.Messages, &pb.OutMessage{Payload: []byte(fmt.Sprintf("m%03d", j)), DeliverAt: due})
		}
		c := a.client
		if i%100 != 0 {
			c = b.client
		}
		if _, err := c.Publish(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	waitFor(t, "every delayed message delivered", 60*time.Second, func() bool {
		for _, c := range []pb.QueueClient{a.client, b.client} {
			for _, m := range receive(t, c, &pb.ReceiveRequest{Queue: "q", MaxMessages: 100}) {
				seen[string(m.GetPayload())]++
			}
		}
		return len(seen) == n
	})
	for p, k := range seen {
		if k != 1 {
			t.Errorf("%s delivered %d times", p, k)
		}
	}
	st := stats(t, a.client, "q")
	if st.GetDelayed() != 0 || st.GetReady() != 0 {
		t.Fatalf("after delivery: delayed %d ready %d, want 0 and 0", st.GetDelayed(), st.GetReady())
	}
}

// A message published later with an earlier due time is delivered first.
func TestDelayedEarlierDueFirst(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	publishDelayed(t, b.client, "q", "late", 4*time.Second)
	publishDelayed(t, b.client, "q", "early", time.Second)
	for _, want := range []string{"early", "late"} {
		if m := receiveWait(t, b.client, "q"); string(m.GetPayload()) != want {
			t.Fatalf("got %q, want %q", m.GetPayload(), want)
		}
	}
}

// Bad delays are refused with InvalidArgument and publish nothing.
func TestDelayBadInput(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	cases := map[string]*pb.OutMessage{
		"negative":   {Payload: []byte("x"), Delay: durationpb.New(-time.Second)},
		"over max":   {Payload: []byte("x"), Delay: durationpb.New(16 * time.Minute)},
		"far future": {Payload: []byte("x"), DeliverAt: timestamppb.New(time.Now().Add(time.Hour))},
		"both": {Payload: []byte("x"), Delay: durationpb.New(time.Second),
			DeliverAt: timestamppb.New(time.Now().Add(time.Second))},
		"invalid": {Payload: []byte("x"), Delay: &durationpb.Duration{Seconds: 1, Nanos: -1}},
	}
	for name, m := range cases {
		// In a batch with a good message: the whole batch is refused.
		_, err := b.client.Publish(context.Background(), &pb.PublishRequest{Queue: "q",
			Messages: []*pb.OutMessage{{Payload: []byte("ok"), Delay: durationpb.New(time.Second)}, m}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
	if st := stats(t, b.client, "q"); st.GetDelayed() != 0 || st.GetReady() != 0 {
		t.Fatalf("refused publishes left delayed %d ready %d", st.GetDelayed(), st.GetReady())
	}
}

// Purge and DeleteQueue remove delayed messages; the depth quota counts
// them.
func TestDelayedPurgeDeleteQuota(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	b := newBroker(t, root)
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", MaxDepth: 2})
	publishDelayed(t, b.client, "q", "a", time.Minute)
	publishDelayed(t, b.client, "q", "b", time.Minute)
	_, err := b.client.Publish(context.Background(), &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("c")}}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("publish past max_depth with 2 delayed: got %v, want ResourceExhausted", err)
	}
	resp, err := b.client.Purge(context.Background(), &pb.PurgeRequest{Name: "q"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetPurged() != 2 {
		t.Fatalf("purged %d, want 2", resp.GetPurged())
	}
	if st := stats(t, b.client, "q"); st.GetDelayed() != 0 {
		t.Fatalf("delayed %d after purge, want 0", st.GetDelayed())
	}
	// The broker reads the depth at most every 100ms: publish again once
	// it saw the purge.
	waitFor(t, "a publish after the purge", 30*time.Second, func() bool {
		_, err := b.client.Publish(context.Background(), &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{
			{Payload: []byte("d"), Delay: durationpb.New(time.Minute)}}})
		return err == nil
	})
	if _, err := b.client.DeleteQueue(context.Background(), &pb.DeleteQueueRequest{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	if zktest.Exists(t, conn, root+"/queues/q") {
		t.Fatal("the queue survived its deletion")
	}
}

// A queue created before delayed delivery (no delayed parent) gets one at
// its first delayed publish.
func TestDelayedOnQueueWithoutParent(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	b := newBroker(t, root)
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	if err := conn.Delete(root+"/queues/q/delayed", -1); err != nil {
		t.Fatal(err)
	}
	publishDelayed(t, b.client, "q", "x", time.Second)
	if m := receiveWait(t, b.client, "q"); string(m.GetPayload()) != "x" {
		t.Fatalf("got %q, want x", m.GetPayload())
	}
}
