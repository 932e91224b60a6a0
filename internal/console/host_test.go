package console_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/console"
)

// do sends a request as a browser on a page of host would: Host, and on
// a POST a form with that page's Origin.
func (e *env) do(t *testing.T, c *http.Client, method, path, host string, form url.Values) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, e.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "http://"+host)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// twoMessages creates queue q holding two ready messages.
func (e *env) twoMessages(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.grpc.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "q", Kind: pb.QueueKind_QUEUE_KIND_FIFO}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.grpc.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("a")}, {Payload: []byte("b")}}}); err != nil {
		t.Fatal(err)
	}
}

// unchanged checks that q still holds its two messages and that no
// queue "other" was created.
func (e *env) unchanged(t *testing.T, what string) {
	t.Helper()
	if st := e.stats(t, "q"); st.GetReady() != 2 {
		t.Fatalf("%s: ready %d, want 2 (nothing changed)", what, st.GetReady())
	}
	if _, err := e.grpc.GetQueue(context.Background(), &pb.GetQueueRequest{Name: "other"}); status.Code(err) != codes.NotFound {
		t.Fatalf("%s: queue other: %v, want NotFound", what, err)
	}
}

// TestRefusesOtherHosts: a web page whose name was rebound to the
// console's address (DNS rebinding) is same-origin with it in the
// browser, and sends its own name in Host: the console answers it
// nothing, not even the form token, and none of its forms changes
// anything, even with a token and cookie of a real session.
func TestRefusesOtherHosts(t *testing.T) {
	e := start(t, nil)
	e.twoMessages(t)
	tok := e.token(t, e.client) // a real session's token and cookie
	const evil = "rebind.attacker.example:9090"

	for _, tc := range []struct {
		method, path string
		form         url.Values
	}{
		{"GET", "/console/", nil},
		{"GET", "/console/queues/q", nil},
		{"GET", "/console/brokers", nil},
		{"GET", "/console/static/console.css", nil},
		{"POST", "/console/queues/q/purge", url.Values{"csrf": {tok}, "confirm": {"q"}}},
		{"POST", "/console/queues/q/delete", url.Values{"csrf": {tok}, "confirm": {"q"}}},
		{"POST", "/console/queues/q/publish", url.Values{"csrf": {tok}, "payload": {"x"}}},
		{"POST", "/console/queues", url.Values{"csrf": {tok}, "name": {"other"}}},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			for _, c := range []*http.Client{e.client, newClient(t, nil)} {
				code, body := e.do(t, c, tc.method, tc.path, evil, tc.form)
				if code != http.StatusMisdirectedRequest {
					t.Fatalf("Host %s: %d, want 421\n%s", evil, code, body)
				}
				mustContain(t, "refusal", body, "rebind.attacker.example", "localhost", "--console-host")
				if strings.Contains(body, tok) || strings.Contains(body, `name="csrf"`) || strings.Contains(body, "<td") {
					t.Fatalf("the refusal shows the page or its token:\n%s", body)
				}
				e.unchanged(t, tc.method+" "+tc.path)
			}
		})
	}

	// Loopback names are the console's own.
	_, port, err := net.SplitHostPort(e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"localhost:" + port, "127.0.0.1:" + port, "127.3.4.5:" + port, "[::1]:" + port, "LOCALHOST.:" + port, "localhost"} {
		if code, body := e.do(t, e.client, "GET", "/console/", h, nil); code != http.StatusOK {
			t.Fatalf("Host %s: %d, want 200\n%s", h, code, body)
		}
	}
}

// TestTokenPerSession: every browser session has its own form token; a
// token of one session does nothing in another.
func TestTokenPerSession(t *testing.T) {
	e := start(t, nil)
	e.twoMessages(t)
	a, b := newClient(t, nil), newClient(t, nil)
	ta, tb := e.token(t, a), e.token(t, b)
	if ta == tb {
		t.Fatalf("two browser sessions got the same form token %s", ta)
	}
	for _, f := range []url.Values{
		{"csrf": {ta}, "confirm": {"q"}},
		{"csrf": {ta + "0"}, "confirm": {"q"}},
		{"csrf": {""}, "confirm": {"q"}},
	} {
		code, body := e.post(t, b, "/console/queues/q/purge", f)
		if code != http.StatusForbidden {
			t.Fatalf("purge in session b with token %q: %d, want 403\n%s", f.Get("csrf"), code, body)
		}
		mustContain(t, "foreign token", body, "token is missing or stale")
		e.unchanged(t, "a foreign token")
	}
	// A session keeps its token across pages (several tabs work).
	if again := e.token(t, a); again != ta {
		t.Fatalf("session a's token changed on reload: %s, then %s", ta, again)
	}
	code, body := e.post(t, b, "/console/queues/q/purge", url.Values{"csrf": {tb}, "confirm": {"q"}})
	if code != http.StatusOK {
		t.Fatalf("purge with b's own token: %d\n%s", code, body)
	}
	mustContain(t, "after purge", body, "Purged 2 ready message(s).")
}

// TestConfiguredHosts: a name given in Config.Hosts is the console's,
// with any port or with the one given; a bad name is refused at New.
func TestConfiguredHosts(t *testing.T) {
	e := startWith(t, nil, console.Config{Hosts: []string{"Queues.Example.COM.", "ops.example.com:8443"}})
	e.twoMessages(t)
	for _, h := range []string{"queues.example.com", "queues.example.com:9090", "QUEUES.example.com.:1", "ops.example.com:8443"} {
		if code, body := e.do(t, e.client, "GET", "/console/", h, nil); code != http.StatusOK {
			t.Fatalf("Host %s: %d, want 200\n%s", h, code, body)
		}
	}
	for _, h := range []string{"ops.example.com", "ops.example.com:9090", "example.com", "x.queues.example.com", "queues.example.com.evil"} {
		code, body := e.do(t, e.client, "GET", "/console/", h, nil)
		if code != http.StatusMisdirectedRequest {
			t.Fatalf("Host %s: %d, want 421\n%s", h, code, body)
		}
		mustContain(t, "refusal", body, "queues.example.com, ops.example.com:8443", "--console-host")
	}
	// An action through a configured name: the session's token works.
	c := newClient(t, nil)
	code, body := e.do(t, c, "GET", "/console/", "queues.example.com", nil)
	m := csrfField.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("GET /console/ as queues.example.com: %d, no token\n%s", code, body)
	}
	code, body = e.do(t, c, "POST", "/console/queues/q/purge", "queues.example.com", url.Values{"csrf": {m[1]}, "confirm": {"q"}})
	if code != http.StatusOK {
		t.Fatalf("purge as queues.example.com: %d\n%s", code, body)
	}
	if st := e.stats(t, "q"); st.GetReady() != 0 {
		t.Fatalf("after the purge: ready %d, want 0", st.GetReady())
	}

	for _, bad := range []string{"", "http://x.example", "x.example/path", "x.example:0", "x.example:http", "a..b", "[::1", "*.example.com"} {
		if _, err := console.New(console.Config{Broker: e.b, Hosts: []string{bad}}); err == nil {
			t.Errorf("New with host %q: no error", bad)
		}
	}
}
