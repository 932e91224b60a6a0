package console_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/console"
	"github.com/qbroker/qbroker/internal/tlsutil"
	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) { zktest.Main(m) }

// env is a broker, a gRPC client of it and its console served over HTTP.
type env struct {
	b      *broker.Broker
	grpc   pb.QueueClient
	srv    *httptest.Server
	client *http.Client
}

// start runs a broker on a fresh root with its console; tlsCfg (nil:
// plain HTTP) serves the console over HTTPS.
func start(t *testing.T, tlsCfg *tls.Config, mods ...func(*broker.Config)) *env {
	t.Helper()
	return startWith(t, tlsCfg, console.Config{}, mods...)
}

// startWith is start with the console configured as cc (its Broker and
// Gatherer set here).
func startWith(t *testing.T, tlsCfg *tls.Config, cc console.Config, mods ...func(*broker.Config)) *env {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t), SweepInterval: 100 * time.Millisecond,
		SessionTimeout: 4 * time.Second, Registerer: reg}
	for _, m := range mods {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, cfg, brokertest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	cc.Broker, cc.Gatherer = s.Broker, reg
	c, err := console.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	e := &env{b: s.Broker}
	e.srv = httptest.NewUnstartedServer(c.Handler())
	if tlsCfg != nil {
		e.srv.TLS = tlsCfg
		e.srv.StartTLS()
	} else {
		e.srv.Start()
	}
	t.Cleanup(e.srv.Close)
	e.client = newClient(t, nil)
	conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.grpc = pb.NewQueueClient(conn)
	return e
}

// newClient is a browser-like client: it keeps cookies and follows
// redirects.
func newClient(t *testing.T, tlsCfg *tls.Config) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, Timeout: 60 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
}

func (e *env) get(t *testing.T, c *http.Client, path string) (int, string) {
	t.Helper()
	resp, err := c.Get(e.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// post sends a form as a browser would from the console's own page, the
// redirect followed.
func (e *env) post(t *testing.T, c *http.Client, path string, form url.Values) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", e.srv.URL)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// token loads the queues page (setting the cookie) and returns its form
// token.
func (e *env) token(t *testing.T, c *http.Client) string {
	t.Helper()
	code, body := e.get(t, c, "/console/")
	m := csrfField.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("GET /console/: %d, no form token in\n%s", code, body)
	}
	return m[1]
}

func (e *env) stats(t *testing.T, name string) *pb.QueueStats {
	t.Helper()
	st, err := e.grpc.Stats(context.Background(), &pb.StatsRequest{Name: name})
	if err != nil {
		t.Fatalf("Stats(%s): %v", name, err)
	}
	return st
}

func mustContain(t *testing.T, what, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Fatalf("%s: want %q in\n%s", what, w, body)
		}
	}
}

// deadLetter makes the queue's one ready message a dead letter: received
// at least once and nacked until it passes the queue's max deliveries.
func deadLetter(t *testing.T, c pb.QueueClient, name string) {
	t.Helper()
	ctx := context.Background()
	zktest.WaitFor(t, 30*time.Second, "a dead letter", func() bool {
		resp, err := c.Receive(ctx, &pb.ReceiveRequest{Queue: name, MaxMessages: 1, Wait: durationpb.New(time.Second),
			Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE})
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		for _, m := range resp.GetMessages() {
			if _, err := c.Nack(ctx, &pb.NackRequest{AckToken: m.GetAckToken()}); err != nil {
				t.Fatalf("Nack: %v", err)
			}
		}
		st, err := c.Stats(ctx, &pb.StatsRequest{Name: name})
		return err == nil && st.GetDead() == 1
	})
}

func TestCreatePublishRedrive(t *testing.T) {
	e := start(t, nil)
	tok := e.token(t, e.client)

	code, body := e.post(t, e.client, "/console/queues", url.Values{"csrf": {tok}, "name": {"jobs"}, "kind": {"fifo"},
		"max_deliveries": {"1"}, "dead_letter": {"1"}, "max_depth": {"10"}})
	if code != http.StatusOK {
		t.Fatalf("create: %d\n%s", code, body)
	}
	mustContain(t, "queue page after create", body, "Queue created.", `id="qname">jobs<`, `id="ready">0<`)
	info, err := e.grpc.GetQueue(context.Background(), &pb.GetQueueRequest{Name: "jobs"})
	if err != nil || info.GetMaxDeliveries() != 1 || !info.GetDeadLetter() || info.GetMaxDepth() != 10 {
		t.Fatalf("GetQueue: %v, %v; want max deliveries 1, dead letter, max depth 10", info, err)
	}

	payload := `<script>alert("x")</script>`
	code, body = e.post(t, e.client, "/console/queues/jobs/publish", url.Values{"csrf": {tok}, "payload": {payload}})
	if code != http.StatusOK {
		t.Fatalf("publish: %d\n%s", code, body)
	}
	mustContain(t, "queue page after publish", body, "Published message qn-", `id="ready">1<`)
	if st := e.stats(t, "jobs"); st.GetReady() != 1 {
		t.Fatalf("ready %d, want 1", st.GetReady())
	}
	_, list := e.get(t, e.client, "/console/")
	mustContain(t, "queues page", list, `href="/console/queues/jobs"`, `<td class="num ready">1</td>`)

	deadLetter(t, e.grpc, "jobs")
	code, body = e.get(t, e.client, "/console/queues/jobs")
	if code != http.StatusOK {
		t.Fatalf("queue page: %d", code)
	}
	mustContain(t, "queue page with a dead letter", body, `id="dead">1<`, `id="ready">0<`,
		"&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;")
	if strings.Contains(body, "<script>") {
		t.Fatalf("the payload is not escaped:\n%s", body)
	}
	id := regexp.MustCompile(`name="id" value="([^"]+)"`).FindStringSubmatch(body)
	if id == nil {
		t.Fatalf("no redrive form in\n%s", body)
	}

	code, body = e.post(t, e.client, "/console/queues/jobs/redrive", url.Values{"csrf": {tok}, "id": {id[1]}})
	if code != http.StatusOK {
		t.Fatalf("redrive: %d\n%s", code, body)
	}
	mustContain(t, "queue page after redrive", body, "Moved 1 dead letter(s)", `id="dead">0<`, `id="ready">1<`)
	if st := e.stats(t, "jobs"); st.GetReady() != 1 || st.GetDead() != 0 {
		t.Fatalf("after redrive: ready %d dead %d, want 1, 0", st.GetReady(), st.GetDead())
	}

	// Redrive all, of two dead letters.
	if _, err := e.grpc.Publish(context.Background(), &pb.PublishRequest{Queue: "jobs",
		Messages: []*pb.OutMessage{{Payload: []byte("b")}}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		deadLetterOne(t, e.grpc, "jobs")
	}
	code, body = e.post(t, e.client, "/console/queues/jobs/redrive", url.Values{"csrf": {tok}, "all": {"1"}})
	if code != http.StatusOK {
		t.Fatalf("redrive all: %d\n%s", code, body)
	}
	mustContain(t, "queue page after redrive all", body, "Moved 2 dead letter(s)", `id="ready">2<`)
}

// deadLetterOne dead-letters one message of a queue whose max deliveries
// is 1.
func deadLetterOne(t *testing.T, c pb.QueueClient, name string) {
	t.Helper()
	ctx := context.Background()
	before, err := c.Stats(ctx, &pb.StatsRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Receive(ctx, &pb.ReceiveRequest{Queue: name, MaxMessages: 1, Wait: durationpb.New(10 * time.Second),
		Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE})
	if err != nil || len(resp.GetMessages()) != 1 {
		t.Fatalf("Receive: %v, %d messages", err, len(resp.GetMessages()))
	}
	if _, err := c.Nack(ctx, &pb.NackRequest{AckToken: resp.GetMessages()[0].GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "one more dead letter", func() bool {
		st, err := c.Stats(ctx, &pb.StatsRequest{Name: name})
		return err == nil && st.GetDead() == before.GetDead()+1
	})
}

func TestActionsNeedTokenAndConfirmation(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	if _, err := e.grpc.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "q", Kind: pb.QueueKind_QUEUE_KIND_FIFO}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.grpc.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("a")}, {Payload: []byte("b")}}}); err != nil {
		t.Fatal(err)
	}
	tok := e.token(t, e.client)
	unchanged := func(what string) {
		t.Helper()
		if st := e.stats(t, "q"); st.GetReady() != 2 {
			t.Fatalf("%s: ready %d, want 2 (nothing changed)", what, st.GetReady())
		}
	}

	// A GET does nothing.
	if code, _ := e.get(t, e.client, "/console/queues/q/purge"); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET purge: %d, want 405", code)
	}
	unchanged("GET purge")

	for _, tc := range []struct {
		name   string
		path   string
		form   url.Values
		client *http.Client
		origin string
		want   int
		says   string
	}{
		{"purge without token", "/console/queues/q/purge", url.Values{"confirm": {"q"}}, e.client, "", 403, "token is missing or stale"},
		{"purge with a wrong token", "/console/queues/q/purge", url.Values{"csrf": {strings.Repeat("0", 64)}, "confirm": {"q"}}, e.client, "", 403, "token is missing or stale"},
		{"purge without the cookie", "/console/queues/q/purge", url.Values{"csrf": {tok}, "confirm": {"q"}}, newClient(t, nil), "", 403, "token is missing or stale"},
		{"purge from another site", "/console/queues/q/purge", url.Values{"csrf": {tok}, "confirm": {"q"}}, e.client, "https://evil.example", 403, "from another site"},
		{"purge unconfirmed", "/console/queues/q/purge", url.Values{"csrf": {tok}}, e.client, "", 400, "not confirmed"},
		{"purge confirmed wrongly", "/console/queues/q/purge", url.Values{"csrf": {tok}, "confirm": {"Q"}}, e.client, "", 400, "not confirmed"},
		{"delete without token", "/console/queues/q/delete", url.Values{"confirm": {"q"}}, e.client, "", 403, "token is missing or stale"},
		{"delete unconfirmed", "/console/queues/q/delete", url.Values{"csrf": {tok}}, e.client, "", 400, "not confirmed"},
		{"publish without token", "/console/queues/q/publish", url.Values{"payload": {"x"}}, e.client, "", 403, "token is missing or stale"},
		{"create without token", "/console/queues", url.Values{"name": {"other"}}, e.client, "", 403, "token is missing or stale"},
		{"create a bad name", "/console/queues", url.Values{"csrf": {tok}, "name": {"bad/name"}}, e.client, "", 400, "InvalidArgument"},
		{"create a bad quota", "/console/queues", url.Values{"csrf": {tok}, "name": {"other"}, "max_depth": {"-1"}}, e.client, "", 400, "max_depth"},
		{"publish to a missing queue", "/console/queues/nope/publish", url.Values{"csrf": {tok}, "payload": {"x"}}, e.client, "", 404, "NotFound"},
		{"publish a priority to a fifo queue", "/console/queues/q/publish", url.Values{"csrf": {tok}, "payload": {"x"}, "priority": {"3"}}, e.client, "", 409, "FailedPrecondition"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+tc.path, strings.NewReader(tc.form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			resp, err := tc.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d\n%s", resp.StatusCode, tc.want, body)
			}
			mustContain(t, tc.name, string(body), tc.says)
			unchanged(tc.name)
			if _, err := e.grpc.GetQueue(ctx, &pb.GetQueueRequest{Name: "other"}); status.Code(err) != codes.NotFound {
				t.Fatalf("queue other: %v, want NotFound", err)
			}
		})
	}

	code, body := e.post(t, e.client, "/console/queues/q/purge", url.Values{"csrf": {tok}, "confirm": {"q"}})
	if code != http.StatusOK {
		t.Fatalf("purge: %d\n%s", code, body)
	}
	mustContain(t, "after purge", body, "Purged 2 ready message(s).", `id="ready">0<`)
	code, body = e.post(t, e.client, "/console/queues/q/delete", url.Values{"csrf": {tok}, "confirm": {"q"}})
	if code != http.StatusOK {
		t.Fatalf("delete: %d\n%s", code, body)
	}
	mustContain(t, "after delete", body, "Deleted queue q.", "No queues yet.")
	if _, err := e.grpc.GetQueue(ctx, &pb.GetQueueRequest{Name: "q"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetQueue after delete: %v, want NotFound", err)
	}
	if code, body := e.get(t, e.client, "/console/queues/q"); code != http.StatusNotFound {
		t.Fatalf("deleted queue's page: %d, want 404\n%s", code, body)
	}
}

func TestEscapesNames(t *testing.T) {
	e := start(t, nil)
	// A name the broker refuses still comes back in the error, escaped.
	tok := e.token(t, e.client)
	code, body := e.post(t, e.client, "/console/queues", url.Values{"csrf": {tok}, "name": {`<b>x</b>`}})
	if code != http.StatusBadRequest || strings.Contains(body, "<b>x</b>") {
		t.Fatalf("create <b>x</b>: %d, want 400 and the name escaped\n%s", code, body)
	}
	mustContain(t, "error page", body, "&lt;b&gt;x&lt;/b&gt;")
	// A flash message shows only what the console did: ?ok= with a
	// made-up name shows no markup.
	_, body = e.get(t, e.client, "/console/?ok=deleted&q=%3Cimg%3E")
	mustContain(t, "flash", body, "Deleted queue ?.")
}

func TestBrokersPage(t *testing.T) {
	e := start(t, nil)
	zktest.WaitFor(t, 30*time.Second, "the leader on the brokers page", func() bool {
		code, body := e.get(t, e.client, "/console/brokers")
		return code == http.StatusOK && strings.Contains(body, e.b.ID()) && strings.Contains(body, "this broker") &&
			strings.Contains(body, `class="tag lead">leader<`)
	})
}

// TestAuth: with authentication on, the console acts as the client
// certificate of the HTTPS connection; an identity the rules do not let
// change a queue gets a 403 page and nothing changes; without a
// certificate every call is refused, and the page says why.
func TestAuth(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsutil.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(l tlsutil.Leaf) tls.Certificate {
		c, err := ca.Issue(l)
		if err != nil {
			t.Fatal(err)
		}
		kp, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	rules := filepath.Join(dir, "rules")
	if err := os.WriteFile(rules, []byte("ops all *\nviewer view *\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auth, err := broker.NewAuth(broker.AuthConfig{RulesFile: rules})
	if err != nil {
		t.Fatal(err)
	}
	srvTLS := &tls.Config{Certificates: []tls.Certificate{issue(tlsutil.Leaf{CommonName: "qbroker", Hosts: []string{"127.0.0.1"}, Server: true})},
		ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven}
	e := start(t, srvTLS, func(c *broker.Config) { c.Auth = auth })
	as := func(name string) *http.Client {
		cfg := &tls.Config{RootCAs: pool}
		if name != "" {
			cfg.Certificates = []tls.Certificate{issue(tlsutil.Leaf{CommonName: name, Client: true})}
		}
		return newClient(t, cfg)
	}
	ops, viewer, anon := as("ops"), as("viewer"), as("")

	tok := e.token(t, ops)
	code, body := e.post(t, ops, "/console/queues", url.Values{"csrf": {tok}, "name": {"q"}})
	if code != http.StatusOK {
		t.Fatalf("ops creates q: %d\n%s", code, body)
	}
	mustContain(t, "ops", body, "acting as <b>ops</b>")
	code, body = e.post(t, ops, "/console/queues/q/publish", url.Values{"csrf": {tok}, "payload": {"m"}})
	if code != http.StatusOK {
		t.Fatalf("ops publishes: %d\n%s", code, body)
	}

	vtok := e.token(t, viewer)
	code, body = e.get(t, viewer, "/console/queues/q")
	if code != http.StatusOK {
		t.Fatalf("viewer views q: %d\n%s", code, body)
	}
	mustContain(t, "viewer's queue page", body, "acting as <b>viewer</b>", `id="ready">1<`, "PermissionDenied")
	for _, a := range []struct{ path, says string }{
		{"/console/queues/q/purge", "viewer may not purge queue"},
		{"/console/queues/q/delete", "viewer may not delete queue"},
		{"/console/queues/q/publish", "viewer may not publish queue"},
		{"/console/queues", "viewer may not create queue"},
	} {
		code, body := e.post(t, viewer, a.path, url.Values{"csrf": {vtok}, "confirm": {"q"}, "name": {"q2"}, "payload": {"x"}})
		if code != http.StatusForbidden {
			t.Fatalf("viewer POST %s: %d, want 403\n%s", a.path, code, body)
		}
		mustContain(t, "viewer POST "+a.path, body, "PermissionDenied", a.says)
	}
	// The broker's gRPC port needs credentials too: look as ops.
	_, body = e.get(t, ops, "/console/queues/q")
	mustContain(t, "q after the viewer's refused actions", body, `id="ready">1<`)
	if code, body := e.get(t, ops, "/console/queues/q2"); code != http.StatusNotFound {
		t.Fatalf("q2 as ops: %d, want 404 (the viewer created nothing)\n%s", code, body)
	}

	code, body = e.get(t, anon, "/console/")
	if code != http.StatusUnauthorized {
		t.Fatalf("no certificate: %d, want 401\n%s", code, body)
	}
	mustContain(t, "no certificate", body, "no verified client certificate", "Unauthenticated")
}

// TestCreateWithTTLAndDedup: the create form sets a queue's message TTL,
// where expired messages go, and its dedup window; the queue page shows
// them. A value that does not parse, or one the broker refuses, creates
// nothing.
func TestCreateWithTTLAndDedup(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	tok := e.token(t, e.client)
	code, body := e.post(t, e.client, "/console/queues", url.Values{"csrf": {tok}, "name": {"t"},
		"message_ttl": {"90s"}, "expire_to_dead_letter": {"1"}, "dedup_window": {"2m"}})
	if code != http.StatusOK {
		t.Fatalf("create: %d\n%s", code, body)
	}
	info, err := e.grpc.GetQueue(ctx, &pb.GetQueueRequest{Name: "t"})
	if err != nil || info.GetMessageTtl().AsDuration() != 90*time.Second || !info.GetExpireToDeadLetter() ||
		info.GetDedupWindow().AsDuration() != 2*time.Minute {
		t.Fatalf("GetQueue: %v, %v; want TTL 1m30s to the dead letters, dedup window 2m", info, err)
	}
	mustContain(t, "queue page", body, "Message TTL", "1m30s, then dead-lettered", "Dedup window", "2m0s")

	for _, tc := range []struct {
		form url.Values
		want int
		says string
	}{
		{url.Values{"message_ttl": {"soon"}}, 400, "message TTL"},
		{url.Values{"dedup_window": {"-1s"}}, 400, "dedup window"},
		{url.Values{"message_ttl": {"1ms"}}, 400, "InvalidArgument"},
		{url.Values{"dedup_window": {"2h"}}, 400, "InvalidArgument"},
	} {
		tc.form.Set("csrf", tok)
		tc.form.Set("name", "other")
		code, body := e.post(t, e.client, "/console/queues", tc.form)
		if code != tc.want {
			t.Fatalf("create with %v: %d, want %d\n%s", tc.form, code, tc.want, body)
		}
		mustContain(t, "refused create", body, tc.says)
		if _, err := e.grpc.GetQueue(ctx, &pb.GetQueueRequest{Name: "other"}); status.Code(err) != codes.NotFound {
			t.Fatalf("create with %v: queue other: %v, want NotFound", tc.form, err)
		}
	}
}
