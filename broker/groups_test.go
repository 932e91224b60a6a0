package broker_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

func publishGroup(t *testing.T, c pb.QueueClient, queue, group, payload string) {
	t.Helper()
	_, err := c.Publish(context.Background(), &pb.PublishRequest{Queue: queue,
		Messages: []*pb.OutMessage{{Payload: []byte(payload), Group: group}}})
	if err != nil {
		t.Fatalf("publish %s: %v", payload, err)
	}
}

func receivePayloads(ms []*pb.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m.GetPayload()))
	}
	sort.Strings(out)
	return out
}

// Three groups interleaved with plain messages, published through two
// brokers and consumed through both by two consumers each, at least once
// and at most once: every group arrives in publish order, and at least
// once a group's next message is received only after the previous one's
// ack began.
func TestGroupsAcrossBrokers(t *testing.T) {
	root := zktest.Root(t)
	brokers := []*testBroker{newBroker(t, root), newBroker(t, root)}
	for _, mode := range []pb.DeliveryMode{alo, pb.DeliveryMode_DELIVERY_MODE_AT_MOST_ONCE} {
		t.Run(mode.String(), func(t *testing.T) {
			queue := strings.ToLower(strings.TrimPrefix(mode.String(), "DELIVERY_MODE_"))
			queue = strings.ReplaceAll(queue, "_", "-")
			createQueue(t, brokers[0].client, &pb.CreateQueueRequest{Name: queue})
			groupsAcrossBrokers(t, brokers, queue, mode)
		})
	}
}

func groupsAcrossBrokers(t *testing.T, brokers []*testBroker, queue string, mode pb.DeliveryMode) {
	const perGroup = 6
	groups := []string{"a", "b", "c"}
	for i := range perGroup {
		for j, g := range groups {
			publishGroup(t, brokers[(i+j)%2].client, queue, g, fmt.Sprintf("%s/%d", g, i))
		}
		publishGroup(t, brokers[i%2].client, queue, "", fmt.Sprintf("plain/%d", i))
	}
	type event struct {
		payload, group string
		consumer       int
		received       time.Time
		ackBegins      time.Time
	}
	var mu sync.Mutex
	var events []*event
	total := int64(perGroup * (len(groups) + 1))
	var done atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for bi, b := range brokers {
		for ci := range 2 {
			consumer := 2*bi + ci
			wg.Add(1)
			go func() {
				defer wg.Done()
				for done.Load() < total && ctx.Err() == nil {
					resp, err := b.client.Receive(ctx, &pb.ReceiveRequest{Queue: queue, MaxMessages: 3, Mode: mode,
						Wait: durationpb.New(500 * time.Millisecond), VisibilityTimeout: durationpb.New(time.Minute)})
					if err != nil {
						t.Error(err)
						return
					}
					now := time.Now()
					for _, m := range resp.GetMessages() {
						e := &event{payload: string(m.GetPayload()), group: m.GetGroup(), consumer: consumer, received: now}
						mu.Lock()
						events = append(events, e)
						e.ackBegins = time.Now()
						mu.Unlock()
						if mode == alo {
							if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()}); err != nil {
								t.Error(err)
								return
							}
						}
						done.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if int64(len(events)) != total {
		t.Fatalf("%d deliveries, want %d", len(events), total)
	}
	byGroup := map[string][]*event{}
	for _, e := range events {
		g, _, _ := strings.Cut(e.payload, "/")
		if g != "plain" && e.group != g {
			t.Errorf("%s delivered with group %q", e.payload, e.group)
		}
		byGroup[g] = append(byGroup[g], e)
	}
	for _, g := range groups {
		evs := byGroup[g]
		sort.SliceStable(evs, func(i, j int) bool { return evs[i].received.Before(evs[j].received) })
		if mode != alo {
			// At most once a group's messages are claimed in publish
			// order, each after the previous one's delete, but those
			// handed to different consumers travel concurrently: each
			// consumer sees its share in order, and every message once.
			last := map[int]int{}
			for _, e := range evs {
				var i int
				if _, err := fmt.Sscanf(e.payload, g+"/%d", &i); err != nil {
					t.Errorf("group %s: payload %q", g, e.payload)
					continue
				}
				if prev, ok := last[e.consumer]; ok && i <= prev {
					t.Errorf("group %s: consumer %d got %s after %s/%d", g, e.consumer, e.payload, g, prev)
				}
				last[e.consumer] = i
			}
			if len(evs) != perGroup {
				t.Errorf("group %s: %d deliveries, want %d", g, len(evs), perGroup)
			}
			continue
		}
		for i, e := range evs {
			if want := fmt.Sprintf("%s/%d", g, i); e.payload != want {
				t.Errorf("group %s delivery %d: %s, want %s", g, i, e.payload, want)
			}
			if i > 0 && !e.received.After(evs[i-1].ackBegins) {
				t.Errorf("group %s: %s received before the ack of %s began", g, e.payload, evs[i-1].payload)
			}
		}
	}
	if n := len(byGroup["plain"]); n != perGroup {
		t.Errorf("%d plain messages, want %d", n, perGroup)
	}
}

// A nacked group head is redelivered first, through either broker, while
// the other group proceeds; a head whose lease expires (released by the
// leader's sweep) too. Bad group keys are refused, and groups in a sync
// queue.
func TestGroupHeadNackAndExpiry(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	a, b := newBroker(t, root), newBroker(t, root)
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "q"})
	for _, p := range []string{"a1", "b1", "a2", "b2"} {
		publishGroup(t, a.client, "q", p[:1], p)
	}
	recv := func(c pb.QueueClient, vt time.Duration) []*pb.Message {
		return receive(t, c, &pb.ReceiveRequest{Queue: "q", MaxMessages: 10, Mode: alo, VisibilityTimeout: durationpb.New(vt)})
	}
	ms := recv(a.client, time.Minute)
	if got := receivePayloads(ms); fmt.Sprint(got) != "[a1 b1]" {
		t.Fatalf("first receive: %v, want a1 b1", got)
	}
	if got := receivePayloads(recv(b.client, time.Minute)); len(got) != 0 {
		t.Fatalf("receive while both groups are in flight: %v", got)
	}
	for _, m := range ms {
		var err error
		if string(m.GetPayload()) == "a1" {
			_, err = b.client.Nack(ctx, &pb.NackRequest{AckToken: m.GetAckToken()})
		} else {
			_, err = b.client.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	var got []*pb.Message
	zktest.WaitFor(t, 30*time.Second, "a1 again and b2", func() bool {
		got = append(got, recv(b.client, 2*time.Second)...)
		return len(got) >= 2
	})
	if p := receivePayloads(got); fmt.Sprint(p) != "[a1 b2]" {
		t.Fatalf("after nack a1, ack b1: %v, want a1 b2", p)
	}
	for _, m := range got {
		if string(m.GetPayload()) == "a1" && m.GetDeliveryCount() != 2 {
			t.Errorf("a1 delivered %d times, want 2", m.GetDeliveryCount())
		}
		if string(m.GetPayload()) == "b2" {
			if _, err := a.client.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// a1's lease (2s) runs out unacked: the leader's sweep puts it back,
	// and it comes before a2.
	var again []*pb.Message
	zktest.WaitFor(t, 60*time.Second, "a1 after its lease expired", func() bool {
		again = append(again, recv(a.client, time.Minute)...)
		return len(again) > 0
	})
	if p := receivePayloads(again); fmt.Sprint(p) != "[a1]" || again[0].GetDeliveryCount() != 3 {
		t.Fatalf("after the expiry: %v (delivery %d), want a1 (3)", p, again[0].GetDeliveryCount())
	}
	if _, err := a.client.Ack(ctx, &pb.AckRequest{AckToken: again[0].GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	var last []*pb.Message
	zktest.WaitFor(t, 30*time.Second, "a2", func() bool {
		last = append(last, recv(b.client, time.Minute)...)
		return len(last) > 0
	})
	if p := receivePayloads(last); fmt.Sprint(p) != "[a2]" || last[0].GetGroup() != "a" {
		t.Fatalf("last: %v, want a2 of group a", p)
	}

	for _, g := range []string{"a/b", "..", strings.Repeat("x", 129), "é"} {
		_, err := a.client.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("x"), Group: g}}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("group %.10q: %v, want InvalidArgument", g, err)
		}
	}
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "s", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 2})
	_, err := a.client.Publish(ctx, &pb.PublishRequest{Queue: "s", Messages: []*pb.OutMessage{{Payload: []byte("x"), Group: "a"}}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("group in a sync queue: %v, want FailedPrecondition", err)
	}
}

// Groups do not mix with delays (a delayed message joins the queue outside
// its group's order) nor with a message TTL (an expired message would
// leave its group entry behind): both are refused, and nothing is
// published.
func TestGroupsRefuseDelayAndTTL(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "plain"})
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "ttl", MessageTtl: durationpb.New(time.Minute)})
	for _, tc := range []struct {
		queue string
		msg   *pb.OutMessage
		code  codes.Code
	}{
		{"plain", &pb.OutMessage{Payload: []byte("x"), Group: "g", Delay: durationpb.New(time.Second)}, codes.InvalidArgument},
		{"ttl", &pb.OutMessage{Payload: []byte("x"), Group: "g"}, codes.FailedPrecondition},
	} {
		_, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: tc.queue, Messages: []*pb.OutMessage{tc.msg}})
		if status.Code(err) != tc.code {
			t.Errorf("publish to %s: %v, want %v", tc.queue, err, tc.code)
		}
		if st := stats(t, b.client, tc.queue); st.GetReady() != 0 || st.GetDelayed() != 0 {
			t.Errorf("%s after a refused publish: %d ready, %d delayed", tc.queue, st.GetReady(), st.GetDelayed())
		}
	}
}
