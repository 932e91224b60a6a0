package natsbridge

import (
	"maps"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/events"
)

// A message's content type and headers go out with IncludePayload (even
// when the payload itself is over the cap), and not without it.
func TestHeadersFollowPayload(t *testing.T) {
	srv := runServer(t, -1, false)
	for _, include := range []bool{true, false} {
		sub := subscribe(t, srv, "qbroker.>")
		b, _ := newBridge(t, Config{URL: srv.ClientURL(), IncludePayload: include, MaxPayload: 4})
		h := map[string]string{"trace-id": "abc", "tenant": "t1"}
		e := testEvent("q", events.Published, 1)
		e.Payload, e.ContentType, e.Headers = []byte("over the cap"), "text/plain", h
		b.Emit(e)
		h["trace-id"] = "changed" // Emit copied the headers: the change must not show
		r := receive(t, sub, 1, 10*time.Second)[0]
		_, hasHeaders := r.raw["headers"]
		_, hasType := r.raw["content_type"]
		if hasHeaders != include || hasType != include {
			t.Fatalf("IncludePayload %v: headers present %v, content_type present %v", include, hasHeaders, hasType)
		}
		if include && (!maps.Equal(r.event.Headers, map[string]string{"trace-id": "abc", "tenant": "t1"}) || r.event.ContentType != "text/plain") {
			t.Fatalf("got headers %v, content type %q", r.event.Headers, r.event.ContentType)
		}
		if _, ok := r.raw["payload"]; ok {
			t.Fatalf("payload over the cap sent")
		}
		closeBridge(t, b)
	}
}
