package broker_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// browseIDs pages through queue with Browse, limit at a time, and returns
// the messages.
func browseAll(t *testing.T, c pb.QueueClient, queue string, limit uint32) []*pb.Message {
	t.Helper()
	var all []*pb.Message
	token := ""
	for range 1000 {
		resp, err := c.Browse(context.Background(), &pb.BrowseRequest{Queue: queue, Limit: limit, PageToken: token})
		if err != nil {
			t.Fatalf("Browse(%q): %v", token, err)
		}
		if limit > 0 && len(resp.GetMessages()) > int(limit) {
			t.Fatalf("page of %d > limit %d", len(resp.GetMessages()), limit)
		}
		all = append(all, resp.GetMessages()...)
		if token = resp.GetNextPageToken(); token == "" {
			return all
		}
	}
	t.Fatal("browse does not end")
	return nil
}

// Browse pages through a queue spread over many segments: every ready
// message once, in order, with its attributes, no ack token; Stats and
// delivery counts unchanged; a leased message left out; bad requests
// refused.
func TestBrowse(t *testing.T) {
	b := newBroker(t, zktest.Root(t), func(c *broker.Config) { c.SegmentSize = 4 })
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "br"})
	publishN(t, b.client, "br", 30)
	ids := publishAttrs(t, b.client, "br", "last")

	// One delivered and nacked: it is back at the head with 1 delivery.
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "br", Mode: alo})
	if _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: ms[0].GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	before := stats(t, b.client, "br")
	for _, limit := range []uint32{3, 0} {
		all := browseAll(t, b.client, "br", limit)
		if len(all) != 31 {
			t.Fatalf("limit %d: %d messages, want 31", limit, len(all))
		}
		for i, m := range all[:30] {
			want := uint32(0)
			if i == 0 {
				want = 1
			}
			if string(m.GetPayload()) != fmt.Sprintf("m%05d", i) || m.GetDeliveryCount() != want || m.GetAckToken() != "" || m.GetLeaseDeadline() != nil {
				t.Fatalf("limit %d, message %d: %v", limit, i, m)
			}
		}
		if all[30].GetId() != ids[0] {
			t.Fatalf("last: %v, want %s", all[30], ids[0])
		}
		checkAttrs(t, "browsed", all[30])
	}
	if after := stats(t, b.client, "br"); !proto.Equal(clearAge(before), clearAge(after)) {
		t.Fatalf("browsing changed the stats: %v -> %v", before, after)
	}

	// A leased message is not ready.
	leased := receive(t, b.client, &pb.ReceiveRequest{Queue: "br", Mode: alo})[0]
	all := browseAll(t, b.client, "br", 10)
	if len(all) != 30 || slices.ContainsFunc(all, func(m *pb.Message) bool { return m.GetId() == leased.GetId() }) {
		t.Fatalf("with %s leased: %d messages browsed, want 30 without it", leased.GetId(), len(all))
	}
	// The delivery count the next consumer sees is unchanged by browsing.
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: leased.GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	if m := receive(t, b.client, &pb.ReceiveRequest{Queue: "br"}); len(m) != 1 || m[0].GetDeliveryCount() != 1 {
		t.Fatalf("after browsing: received %v, want delivery count 1", m)
	}

	for _, tc := range []struct {
		req  *pb.BrowseRequest
		want codes.Code
	}{
		{&pb.BrowseRequest{Queue: "br", PageToken: "nonsense"}, codes.InvalidArgument},
		{&pb.BrowseRequest{Queue: "br", PageToken: "qn-1-00000000x1"}, codes.InvalidArgument},
		{&pb.BrowseRequest{Queue: "br", Limit: 1001}, codes.InvalidArgument},
		{&pb.BrowseRequest{Queue: "missing"}, codes.NotFound},
		{&pb.BrowseRequest{Queue: "a/b"}, codes.InvalidArgument},
	} {
		_, err := b.client.Browse(ctx, tc.req)
		if status.Code(err) != tc.want || (tc.want == codes.InvalidArgument && strings.Contains(status.Convert(err).Message(), "internal")) {
			t.Errorf("Browse(%v): got %v, want %v", tc.req, err, tc.want)
		}
	}
}

// clearAge returns st without its oldest age, which grows with time.
func clearAge(st *pb.QueueStats) *pb.QueueStats {
	st = proto.Clone(st).(*pb.QueueStats)
	st.OldestAge = nil
	return st
}
