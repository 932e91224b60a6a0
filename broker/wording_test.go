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

// A refusal says each thing once: the code's words, the field, the value
// and why, without a second "invalid argument" or a recipe's own prefix
// repeating what the broker said.
func TestInvalidArgumentSaidOnce(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"dedup window", func() error {
			_, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "w", DedupWindow: durationpb.New(2 * time.Hour)})
			return err
		}, "invalid argument: dedup_window 2h0m0s out of range [1s, 1h0m0s]"},
		{"visibility", func() error {
			_, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "v", VisibilityTimeout: durationpb.New(time.Millisecond)})
			return err
		}, "invalid argument: visibility_timeout 1ms out of range"},
		{"group", func() error {
			_, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("x"), Group: "a/b"}}})
			return err
		}, `invalid argument: message 0: group "a/b": only letters`},
		{"dedup id", func() error {
			_, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("x"), DedupId: "a/b"}}})
			return err
		}, `invalid argument: message 0: dedup_id "a/b": only letters`},
	} {
		st := status.Convert(tc.call())
		msg := st.Message()
		if st.Code() != codes.InvalidArgument || !strings.HasPrefix(msg, tc.want) ||
			strings.Count(msg, "invalid argument") != 1 || strings.Contains(msg, "zkqueue:") {
			t.Errorf("%s: got %v %q, want InvalidArgument %q... saying each part once", tc.name, st.Code(), msg, tc.want)
		}
	}
}
