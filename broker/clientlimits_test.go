package broker_test

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

// plainBearer sends a bearer token without TLS (the broker accepts it;
// these tests are about limits, not transport security).
type plainBearer string

func (b plainBearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (plainBearer) RequireTransportSecurity() bool { return false }

// clientEnv is a broker and a way to connect to it as different clients:
// identities (tokens) when auth is on, else local addresses 127.0.0.x.
type clientEnv struct {
	tb     *testBroker
	tokens map[string]string
}

// startClientEnv starts a broker, with auth on when rules is not empty:
// every identity the rules name gets a token.
func startClientEnv(t *testing.T, rules string, mods ...func(*broker.Config)) *clientEnv {
	t.Helper()
	e := &clientEnv{tokens: map[string]string{}}
	if rules != "" {
		dir := t.TempDir()
		var lines []string
		for _, l := range strings.Split(rules, "\n") {
			f := strings.Fields(l)
			if len(f) == 0 || strings.HasPrefix(f[0], "#") || e.tokens[f[0]] != "" {
				continue
			}
			name := f[0]
			tok, line, err := broker.MintToken(name)
			if err != nil {
				t.Fatal(err)
			}
			e.tokens[name] = tok
			lines = append(lines, line)
		}
		writeFile(t, filepath.Join(dir, "tokens"), strings.Join(lines, "\n")+"\n")
		writeFile(t, filepath.Join(dir, "rules"), rules)
		a, err := broker.NewAuth(broker.AuthConfig{RulesFile: filepath.Join(dir, "rules"),
			TokensFile: filepath.Join(dir, "tokens"), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		mods = append([]func(*broker.Config){func(c *broker.Config) { c.Auth = a }}, mods...)
	}
	e.tb = launchBroker(t, []string{zktest.Addr(t)}, zktest.Root(t), brokertest.Options{}, mods...)
	return e
}

// conn opens a new connection as who: an identity's token with auth on,
// else a local IP address (127.0.0.x) to connect from.
func (e *clientEnv) conn(t *testing.T, who string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if tok, ok := e.tokens[who]; ok {
		opts = append(opts, grpc.WithPerRPCCredentials(plainBearer(tok)))
	} else {
		local := &net.TCPAddr{IP: net.ParseIP(who)}
		if local.IP == nil {
			t.Fatalf("no token or address %q", who)
		}
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: local}
			return d.DialContext(ctx, "tcp", addr)
		}))
	}
	conn, err := grpc.NewClient(e.tb.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// One client (an identity with auth on, an address without) opening as
// many Consume streams as the whole broker serves gets
// MaxStreamsPerIdentity of them, the others refused with
// ResourceExhausted naming the limit; another client's consumer is served
// meanwhile; and a stream the hog closes frees its place.
func TestOneClientCannotHoldEveryStream(t *testing.T) {
	const maxStreams, perClient = 40, 10
	for _, tc := range []struct {
		name           string
		rules          string
		hog, other     string
		hogDescription string
	}{
		{"address", "", "127.0.0.2", "127.0.0.1", "address 127.0.0.2"},
		{"identity", testRules, "worker", "admin", "identity worker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startClientEnv(t, tc.rules, func(c *broker.Config) {
				c.MaxStreams, c.MaxStreamsPerIdentity = maxStreams, perClient
			})
			other := pb.NewQueueClient(e.conn(t, tc.other))
			createQueue(t, other, &pb.CreateQueueRequest{Name: "bait"})
			createQueue(t, other, &pb.CreateQueueRequest{Name: "q"})
			publishN(t, other, "bait", 3*maxStreams) // enough for every stream, with messages claimed ahead
			publishN(t, other, "q", 1)

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			hog := pb.NewQueueClient(e.conn(t, tc.hog))
			var open []pb.Queue_ConsumeClient
			refused := 0
			for i := range maxStreams {
				// One at a time: a stream the broker admits gets a
				// message of bait, a refused one its status.
				s, err := hog.Consume(ctx)
				if err != nil {
					t.Fatal(err)
				}
				_ = s.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "bait"}, Credit: 1})
				_, err = s.Recv()
				if err == nil {
					open = append(open, s)
					continue
				}
				refused++
				want := tc.hogDescription + " has 10 open streams"
				if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), want) ||
					!strings.Contains(err.Error(), "--max-streams-per-identity") {
					t.Fatalf("stream %d: %v, want ResourceExhausted saying %q and naming --max-streams-per-identity", i, err, want)
				}
			}
			// Another client's real consumer is served.
			if m, err := consumeOne(ctx, other, "q"); err != nil || m == nil {
				t.Fatalf("another client's Consume while one holds its limit: %v", err)
			}
			if len(open) != perClient || refused != maxStreams-perClient {
				t.Fatalf("one client opening %d streams: %d open, %d refused; want %d open", maxStreams, len(open), refused, perClient)
			}
			// The hog ends a stream: it may open one again.
			open[0].CloseSend()
			for {
				if _, err := open[0].Recv(); err != nil {
					break
				}
			}
			zktest.WaitFor(t, 30*time.Second, "a stream once one ended", func() bool {
				_, err := consumeOne(ctx, hog, "bait")
				return err == nil
			})
		})
	}
}

// One client making calls on more connections than MaxConnsPerIdentity
// has the call on one more refused with ResourceExhausted naming the
// limit; another client's calls work; a connection that ends frees its
// place.
func TestOneClientConnectionLimit(t *testing.T) {
	const perClient = 3
	for _, tc := range []struct {
		name           string
		rules          string
		hog, other     string
		hogDescription string
	}{
		{"address", "", "127.0.0.2", "127.0.0.1", "address 127.0.0.2"},
		{"identity", testRules, "worker", "admin", "identity worker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			e := startClientEnv(t, tc.rules, func(c *broker.Config) {
				c.MaxConnsPerIdentity, c.Registerer = perClient, reg
			})
			other := pb.NewQueueClient(e.conn(t, tc.other))
			createQueue(t, other, &pb.CreateQueueRequest{Name: "q"})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var conns []*grpc.ClientConn
			for range perClient {
				c := e.conn(t, tc.hog)
				if _, err := pb.NewQueueClient(c).Stats(ctx, &pb.StatsRequest{Name: "q"}); err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
			}
			extra := pb.NewQueueClient(e.conn(t, tc.hog))
			_, err := extra.Stats(ctx, &pb.StatsRequest{Name: "q"})
			want := tc.hogDescription + " has calls on 3 open connections"
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), want) ||
				!strings.Contains(err.Error(), "--max-conns-per-identity") {
				t.Fatalf("a call on connection %d of one client: %v, want ResourceExhausted saying %q and naming --max-conns-per-identity",
					perClient+1, err, want)
			}
			if n := metric(t, reg, "qbroker_connections_refused_total", map[string]string{"reason": "per_identity"}); n != 1 {
				t.Fatalf("connections refused per_identity = %v, want 1", n)
			}
			// The connections within the limit, and another client, work.
			if _, err := pb.NewQueueClient(conns[0]).Stats(ctx, &pb.StatsRequest{Name: "q"}); err != nil {
				t.Fatalf("a call on a connection within the limit: %v", err)
			}
			if _, err := pb.NewQueueClient(e.conn(t, tc.other)).Stats(ctx, &pb.StatsRequest{Name: "q"}); err != nil {
				t.Fatalf("another client's call on a new connection: %v", err)
			}
			// A connection that ends frees its place.
			conns[0].Close()
			zktest.WaitFor(t, 30*time.Second, "a call on a new connection once one ended", func() bool {
				_, err := extra.Stats(ctx, &pb.StatsRequest{Name: "q"})
				return err == nil
			})
		})
	}
}
