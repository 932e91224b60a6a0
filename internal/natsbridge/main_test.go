package natsbridge

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/qbroker/qbroker/internal/events"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// runServer starts an in-process nats-server on 127.0.0.1:port (-1: a free
// port) and shuts it down at the end of the test.
func runServer(t testing.TB, port int, jetStream bool) *server.Server {
	t.Helper()
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: jetStream,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	})
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready after 10s")
	}
	return srv
}

func serverPort(t *testing.T, srv *server.Server) int {
	t.Helper()
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		t.Fatalf("server address %v is not TCP", srv.Addr())
	}
	return addr.Port
}

// received is one message seen by a subscriber.
type received struct {
	subject string
	header  nats.Header
	event   events.Event
	raw     map[string]any
}

// subscribe subscribes to subject on srv and returns a channel of the
// decoded messages. The subscription is in place when it returns.
func subscribe(t *testing.T, srv *server.Server, subject string) <-chan received {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatalf("subscriber connect: %v", err)
	}
	t.Cleanup(nc.Close)
	out := make(chan received, 100_000)
	_, err = nc.Subscribe(subject, func(m *nats.Msg) {
		r := received{subject: m.Subject, header: m.Header}
		if err := json.Unmarshal(m.Data, &r.event); err != nil {
			r.event.Queue = "undecodable: " + err.Error()
		}
		_ = json.Unmarshal(m.Data, &r.raw)
		out <- r
	})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("subscriber flush: %v", err)
	}
	return out
}

// receive waits up to timeout for n messages.
func receive(t *testing.T, ch <-chan received, n int, timeout time.Duration) []received {
	t.Helper()
	var got []received
	deadline := time.After(timeout)
	for len(got) < n {
		select {
		case r := <-ch:
			got = append(got, r)
		case <-deadline:
			t.Fatalf("received %d messages in %v, want %d", len(got), timeout, n)
		}
	}
	return got
}

func newBridge(t *testing.T, cfg Config) (*Bridge, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	cfg.Registerer = reg
	if cfg.Logger == nil && testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.Close(ctx) // ErrClosed when the test closed it
	})
	return b, reg
}

func closeBridge(t *testing.T, b *Bridge) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// metricValue returns the value of the series of metric name on reg whose
// labels include the given name/value pairs (0 when there is none).
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}
