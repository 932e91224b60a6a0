package broker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

// startLimited is startBroker with the listener wrapped by the broker's
// connection limits (as qbroker serve runs it) and metrics in reg.
func startLimited(t *testing.T, reg *prometheus.Registry, mods ...func(*broker.Config)) *testBroker {
	t.Helper()
	mods = append([]func(*broker.Config){func(c *broker.Config) { c.Registerer = reg }}, mods...)
	return launchBroker(t, []string{zktest.Addr(t)}, zktest.Root(t), brokertest.Options{Limited: true}, mods...)
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// metric returns the value of name's series with labels in reg (summed
// over other labels), or -1.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		m[f.GetName()] = f
	}
	return value(m, name, labels)
}

// Consume streams that never send their subscribe request cannot hold the
// broker's stream limit: beyond MaxStreams they are refused at once, the
// others end after FirstMessageTimeout, every refusal is counted, and a
// legitimate Consume and JoinSync succeed right after.
func TestIdleConsumeStreamsAreEnded(t *testing.T) {
	const (
		maxStreams = 300
		idle       = 2000
		conns      = 4 // spread over connections: MaxStreamsPerConn is 1000
	)
	reg := prometheus.NewRegistry()
	tb := startLimited(t, reg, func(c *broker.Config) {
		c.MaxStreams, c.MaxStreamsPerIdentity = maxStreams, maxStreams // one client, the global limit under test
		c.FirstMessageTimeout = 10 * time.Second
	})
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: "q"})
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: "s", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 2})
	publishN(t, tb.client, "q", 2)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var clients []pb.QueueClient
	for range conns {
		clients = append(clients, pb.NewQueueClient(dial(t, tb.addr)))
	}
	verdicts := openIdleStreams(t, ctx, clients, idle)
	// Meanwhile the limit holds: once the broker has seen every idle
	// stream (and none has timed out yet), a new stream is refused.
	full := false
	zktest.WaitFor(t, time.Minute, "the broker sees the idle streams", func() bool {
		full = metric(t, reg, "qbroker_streams_refused_total", map[string]string{"reason": "max_streams"}) >= idle-maxStreams
		return full || metric(t, reg, "qbroker_streams_refused_total", map[string]string{"reason": "no_subscribe"}) > 0
	})
	if full {
		if _, err := consumeOne(ctx, tb.client, "q"); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("Consume with %d idle streams open: %v, want ResourceExhausted", maxStreams, err)
		}
	} else {
		t.Log("the idle streams began to time out before all were open: no check of the full broker")
	}
	got := verdicts()
	t.Logf("idle streams ended with %v", got)
	if got[codes.ResourceExhausted]+got[codes.InvalidArgument] != idle || got[codes.InvalidArgument] < maxStreams ||
		got[codes.ResourceExhausted] == 0 {
		t.Fatalf("idle streams ended with %v: want ResourceExhausted beyond %d streams, InvalidArgument for the others", got, maxStreams)
	}

	// Right after, legitimate streams work.
	checkStreamsServed(t, ctx, tb.client)

	if n := metric(t, reg, "qbroker_streams_refused_total", map[string]string{"reason": "no_subscribe"}); n != float64(got[codes.InvalidArgument]) {
		t.Fatalf("streams refused no_subscribe = %v, want %d", n, got[codes.InvalidArgument])
	}
	if n := metric(t, reg, "qbroker_streams_refused_total", map[string]string{"reason": "max_streams"}); n < float64(got[codes.ResourceExhausted]) {
		t.Fatalf("streams refused max_streams = %v, want >= %d", n, got[codes.ResourceExhausted])
	}
}

// openIdleStreams opens n Consume streams over clients (in turn) that
// never subscribe. The func returned waits until the broker ended every
// one and counts the codes they ended with.
func openIdleStreams(t *testing.T, ctx context.Context, clients []pb.QueueClient, n int) func() map[codes.Code]int {
	t.Helper()
	codesSeen := make(chan codes.Code, n)
	var wg sync.WaitGroup
	for i := range n {
		s, err := clients[i%len(clients)].Consume(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Recv() // never subscribes: waits for the broker's verdict
			codesSeen <- status.Code(err)
		}()
	}
	return func() map[codes.Code]int {
		wg.Wait()
		close(codesSeen)
		got := map[codes.Code]int{}
		for c := range codesSeen {
			got[c]++
		}
		return got
	}
}

// checkStreamsServed fails the test unless, within 30s, a Consume stream
// of the queue "q" delivers a message, and two members join the sync
// queue "s" (of 2 members).
func checkStreamsServed(t *testing.T, ctx context.Context, c pb.QueueClient) {
	t.Helper()
	var m *pb.Message
	zktest.WaitFor(t, 30*time.Second, "a legitimate Consume", func() bool {
		var err error
		m, err = consumeOne(ctx, c, "q")
		return err == nil
	})
	if m == nil {
		t.Fatal("no message")
	}
	for _, id := range []string{"m1", "m2"} {
		js, err := c.JoinSync(ctx, &pb.JoinSyncRequest{Queue: "s", MemberId: id})
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := js.Recv(); err != nil {
			t.Fatalf("JoinSync %s: %v, %v", id, ev, err)
		}
	}
	waitJoined(t, c, "s", 2)
}

// consumeOne subscribes to queue and returns the first delivery.
func consumeOne(ctx context.Context, c pb.QueueClient, queue string) (*pb.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := c.Consume(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	d, err := s.Recv()
	if err != nil {
		return nil, err
	}
	return d.GetMessage(), nil
}

// rawConns dials n TCP connections to addr that send nothing, or only the
// HTTP/2 client preface when preface is set, and keeps them open until
// the test ends (closed before the broker stops).
func rawConns(t *testing.T, addr string, n int, preface bool) []net.Conn {
	t.Helper()
	out, err := dialRaw(addr, n, preface)
	t.Cleanup(func() { closeAll(out) })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func dialRaw(addr string, n int, preface bool) ([]net.Conn, error) {
	out := make([]net.Conn, 0, n)
	for range n {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			return out, fmt.Errorf("dial %d: %w", len(out), err)
		}
		if preface {
			_, _ = c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
		}
		out = append(out, c)
	}
	return out, nil
}

func closeAll(cs []net.Conn) {
	for _, c := range cs {
		c.Close()
	}
}

// closedByPeer reports whether the server closed c (a read ends) within d.
func closedByPeer(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue // the server's HTTP/2 settings
		}
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
}

// connFlood dials half-open connections in batches of 100, every other
// batch sending the HTTP/2 preface, up to a maximum or until ended. The
// connections stay open until the test ends (closed before the broker
// stops).
type connFlood struct {
	stop     chan struct{}
	underway chan struct{} // closed once the first connections are open
	flooded  chan floodResult
	once     sync.Once
	res      floodResult
}

type floodResult struct {
	conns []net.Conn
	err   error
}

// startFlood starts a flood of up to limit connections to addr, under
// way once first are open.
func startFlood(t *testing.T, addr string, first, limit int) *connFlood {
	f := &connFlood{stop: make(chan struct{}), underway: make(chan struct{}), flooded: make(chan floodResult, 1)}
	go func() {
		var r floodResult
		defer func() { f.flooded <- r }()
		for i := 0; len(r.conns) < limit; i++ {
			if len(r.conns) == first {
				close(f.underway)
			}
			select {
			case <-f.stop:
				return
			default:
			}
			cs, err := dialRaw(addr, 100, i%2 == 1)
			r.conns = append(r.conns, cs...)
			if err != nil {
				r.err = err
				return
			}
		}
	}()
	t.Cleanup(func() { f.end(); closeAll(f.res.conns) }) // before the broker stops
	return f
}

// end stops the flood and returns how many connections it opened and
// why it stopped early, if it did.
func (f *connFlood) end() (int, error) {
	f.once.Do(func() {
		close(f.stop)
		f.res = <-f.flooded
	})
	return len(f.res.conns), f.res.err
}

// reconnectingClient returns a client of addr that reconnects as the Go
// client does (100ms..5s backoff), closed when the test ends.
func reconnectingClient(t *testing.T, addr string) pb.QueueClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewQueueClient(conn)
}

// Thousands of half-open connections (silent, or the preface and nothing
// more) against a broker bounded to 256 connections: the oldest unproven
// ones make room, so a new client's call and an established client's
// calls succeed throughout, and every eviction is counted.
func TestHalfOpenConnectionsDoNotStarveClients(t *testing.T) {
	const maxConns, floodFirst, floodMax = 256, 3000, 15000
	reg := prometheus.NewRegistry()
	tb := startLimited(t, reg, func(c *broker.Config) {
		c.MaxConns = maxConns
		c.HandshakeTimeout = time.Minute // evictions, not timeouts, are under test
	})
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: "q"}) // tb.grpcConn has proven itself

	// The flood goes on while the new client connects.
	f := startFlood(t, tb.addr, floodFirst, floodMax)
	select {
	case <-f.underway:
	case <-time.After(time.Minute):
		t.Fatal("the flood did not get under way")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fresh := reconnectingClient(t, tb.addr)
	start := time.Now()
	// Like the Go client's CreateQueue, the call waits for a connection
	// and is retried when the connection it went out on fails.
	for {
		_, err := fresh.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "r"}, grpc.WaitForReady(true))
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			t.Fatalf("a new client's call during the flood: %v", err)
		}
		t.Logf("retrying after %v", err)
	}
	took := time.Since(start)
	n, err := f.end()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a new client's call during the flood took %v (%d half-open connections by then)", took, n)
	if n >= floodMax {
		t.Fatalf("the call succeeded only once the flood of %d connections was over", n)
	}
	if _, err := tb.client.Stats(ctx, &pb.StatsRequest{Name: "q"}); err != nil {
		t.Fatalf("an established client's call after the flood: %v", err)
	}
	if _, err := fresh.Stats(ctx, &pb.StatsRequest{Name: "r"}); err != nil {
		t.Fatalf("the new client's call after the flood: %v", err)
	}
	// The broker accepts what is left in its listen backlog, evicting.
	var evicted, open float64
	zktest.WaitFor(t, 30*time.Second, fmt.Sprintf("%d half-open connections evicted", n-maxConns), func() bool {
		evicted = metric(t, reg, "qbroker_connections_refused_total", map[string]string{"reason": "evicted_unproven"})
		open = metric(t, reg, "qbroker_connections_open", nil)
		if open > maxConns {
			t.Fatalf("%v connections open, bound %d", open, maxConns)
		}
		return evicted >= float64(n-maxConns)
	})
	t.Logf("%d half-open connections: %v evicted, %v open", n, evicted, open)
}

// When every connection has proven itself, a new one is refused (and
// counted) until one closes; a silent connection is closed after
// HandshakeTimeout; MaxConnsPerIP bounds one address's connections.
func TestConnectionLimits(t *testing.T) {
	t.Run("max_conns", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		tb := startLimited(t, reg, func(c *broker.Config) { c.MaxConns, c.MaxConnsPerIdentity = 3, 3 })
		createQueue(t, tb.client, &pb.CreateQueueRequest{Name: "q"})
		var extra []*grpc.ClientConn
		for range 2 {
			conn := dial(t, tb.addr)
			if _, err := pb.NewQueueClient(conn).Stats(context.Background(), &pb.StatsRequest{Name: "q"}); err != nil {
				t.Fatal(err)
			}
			extra = append(extra, conn)
		}
		c := rawConns(t, tb.addr, 1, false)[0]
		if !closedByPeer(c, 10*time.Second) {
			t.Fatal("a connection beyond the bound of proven ones was not refused")
		}
		// Counted just after the connection is closed.
		zktest.WaitFor(t, 10*time.Second, "max_conns counted", func() bool {
			return metric(t, reg, "qbroker_connections_refused_total", map[string]string{"reason": "max_conns"}) >= 1
		})
		extra[0].Close()
		fresh := pb.NewQueueClient(dial(t, tb.addr))
		zktest.WaitFor(t, 30*time.Second, "a call once a connection closed", func() bool {
			_, err := fresh.Stats(context.Background(), &pb.StatsRequest{Name: "q"})
			return err == nil
		})
	})
	t.Run("handshake_timeout", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		tb := startLimited(t, reg, func(c *broker.Config) { c.HandshakeTimeout = 500 * time.Millisecond })
		c := rawConns(t, tb.addr, 1, false)[0]
		if !closedByPeer(c, 20*time.Second) {
			t.Fatal("a silent connection was not closed")
		}
		zktest.WaitFor(t, 10*time.Second, "handshake_timeout counted", func() bool {
			return metric(t, reg, "qbroker_connections_refused_total", map[string]string{"reason": "handshake_timeout"}) >= 1
		})
		if _, err := tb.client.ListQueues(context.Background(), &pb.ListQueuesRequest{}); err != nil {
			t.Fatalf("a working client after the timeout: %v", err)
		}
	})
	t.Run("per_ip", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		tb := startLimited(t, reg, func(c *broker.Config) { c.MaxConnsPerIP = 3 })
		if _, err := tb.client.ListQueues(context.Background(), &pb.ListQueuesRequest{}); err != nil {
			t.Fatal(err)
		}
		cs := rawConns(t, tb.addr, 3, true) // with tb.grpcConn, one past the bound
		if !closedByPeer(cs[2], 10*time.Second) {
			t.Fatal("a connection beyond the per-address bound was not refused")
		}
		if closedByPeer(cs[0], 200*time.Millisecond) {
			t.Fatal("a connection within the per-address bound was closed")
		}
		zktest.WaitFor(t, 10*time.Second, "per_ip counted", func() bool {
			return metric(t, reg, "qbroker_connections_refused_total", map[string]string{"reason": "per_ip"}) == 1
		})
	})
}
