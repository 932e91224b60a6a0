package broker_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

// A backlog of 1,000 messages of tenant a, then 10 of tenant b: with fair
// dispatch by the tenant header, b's messages are delivered among the
// first deliveries, interleaved with a's; without it, after all of a's.
func TestFairDispatchInterleavesKeys(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	for _, tc := range []struct {
		queue    string
		fairness *pb.Fairness
	}{
		{"fair", &pb.Fairness{Key: "header:tenant"}},
		{"plain", nil},
	} {
		t.Run(tc.queue, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			createQueue(t, b.client, &pb.CreateQueueRequest{Name: tc.queue, Fairness: tc.fairness})
			publishTenant(ctx, t, b.client, tc.queue, "a", 1000)
			publishTenant(ctx, t, b.client, tc.queue, "b", 10)
			var order []string // the tenants, in delivery order
			for len(order) < 1010 {
				// One message a call while b may still be ahead, so
				// the order is the dispatcher's, one take at a time.
				max := uint32(1)
				if len(order) >= 40 {
					max = 100
				}
				res, err := b.client.Receive(ctx, &pb.ReceiveRequest{Queue: tc.queue, MaxMessages: max})
				if err != nil {
					t.Fatalf("receive after %d: %v", len(order), err)
				}
				if len(res.GetMessages()) == 0 {
					t.Fatalf("queue empty after %d deliveries, want 1010", len(order))
				}
				for _, m := range res.GetMessages() {
					order = append(order, m.GetHeaders()["tenant"])
				}
			}
			lastB := strings.LastIndex(strings.Join(order, ""), "b")
			if tc.fairness != nil && lastB >= 20 {
				t.Fatalf("fair: last of b's 10 messages was delivery %d, want within the first 20: %s", lastB+1, strings.Join(order[:40], ""))
			}
			if tc.fairness == nil && strings.Index(strings.Join(order, ""), "b") < 1000 {
				t.Fatalf("plain: a b message before a's backlog was delivered, want queue order")
			}
		})
	}
}

func publishTenant(ctx context.Context, t *testing.T, c pb.QueueClient, queue, tenant string, n int) {
	t.Helper()
	for i := 0; i < n; {
		var batch []*pb.OutMessage
		for ; i < n && len(batch) < 250; i++ {
			batch = append(batch, &pb.OutMessage{Payload: []byte(fmt.Sprintf("%s/%d", tenant, i)),
				Headers: map[string]string{"tenant": tenant}})
		}
		if _, err := c.Publish(ctx, &pb.PublishRequest{Queue: queue, Messages: batch}); err != nil {
			t.Fatalf("publish %s: %v", tenant, err)
		}
	}
}

// A queue's fairness is stored with it and shown by GetQueue; bad
// fairness is refused with InvalidArgument naming the field, and creates
// nothing.
func TestFairnessConfig(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	want := &pb.Fairness{Key: "group", Weights: map[string]uint32{"gold": 5, "silver": 2}}
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "weighted", Fairness: want})
	info, err := b.client.GetQueue(ctx, &pb.GetQueueRequest{Name: "weighted"})
	if err != nil || info.GetFairness().GetKey() != "group" || !maps.Equal(info.GetFairness().GetWeights(), want.GetWeights()) {
		t.Fatalf("GetQueue: got %v, %v; want fairness %v", info.GetFairness(), err, want)
	}
	if info, err := b.client.GetQueue(ctx, &pb.GetQueueRequest{Name: "weighted"}); err != nil || info.Fairness == nil {
		t.Fatalf("GetQueue again: %v, %v", info, err)
	}
	tooMany := map[string]uint32{}
	for i := range 1001 {
		tooMany[fmt.Sprint("k", i)] = 1
	}
	for _, tc := range []struct {
		req  *pb.CreateQueueRequest
		want string
	}{
		{&pb.CreateQueueRequest{Name: "bad1", Fairness: &pb.Fairness{Key: "tenant"}}, "fairness.key"},
		{&pb.CreateQueueRequest{Name: "bad2", Fairness: &pb.Fairness{Key: "header:"}}, "fairness.key"},
		{&pb.CreateQueueRequest{Name: "bad3", Fairness: &pb.Fairness{Key: "group", Weights: map[string]uint32{"a": 0}}}, "fairness.weights"},
		{&pb.CreateQueueRequest{Name: "bad4", Fairness: &pb.Fairness{Key: "group", Weights: map[string]uint32{"a": 101}}}, "fairness.weights"},
		{&pb.CreateQueueRequest{Name: "bad5", Fairness: &pb.Fairness{Key: "group", Weights: tooMany}}, "fairness.weights"},
		{&pb.CreateQueueRequest{Name: "bad6", Fairness: &pb.Fairness{Weights: map[string]uint32{"a": 1}}}, "fairness.key"},
		{&pb.CreateQueueRequest{Name: "bad7", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 2, Fairness: &pb.Fairness{Key: "group"}}, "fairness"},
	} {
		_, err := b.client.CreateQueue(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("CreateQueue(%v): got %v, want InvalidArgument naming %s", tc.req.GetFairness(), err, tc.want)
		}
		if _, err := b.client.GetQueue(ctx, &pb.GetQueueRequest{Name: tc.req.GetName()}); status.Code(err) != codes.NotFound {
			t.Errorf("GetQueue(%s) after a refused create: got %v, want NotFound", tc.req.GetName(), err)
		}
	}
}
