package console

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/qbroker/qbroker/internal/zktest"
)

// counters is a registry with the two counters the rates read.
func counters() (*prometheus.Registry, *prometheus.CounterVec, *prometheus.CounterVec) {
	reg := prometheus.NewRegistry()
	pub := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "qbroker_messages_published_total"}, []string{"queue"})
	del := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "qbroker_messages_delivered_total"}, []string{"queue", "mode"})
	reg.MustRegister(pub, del)
	return reg, pub, del
}

func TestRates(t *testing.T) {
	reg, pub, del := counters()
	now := time.Unix(1000, 0)
	r := newRates(reg, func() time.Time { return now })

	if rs, window := r.read(); window != 0 || rs != nil {
		t.Fatalf("at once: %v over %v, want no rate (no earlier sample)", rs, window)
	}
	pub.WithLabelValues("a").Add(20)
	del.WithLabelValues("a", "at_most_once").Add(6)
	del.WithLabelValues("a", "at_least_once").Add(4)
	now = now.Add(10 * time.Second)
	rs, window := r.read()
	if window != 10*time.Second || rs["a"] != (rate{Publish: 2, Deliver: 1}) {
		t.Fatalf("after 10 s: %v over %v, want a: 2/s published, 1/s delivered over 10s", rs, window)
	}
	// Past the window, the oldest samples give way: the rate covers the
	// last rateWindow.
	for range 7 {
		now = now.Add(10 * time.Second)
		pub.WithLabelValues("a").Add(10)
		rs, window = r.read()
	}
	if window != rateWindow || rs["a"].Publish != 1 || rs["a"].Deliver != 0 {
		t.Fatalf("later: %v over %v, want a: 1/s published, 0 delivered, over %v", rs, window, rateWindow)
	}
}

// TestRatesAfterIdle: pages seen ten minutes apart do not show a rate
// over those ten minutes: the rates cover at most rateWindow. The
// sampler's ticks give the next page a rate over the last minute, low
// rates shown with their digits.
func TestRatesAfterIdle(t *testing.T) {
	reg, pub, _ := counters()
	now := time.Unix(1000, 0)
	r := newRates(reg, func() time.Time { return now })
	now = now.Add(10 * time.Second)
	pub.WithLabelValues("a").Add(5)
	if _, window := r.read(); window != 10*time.Second {
		t.Fatalf("after 10 s: window %v, want 10s", window)
	}
	now = now.Add(10 * time.Minute)
	pub.WithLabelValues("a").Add(600)
	if rs, window := r.read(); window > rateWindow || window != 0 || rs != nil {
		t.Fatalf("10 minutes after the last page: %v over %v, want no rate yet (nothing sampled within %v)", rs, window, rateWindow)
	}
	// The sampler ticks every 5 s; one message every 20 s.
	for i := range 24 {
		now = now.Add(sampleEvery)
		if i%4 == 3 {
			pub.WithLabelValues("a").Inc()
		}
		if !r.tick() {
			t.Fatalf("tick %d: the sampler stops although the page was viewed %v ago", i, 2*time.Minute)
		}
	}
	rs, window := r.read()
	if window < rateWindow-sampleEvery || window > rateWindow || rs["a"].Publish < 0.04 || rs["a"].Publish > 0.06 {
		t.Fatalf("sampled: %v over %v, want a: 0.05/s over %v..%v", rs, window, rateWindow-sampleEvery, rateWindow)
	}
	if got := formatRate(rs["a"].Publish); got != "0.05" {
		t.Fatalf("formatRate(%v) = %q, want 0.05", rs["a"].Publish, got)
	}
	// Unviewed for rateIdle, the sampler stops.
	now = now.Add(rateIdle + time.Second)
	if r.tick() {
		t.Fatalf("the sampler goes on %v after the last view", rateIdle+time.Second)
	}
}

// TestRatesSampler: a view starts the sampling goroutine, which takes
// samples on its own; close stops it (the package's leak check would see
// it otherwise).
func TestRatesSampler(t *testing.T) {
	reg, _, _ := counters()
	r := newRates(reg, time.Now)
	r.every = rateGap + rateGap/4
	r.read()
	zktest.WaitFor(t, 30*time.Second, "three samples taken by the sampler", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.samples) >= 3 && r.running
	})
	r.close()
	r.mu.Lock()
	n := len(r.samples)
	r.mu.Unlock()
	r.read() // after close: a rate still, no sampler
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running || len(r.samples) > n+1 {
		t.Fatalf("after close: running %v, %d samples (was %d)", r.running, len(r.samples), n)
	}
}

func TestFormatRate(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{0, "0"}, {-1, "0"}, {1.0 / 60, "0.017"}, {0.05, "0.05"}, {0.5, "0.5"}, {0.999, "1"},
		{2, "2"}, {2.54, "2.5"}, {12.4, "12"}, {340.2, "340"}, {15000.4, "15000"},
	} {
		if got := formatRate(tc.in); got != tc.want {
			t.Errorf("formatRate(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
