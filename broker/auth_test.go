package broker_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/tlsutil"
	"github.com/qbroker/qbroker/internal/zktest"
)

// secureEnv is a broker serving TLS with authentication on, and the
// files and credentials of its tests.
type secureEnv struct {
	dir    string
	ca     *tlsutil.CA
	tb     *testBroker
	tokens map[string]string // identity -> token
	files  struct{ cert, key, ca, tokens, rules string }
	log    syncBuffer // the Auth's log
}

// syncBuffer is a log destination safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func metadataCtx(ctx context.Context, kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

func healthCheck(ctx context.Context, conn *grpc.ClientConn) (*healthpb.HealthCheckResponse, error) {
	return healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
}

const testRules = `# identity  actions  patterns
admin       all                  *
worker      publish,consume      *
orders-app  publish,consume,create  orders.*
`

// newSecureBroker starts a broker with TLS (client certificates verified
// when given; required with requireCert) and authentication, tokens for
// admin and worker.
func newSecureBroker(t *testing.T, requireCert bool) *secureEnv {
	t.Helper()
	return startAuthBroker(t, testRules, []string{"admin", "worker"}, requireCert)
}

// newAuthBroker starts a broker with TLS and authentication by the rules
// given, a token for each of identities, and the AuthConfig changes of
// mods (a JWKS file, ...).
func newAuthBroker(t *testing.T, rules string, identities []string, mods ...func(*broker.AuthConfig)) *secureEnv {
	t.Helper()
	return startAuthBroker(t, rules, identities, false, mods...)
}

// startAuthBroker starts a broker with TLS (client certificates verified
// when given; required with requireCert) and authentication by rules, a
// token for each of identities, the AuthConfig changes of mods, and its
// log in e.log.
func startAuthBroker(t *testing.T, rules string, identities []string, requireCert bool, mods ...func(*broker.AuthConfig)) *secureEnv {
	t.Helper()
	e := &secureEnv{dir: t.TempDir(), tokens: map[string]string{}}
	var err error
	if e.ca, err = tlsutil.NewCA("test CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	e.files.cert, e.files.key = filepath.Join(e.dir, "server.pem"), filepath.Join(e.dir, "server-key.pem")
	e.files.ca, e.files.tokens, e.files.rules = filepath.Join(e.dir, "ca.pem"), filepath.Join(e.dir, "tokens"), filepath.Join(e.dir, "rules")
	e.issueServer(t, "server-1")
	writeFile(t, e.files.ca, string(e.ca.PEM))
	var lines []string
	for _, name := range identities {
		tok, line, err := broker.MintToken(name)
		if err != nil {
			t.Fatal(err)
		}
		e.tokens[name] = tok
		lines = append(lines, line)
	}
	writeFile(t, e.files.tokens, strings.Join(lines, "\n")+"\n")
	writeFile(t, e.files.rules, rules)
	srvTLS, err := tlsutil.Server(tlsutil.ServerConfig{CertFile: e.files.cert, KeyFile: e.files.key,
		ClientCAFile: e.files.ca, RequireClientCert: requireCert})
	if err != nil {
		t.Fatal(err)
	}
	ac := broker.AuthConfig{RulesFile: e.files.rules, TokensFile: e.files.tokens, Logger: slog.New(slog.NewTextHandler(&e.log, nil))}
	for _, m := range mods {
		m(&ac)
	}
	auth, err := broker.NewAuth(ac)
	if err != nil {
		t.Fatal(err)
	}
	e.tb = launchBroker(t, []string{zktest.Addr(t)}, zktest.Root(t),
		brokertest.Options{ServerOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(srvTLS))}},
		func(c *broker.Config) { c.Auth, c.Logger = auth, slog.New(slog.NewTextHandler(&e.log, nil)) })
	return e
}

// issueServer replaces the server certificate with a new one for
// 127.0.0.1 named cn.
func (e *secureEnv) issueServer(t *testing.T, cn string) {
	t.Helper()
	c, err := e.ca.Issue(tlsutil.Leaf{CommonName: cn, Hosts: []string{"127.0.0.1"}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(e.files.cert, e.files.key); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := tlsutil.WriteFileAtomic(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// clientCert issues a client certificate named cn by ca, valid until
// notAfter (zero: a year).
func clientCert(t *testing.T, ca *tlsutil.CA, cn string, notAfter time.Time) tls.Certificate {
	t.Helper()
	l := tlsutil.Leaf{CommonName: cn, Client: true, NotAfter: notAfter}
	if !notAfter.IsZero() {
		l.NotBefore = notAfter.Add(-time.Hour)
	}
	c, err := ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return true }

// dialTLS connects over TLS trusting roots, presenting cert (if any) and
// sending token (if any).
func dialTLS(t *testing.T, addr string, roots *x509.CertPool, cert *tls.Certificate, token string) *grpc.ClientConn {
	t.Helper()
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (e *secureEnv) roots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(e.ca.Cert)
	return p
}

// as returns a Queue client authenticated by identity's token.
func (e *secureEnv) as(t *testing.T, identity string) pb.QueueClient {
	return pb.NewQueueClient(dialTLS(t, e.tb.addr, e.roots(), nil, e.tokens[identity]))
}

func mustCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestTLSRefusesBadClients: under mutual TLS, a client that trusts
// another CA, one without a certificate, one with an expired certificate
// and one with a certificate of another CA are all refused, and none
// changes anything; a good client certificate works.
func TestTLSRefusesBadClients(t *testing.T) {
	e := newSecureBroker(t, true)
	ctx := callCtx(t)
	other, err := tlsutil.NewCA("other CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherRoots := x509.NewCertPool()
	otherRoots.AddCert(other.Cert)
	good := clientCert(t, e.ca, "admin", time.Time{})
	expired := clientCert(t, e.ca, "admin", time.Now().Add(-time.Minute))
	foreign := clientCert(t, other, "admin", time.Time{})
	cases := []struct {
		name  string
		roots *x509.CertPool
		cert  *tls.Certificate
	}{
		{"client trusts another CA", otherRoots, &good},
		{"no client certificate", e.roots(), nil},
		{"expired client certificate", e.roots(), &expired},
		{"client certificate of another CA", e.roots(), &foreign},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl := pb.NewQueueClient(dialTLS(t, e.tb.addr, c.roots, c.cert, ""))
			_, err := cl.CreateQueue(ctx, &pb.CreateQueueRequest{Name: fmt.Sprintf("q%d", i)})
			mustCode(t, "CreateQueue", err, codes.Unavailable)
		})
	}
	admin := pb.NewQueueClient(dialTLS(t, e.tb.addr, e.roots(), &good, ""))
	l, err := admin.ListQueues(ctx, &pb.ListQueuesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.GetQueues()) != 0 {
		t.Fatalf("refused clients created queues: %v", l.GetQueues())
	}
}

// TestTokenWithoutAdminCannotDelete: a token granted publish and consume
// gets PermissionDenied naming the action and queue for DeleteQueue and
// Purge; the queue and its message are intact.
func TestTokenWithoutAdminCannotDelete(t *testing.T) {
	e := newSecureBroker(t, false)
	ctx := callCtx(t)
	admin, worker := e.as(t, "admin"), e.as(t, "worker")
	createQueue(t, admin, &pb.CreateQueueRequest{Name: "jobs"})
	if _, err := worker.Publish(ctx, &pb.PublishRequest{Queue: "jobs", Messages: []*pb.OutMessage{{Payload: []byte("x")}}}); err != nil {
		t.Fatal(err)
	}
	_, err := worker.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "jobs"})
	mustCode(t, "DeleteQueue", err, codes.PermissionDenied)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "delete") || !strings.Contains(msg, `"jobs"`) {
		t.Fatalf("message %q does not name the action and the queue", msg)
	}
	_, err = worker.Purge(ctx, &pb.PurgeRequest{Name: "jobs"})
	mustCode(t, "Purge", err, codes.PermissionDenied)
	_, err = worker.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "other"})
	mustCode(t, "CreateQueue", err, codes.PermissionDenied)
	st, err := admin.Stats(ctx, &pb.StatsRequest{Name: "jobs"})
	if err != nil {
		t.Fatalf("Stats after refused delete: %v", err)
	}
	if st.GetReady() != 1 {
		t.Fatalf("got %d ready messages after refused delete and purge, want 1", st.GetReady())
	}
	if _, err := admin.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "jobs"}); err != nil {
		t.Fatalf("admin DeleteQueue: %v", err)
	}
	for _, want := range []string{
		`msg=audit .*action=create queue=jobs .*grpc_code=OK identity=admin via=token`,
		`msg=audit .*action=delete queue=jobs .*grpc_code=PermissionDenied identity=worker via=token`,
		`msg=audit .*action=purge queue=jobs .*grpc_code=PermissionDenied identity=worker via=token`,
		`msg=audit .*action=delete queue=jobs .*grpc_code=OK identity=admin via=token`,
	} {
		if !regexp.MustCompile(want).MatchString(e.log.String()) {
			t.Errorf("no audit line matching %q in the log:\n%s", want, e.log.String())
		}
	}
}

// TestPatternLimitsIdentity: a client certificate named orders-app, whose
// rule covers orders.*, consumes orders.eu but neither receives nor
// streams from billing, nor acks billing's deliveries (on the Ack call or
// on its own stream); billing's message and lease are untouched.
func TestPatternLimitsIdentity(t *testing.T) {
	e := newSecureBroker(t, false)
	ctx := callCtx(t)
	admin := e.as(t, "admin")
	cert := clientCert(t, e.ca, "orders-app", time.Time{})
	app := pb.NewQueueClient(dialTLS(t, e.tb.addr, e.roots(), &cert, ""))
	for _, q := range []string{"orders.eu", "billing"} {
		createQueue(t, admin, &pb.CreateQueueRequest{Name: q})
		if _, err := admin.Publish(ctx, &pb.PublishRequest{Queue: q, Messages: []*pb.OutMessage{{Payload: []byte(q)}, {Payload: []byte(q)}}}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := app.Receive(ctx, &pb.ReceiveRequest{Queue: "orders.eu", MaxMessages: 1})
	if err != nil || len(r.GetMessages()) != 1 {
		t.Fatalf("Receive orders.eu: %v, %d messages", err, len(r.GetMessages()))
	}
	_, err = app.Receive(ctx, &pb.ReceiveRequest{Queue: "billing", MaxMessages: 1})
	mustCode(t, "Receive billing", err, codes.PermissionDenied)

	stream, err := app.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "billing"}, Credit: 10}); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	mustCode(t, "Consume billing", err, codes.PermissionDenied)

	// A delivery of billing to admin: orders-app may not settle it.
	got, err := admin.Receive(ctx, &pb.ReceiveRequest{Queue: "billing", MaxMessages: 1, Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE})
	if err != nil || len(got.GetMessages()) != 1 {
		t.Fatalf("admin Receive billing: %v", err)
	}
	tok := got.GetMessages()[0].GetAckToken()
	_, err = app.Ack(ctx, &pb.AckRequest{AckToken: tok})
	mustCode(t, "Ack of billing's token", err, codes.PermissionDenied)
	_, err = app.Nack(ctx, &pb.NackRequest{AckToken: tok})
	mustCode(t, "Nack of billing's token", err, codes.PermissionDenied)
	stream, err = app.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "orders.eu"}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Settle: []*pb.Settle{{AckToken: tok}}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	for err == nil {
		_, err = stream.Recv() // orders.eu's remaining message may come first
	}
	mustCode(t, "settling billing's token on an orders.eu stream", err, codes.PermissionDenied)

	st, err := admin.Stats(ctx, &pb.StatsRequest{Name: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetReady() != 1 || st.GetInFlight() != 1 {
		t.Fatalf("billing: got %d ready, %d in flight, want 1 and 1", st.GetReady(), st.GetInFlight())
	}
	if _, err := admin.Ack(ctx, &pb.AckRequest{AckToken: tok}); err != nil {
		t.Fatalf("admin Ack: %v", err)
	}
	l, err := app.ListQueues(ctx, &pb.ListQueuesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.GetQueues()) != 1 || l.GetQueues()[0].GetName() != "orders.eu" {
		t.Fatalf("orders-app lists %v, want only orders.eu", l.GetQueues())
	}
}

// TestBadCredentialsUnauthenticated: no credentials, garbage, a forged
// token of the right shape, the stored hash itself, another scheme: all
// Unauthenticated; health stays public.
func TestBadCredentialsUnauthenticated(t *testing.T) {
	e := newSecureBroker(t, false)
	ctx := callCtx(t)
	forged, _, err := broker.MintToken("admin")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(e.files.tokens)
	if err != nil {
		t.Fatal(err)
	}
	hash := strings.TrimPrefix(strings.Fields(string(data))[1], "sha256:")
	for name, tok := range map[string]string{"none": "", "garbage": "garbage", "forged": forged,
		"hash": hash, "hash with prefix": "sha256:" + hash, "admin token with junk": e.tokens["admin"] + "x"} {
		t.Run(name, func(t *testing.T) {
			c := pb.NewQueueClient(dialTLS(t, e.tb.addr, e.roots(), nil, tok))
			_, err := c.ListQueues(ctx, &pb.ListQueuesRequest{})
			mustCode(t, "ListQueues", err, codes.Unauthenticated)
			_, err = c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "x"})
			mustCode(t, "CreateQueue", err, codes.Unauthenticated)
		})
	}
	conn := dialTLS(t, e.tb.addr, e.roots(), nil, "")
	basic := pb.NewQueueClient(conn)
	_, err = basic.ListQueues(metadataCtx(ctx, "authorization", "Basic YWRtaW46YWRtaW4="), &pb.ListQueuesRequest{})
	mustCode(t, "Basic authorization", err, codes.Unauthenticated)
	if _, err := healthCheck(ctx, conn); err != nil {
		t.Fatalf("health without credentials: %v", err)
	}
}

// TestReloadTokensAndCertificate: a token added to the tokens file works
// once the broker has re-read it, a removed one stops working, and a new
// server certificate is served to new connections.
func TestReloadTokensAndCertificate(t *testing.T) {
	e := newSecureBroker(t, false)
	ctx := callCtx(t)
	tok, line, err := broker.MintToken("worker")
	if err != nil {
		t.Fatal(err)
	}
	c := pb.NewQueueClient(dialTLS(t, e.tb.addr, e.roots(), nil, tok))
	_, err = c.ListQueues(ctx, &pb.ListQueuesRequest{})
	mustCode(t, "new token before reload", err, codes.Unauthenticated)
	old, err := os.ReadFile(e.files.tokens)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, e.files.tokens, string(old)+line+"\n")
	zktest.WaitFor(t, 30*time.Second, "the added token to work", func() bool {
		_, err := c.ListQueues(ctx, &pb.ListQueuesRequest{})
		return err == nil
	})
	writeFile(t, e.files.tokens, line+"\n") // admin's and worker's old tokens removed
	admin := e.as(t, "admin")
	zktest.WaitFor(t, 30*time.Second, "the removed token to be refused", func() bool {
		_, err := admin.ListQueues(ctx, &pb.ListQueuesRequest{})
		return status.Code(err) == codes.Unauthenticated
	})
	writeFile(t, e.files.tokens, "not a tokens file\n")
	zktest.WaitFor(t, 30*time.Second, "the bad tokens file to be read and refused", func() bool {
		_, _ = c.ListQueues(ctx, &pb.ListQueuesRequest{}) // calls look at the file
		return strings.Contains(e.log.String(), "reload failed")
	})
	if _, err := c.ListQueues(ctx, &pb.ListQueuesRequest{}); err != nil {
		t.Fatalf("after a bad tokens file the previous version must stay: %v", err)
	}

	e.issueServer(t, "server-2")
	zktest.WaitFor(t, 30*time.Second, "the new server certificate", func() bool {
		conn, err := tls.Dial("tcp", e.tb.addr, &tls.Config{RootCAs: e.roots(), NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName == "server-2"
	})
}

// TestEveryMethodMapped: every method the broker serves has an
// authorization entry, and each method of the Queue, Election and Lock
// services checks a named resource with an action (ListQueues filters
// its answer instead).
func TestEveryMethodMapped(t *testing.T) {
	tb := newBroker(t, zktest.Root(t))
	for svc, info := range tb.srv.GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + svc + "/" + m.Name
			public, mapped, _ := broker.MethodAuth(full, nil)
			if !mapped {
				t.Errorf("%s has no authorization entry", full)
			}
			if public && !strings.HasPrefix(svc, "grpc.health.") {
				t.Errorf("%s is public", full)
			}
		}
	}
	for _, name := range []protoreflect.FullName{"qbroker.v1.Queue", "qbroker.v1.Election", "qbroker.v1.Lock", "qbroker.v1.Semaphore"} {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		if err != nil {
			t.Fatal(err)
		}
		methods := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range methods.Len() {
			m := methods.Get(i)
			full := fmt.Sprintf("/%s/%s", name, m.Name())
			mt, err := protoregistry.GlobalTypes.FindMessageByName(m.Input().FullName())
			if err != nil {
				t.Fatal(err)
			}
			msg := mt.New().Interface()
			if f := msg.ProtoReflect().Descriptor().Fields().ByName("name"); f != nil && f.Kind() == protoreflect.StringKind {
				msg.ProtoReflect().Set(f, protoreflect.ValueOfString("n"))
			}
			if f := msg.ProtoReflect().Descriptor().Fields().ByName("subscribe"); f != nil {
				msg.(*pb.ConsumeRequest).Subscribe = &pb.Subscribe{Queue: "n"}
			}
			_, mapped, actions := broker.MethodAuth(full, msg)
			if !mapped {
				t.Errorf("%s is not mapped", full)
				continue
			}
			if len(actions) == 0 && full != pb.Queue_ListQueues_FullMethodName {
				t.Errorf("%s checks no action", full)
			}
		}
	}
}

// TestCoordinationRules: the Lock and Election services need lock and
// election on the name; a denied Lock stream holds nothing, so another
// identity gets the lock at once.
func TestCoordinationRules(t *testing.T) {
	e := newSecureBroker(t, false)
	ctx := callCtx(t)
	cert := clientCert(t, e.ca, "orders-app", time.Time{})
	appConn := dialTLS(t, e.tb.addr, e.roots(), &cert, "")
	adminConn := dialTLS(t, e.tb.addr, e.roots(), nil, e.tokens["admin"])

	s, err := pb.NewLockClient(appConn).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&pb.LockRequest{Name: "nightly"}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Recv()
	mustCode(t, "Lock by orders-app", err, codes.PermissionDenied)
	_, err = pb.NewLockClient(appConn).Revoke(ctx, &pb.RevokeRequest{Name: "nightly"})
	mustCode(t, "Revoke by orders-app", err, codes.PermissionDenied)
	c, err := pb.NewElectionClient(appConn).Campaign(ctx, &pb.CampaignRequest{Name: "scheduler", Value: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Recv()
	mustCode(t, "Campaign by orders-app", err, codes.PermissionDenied)
	_, err = pb.NewElectionClient(appConn).Leader(ctx, &pb.LeaderRequest{Name: "scheduler"})
	mustCode(t, "Leader by orders-app", err, codes.PermissionDenied)

	s, err = pb.NewLockClient(adminConn).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&pb.LockRequest{Name: "nightly"}); err != nil {
		t.Fatal(err)
	}
	ev, err := s.Recv()
	if err != nil || ev.GetType() != pb.LockEvent_TYPE_GRANTED {
		t.Fatalf("admin Lock: got %v, %v; want GRANTED", ev, err)
	}
}
