package broker_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// logBuffer collects a logger's output for a test.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// has reports whether a line at level contains msg.
func (l *logBuffer) has(level, msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(l.buf.String(), "\n") {
		if strings.Contains(line, "level="+level) && strings.Contains(line, msg) {
			return true
		}
	}
	return false
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func getHealthz(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// A broker cut off from ZooKeeper says so: a warning at once, an error
// once the outage outlasts the session timeout (and when it learns of the
// expiry), qbroker_leader 0, gRPC health NOT_SERVING and /healthz 503 with
// the reason; all of it recovers when ZooKeeper is reachable again.
func TestSessionLossIsLoud(t *testing.T) {
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	var logs logBuffer
	reg := prometheus.NewRegistry()
	tb := startBroker(t, []string{proxy.Addr()}, zktest.Root(t), func(c *broker.Config) {
		c.SessionTimeout = 2 * time.Second
		c.Logger = logs.logger()
		c.Registerer = reg
	})
	hs := httptest.NewServer(tb.b.HealthHandler())
	defer hs.Close()
	leader := func() float64 { return metric(t, reg, "qbroker_leader", nil) }

	zktest.WaitFor(t, 20*time.Second, "leadership", func() bool { return leader() == 1 })
	if code, body := getHealthz(t, hs.URL); code != http.StatusOK || body != "ok" {
		t.Fatalf("/healthz with a session: %d %q", code, body)
	}

	proxy.Cut()
	zktest.WaitFor(t, 20*time.Second, "a warning", func() bool { return logs.has("WARN", "zookeeper session lost") })
	waitHealth(t, tb, healthpb.HealthCheckResponse_NOT_SERVING, 10*time.Second)
	if v := leader(); v != 0 {
		t.Fatalf("qbroker_leader = %v without a session", v)
	}
	code, body := getHealthz(t, hs.URL)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no ZooKeeper session for") {
		t.Fatalf("/healthz without a session: %d %q", code, body)
	}
	if err := tb.b.CheckHealth(); err == nil || !strings.Contains(err.Error(), "no ZooKeeper session") {
		t.Fatalf("CheckHealth without a session: %v", err)
	}
	zktest.WaitFor(t, 20*time.Second, "an error past the session timeout", func() bool {
		return logs.has("ERROR", "longer than the session timeout")
	})
	if _, body := getHealthz(t, hs.URL); !strings.Contains(body, "longer than the session timeout") {
		t.Fatalf("/healthz past the session timeout: %q", body)
	}

	proxy.Restore()
	zktest.WaitFor(t, 30*time.Second, "the expiry reported", func() bool { return logs.has("ERROR", "zookeeper session expired") })
	zktest.WaitFor(t, 30*time.Second, "the session regained", func() bool { return logs.has("INFO", "zookeeper session regained") })
	waitHealth(t, tb, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	zktest.WaitFor(t, 30*time.Second, "/healthz ok", func() bool {
		code, body := getHealthz(t, hs.URL)
		return code == http.StatusOK && body == "ok"
	})
	zktest.WaitFor(t, 30*time.Second, "leadership again", func() bool { return leader() == 1 })
	if err := tb.b.CheckHealth(); err != nil {
		t.Fatalf("CheckHealth after recovery: %v", err)
	}
}
