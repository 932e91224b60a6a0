package console_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// The create form's packed box makes a packed queue and the queue page
// says so; packed with a message TTL is refused and creates nothing.
func TestCreatePacked(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	tok := e.token(t, e.client)
	code, body := e.post(t, e.client, "/console/queues", url.Values{"csrf": {tok}, "name": {"p"}, "packed": {"1"}})
	if code != http.StatusOK {
		t.Fatalf("create: %d\n%s", code, body)
	}
	if info, err := e.grpc.GetQueue(ctx, &pb.GetQueueRequest{Name: "p"}); err != nil || !info.GetPacked() {
		t.Fatalf("GetQueue: %v, %v; want packed", info, err)
	}
	mustContain(t, "queue page", body, "Storage", "packed, many messages per node")

	code, body = e.post(t, e.client, "/console/queues", url.Values{"csrf": {tok}, "name": {"other"}, "packed": {"1"}, "message_ttl": {"1h"}})
	if code != http.StatusBadRequest {
		t.Fatalf("create packed with a TTL: %d, want 400\n%s", code, body)
	}
	mustContain(t, "refused create", body, "InvalidArgument", "packed")
	if _, err := e.grpc.GetQueue(ctx, &pb.GetQueueRequest{Name: "other"}); status.Code(err) != codes.NotFound {
		t.Fatalf("queue other: %v, want NotFound", err)
	}
}
