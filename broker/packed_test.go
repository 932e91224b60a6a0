package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
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
