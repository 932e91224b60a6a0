package console

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// brokerCounters is a registry with the counters and the gauge the
// history reads, labelled as the broker labels them.
type brokerCounters struct {
	reg                 *prometheus.Registry
	pub, del, ack, dead *prometheus.CounterVec
	depth               *prometheus.GaugeVec
}

func newBrokerCounters() *brokerCounters {
	c := &brokerCounters{reg: prometheus.NewRegistry()}
	cv := func(name string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name}, append([]string{"queue"}, labels...))
		c.reg.MustRegister(v)
		return v
	}
	c.pub = cv("qbroker_messages_published_total")
	c.del = cv("qbroker_messages_delivered_total", "mode")
	c.ack = cv("qbroker_messages_acked_total")
	c.dead = cv("qbroker_messages_dead_lettered_total")
	c.depth = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "qbroker_queue_depth"}, []string{"queue"})
	c.reg.MustRegister(c.depth)
	return c
}

// values returns value v of w's points.
func values(w window, v int) []float64 {
	var out []float64
	for _, p := range w.Vals[v] {
		out = append(out, p.V)
	}
	return out
}

func sameValues(got, want []float64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if math.IsNaN(got[i]) != math.IsNaN(want[i]) || !math.IsNaN(got[i]) && math.Abs(got[i]-want[i]) > 1e-6 {
			return false
		}
	}
	return true
}

func TestHistoryRates(t *testing.T) {
	c := newBrokerCounters()
	now := time.Unix(1000, 0)
	h := newHistory(c.reg, 10*time.Second, func() time.Time { return now })
	nan := math.NaN()

	c.pub.WithLabelValues("a").Add(5) // before the first sample: no rate from it
	h.tick()
	c.pub.WithLabelValues("a").Add(20)
	c.del.WithLabelValues("a", "at_most_once").Add(6)
	c.del.WithLabelValues("a", "at_least_once").Add(4)
	c.depth.WithLabelValues("a").Set(7)
	// A queue first seen after the console's first sample counts from 0.
	c.pub.WithLabelValues("b").Add(30)
	now = now.Add(10 * time.Second)
	h.tick()
	c.ack.WithLabelValues("a").Add(10)
	c.dead.WithLabelValues("a").Add(1)
	c.depth.WithLabelValues("a").Set(3)
	now = now.Add(10 * time.Second)
	h.tick()

	a := h.get("a")
	if !a.Known || a.Span != time.Hour || a.Every != 10*time.Second {
		t.Fatalf("a: known %v, span %v, every %v; want known, 1h, 10s", a.Known, a.Span, a.Every)
	}
	for _, tc := range []struct {
		v    int
		want []float64
	}{
		{valPublish, []float64{nan, 2, 0}},
		{valDeliver, []float64{nan, 1, 0}},
		{valAck, []float64{nan, nan, 1}}, // the ack counter appeared with the third sample
		{valDead, []float64{nan, nan, 0.1}},
		{valDepth, []float64{nan, 7, 3}},
	} {
		if got := values(a, tc.v); !sameValues(got, tc.want) {
			t.Errorf("a, value %d: got %v, want %v", tc.v, got, tc.want)
		}
	}
	if got := a.Vals[valPublish][0].Ago; got != 20*time.Second {
		t.Errorf("the oldest sample is %v old, want 20s", got)
	}
	if got := values(h.get("b"), valPublish); !sameValues(got, []float64{nan, 3, 0}) {
		t.Errorf("b published: got %v, want [NaN 3 0]", got)
	}
	if w := h.get("c"); w.Known || w.Skipped {
		t.Errorf("c, never seen: known %v, skipped %v; want neither", w.Known, w.Skipped)
	}
}

// TestHistoryBounded: the ring keeps historyPoints samples however long
// it runs, and at most limit queues.
func TestHistoryBounded(t *testing.T) {
	c := newBrokerCounters()
	now := time.Unix(1000, 0)
	h := newHistory(c.reg, 10*time.Second, func() time.Time { return now })
	h.limit = 3
	if h.n != maxChartPoints+1 {
		t.Fatalf("ring of %d at 10 s, want %d", h.n, maxChartPoints+1)
	}
	for q := range 5 {
		c.pub.WithLabelValues(fmt.Sprint("q", q))
	}
	for i := range 2*h.n + 7 {
		c.pub.WithLabelValues("q0").Add(float64(i % 3))
		h.tick()
		now = now.Add(10 * time.Second)
	}
	w := h.get("q0")
	if len(w.Vals[valPublish]) != h.n {
		t.Fatalf("%d samples kept, want %d", len(w.Vals[valPublish]), h.n)
	}
	if first := w.Vals[valPublish][0].Ago; first != time.Hour {
		t.Fatalf("the oldest sample is %v old, want 1h", first)
	}
	if len(h.queues) != 3 || len(h.skipped) != 2 {
		t.Fatalf("%d queues kept, %d skipped; want 3, 2", len(h.queues), len(h.skipped))
	}
	if w := h.get("q4"); !w.Skipped || w.Known {
		t.Fatalf("q4: skipped %v, known %v; want skipped", w.Skipped, w.Known)
	}
	if n := historyPoints(100 * time.Millisecond); n != maxChartPoints+1 {
		t.Fatalf("ring of %d at 100 ms, want %d", n, maxChartPoints+1)
	}
	if n := historyPoints(time.Hour); n != 3 {
		t.Fatalf("ring of %d at 1 h, want 3", n)
	}
}

// TestHistoryCloses: the sampler takes samples until close, which
// waits for it.
func TestHistoryCloses(t *testing.T) {
	c := newBrokerCounters()
	c.pub.WithLabelValues("a").Inc()
	h := newHistory(c.reg, time.Millisecond, time.Now)
	h.start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		h.mu.Lock()
		n := h.taken
		h.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d samples in 30 s, want 3", n)
		}
		time.Sleep(time.Millisecond)
	}
	h.close()
	h.close() // twice is fine
	h.mu.Lock()
	n := h.taken
	h.mu.Unlock()
	h.tick() // by hand: the sampler is gone, so only this one counts
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.taken != n+1 {
		t.Fatalf("after close: %d samples, want %d", h.taken, n+1)
	}
}

func TestDrawChart(t *testing.T) {
	nan := math.NaN()
	pts := []point{{Ago: time.Hour, V: nan}, {Ago: 40 * time.Minute, V: 0}, {Ago: 30 * time.Minute, V: 3},
		{Ago: 20 * time.Minute, V: nan}, {Ago: 0, V: 1.5}}
	c := drawChart("publish", "Published/s", pts, time.Hour, false)
	if c.Points != 3 || c.NonZero != 2 || c.Peak != "3" || c.Top != "5" || c.Last != "1.5" {
		t.Fatalf("got %+v; want 3 points, 2 non-zero, peak 3, top 5, last 1.5", c)
	}
	// x: -40m at 80, -30m at 120, now at 240; y: 0 at 76, 3 of 5 at 37.6,
	// 1.5 of 5 at 56.8. The gap breaks the line.
	if want := "M80,76L120,37.6M240,56.8"; c.Line != want {
		t.Fatalf("line %q, want %q", c.Line, want)
	}
	if want := "M80,76L80,76L120,37.6L120,76ZM240,76L240,56.8L240,76Z"; c.Area != want {
		t.Fatalf("area %q, want %q", c.Area, want)
	}
	empty := drawChart("depth", "Depth", []point{{V: nan}}, time.Hour, true)
	if empty.Points != 0 || empty.Line != "" || empty.Last != "-" || empty.Top != "1" {
		t.Fatalf("no data: got %+v", empty)
	}
	for _, tc := range []struct{ x, want float64 }{{0, 1}, {0.03, 0.05}, {1, 1}, {1.01, 2}, {7, 10}, {120, 200}, {5000, 5000}} {
		if got := niceTop(tc.x); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("niceTop(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{{time.Hour, "1h"}, {36 * time.Second, "36s"}, {12 * time.Minute, "12m"}, {90 * time.Second, "1m30s"}} {
		if got := shortDuration(tc.d); got != tc.want {
			t.Errorf("shortDuration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
	if d := charts(window{Skipped: true, Span: time.Hour}); !strings.Contains(d.Note, "at most") || d.Charts != nil {
		t.Errorf("skipped queue: %+v", d)
	}
}

// BenchmarkHistoryTick: one sample of 1,000 queues, each with the four
// counters (delivered in both modes) and the depth gauge, the ring full.
// It reports the history's heap per queue.
func BenchmarkHistoryTick(b *testing.B) {
	c := newBrokerCounters()
	for q := range maxChartQueues {
		name := fmt.Sprint("queue-", q)
		c.pub.WithLabelValues(name).Add(1)
		c.del.WithLabelValues(name, "at_most_once").Add(1)
		c.del.WithLabelValues(name, "at_least_once").Add(1)
		c.ack.WithLabelValues(name).Add(1)
		c.dead.WithLabelValues(name).Add(1)
		c.depth.WithLabelValues(name).Set(1)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	now := time.Unix(1000, 0)
	h := newHistory(c.reg, chartEvery, func() time.Time { return now })
	for range h.n {
		h.tick()
		now = now.Add(chartEvery)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perQueue := float64(after.HeapAlloc-before.HeapAlloc) / float64(len(h.queues))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		h.tick()
		now = now.Add(chartEvery)
	}
	b.ReportMetric(perQueue, "heap-B/queue")
	runtime.KeepAlive(h)
}
