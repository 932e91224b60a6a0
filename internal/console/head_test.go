package console_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
)

// The queue page shows the ready messages at the head, with their
// attributes, a page at a time, and takes none of them.
func TestQueuePageShowsHead(t *testing.T) {
	e := start(t, nil, func(c *broker.Config) { c.SegmentSize = 8 })
	ctx := context.Background()
	if _, err := e.grpc.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "h"}); err != nil {
		t.Fatal(err)
	}
	req := &pb.PublishRequest{Queue: "h"}
	for i := range 25 {
		req.Messages = append(req.Messages, &pb.OutMessage{Payload: []byte(fmt.Sprintf("msg-%02d", i)),
			Headers: map[string]string{"trace": fmt.Sprint(i), "x": "<b>"}, ContentType: "text/plain"})
	}
	if _, err := e.grpc.Publish(ctx, req); err != nil {
		t.Fatal(err)
	}
	code, body := e.get(t, e.client, "/console/queues/h")
	if code != http.StatusOK {
		t.Fatalf("queue page: %d\n%s", code, body)
	}
	mustContain(t, "queue page", body, `id="head"`, "msg-00", "msg-19", "content-type: text/plain", "trace: 0", "x: &lt;b&gt;",
		"Next ready messages")
	if strings.Contains(body, "msg-20") || strings.Contains(body, "<b>") {
		t.Fatalf("first page: more than 20 messages, or an unescaped header:\n%s", body)
	}
	next := regexp.MustCompile(`href="(/console/queues/h\?head=[^"]+)"`).FindStringSubmatch(body)
	if next == nil {
		t.Fatalf("no link to the next page in\n%s", body)
	}
	code, body = e.get(t, e.client, strings.ReplaceAll(next[1], "&amp;", "&"))
	if code != http.StatusOK {
		t.Fatalf("next page: %d", code)
	}
	mustContain(t, "second page", body, "msg-20", "msg-24", "Back to the head")
	if strings.Contains(body, "msg-19") || strings.Contains(body, "Next ready messages") {
		t.Fatalf("second page repeats the first or goes on:\n%s", body)
	}
	if st := e.stats(t, "h"); st.GetReady() != 25 || st.GetInFlight() != 0 {
		t.Fatalf("after browsing: %v, want 25 ready", st)
	}
	// A bad token: the page says why and still shows the rest.
	code, body = e.get(t, e.client, "/console/queues/h?head=bogus")
	if code != http.StatusOK {
		t.Fatalf("bad head token: %d", code)
	}
	mustContain(t, "bad head token", body, "malformed page_token", `id="ready">25<`)
}
