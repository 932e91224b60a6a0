package console

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRates(t *testing.T) {
	reg := prometheus.NewRegistry()
	pub := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "qbroker_messages_published_total"}, []string{"queue"})
	del := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "qbroker_messages_delivered_total"}, []string{"queue", "mode"})
	reg.MustRegister(pub, del)
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
	// Past the window, the oldest samples give way: the rate covers at
	// most rateWindow and a sample taken since.
	for range 7 {
		now = now.Add(10 * time.Second)
		pub.WithLabelValues("a").Add(10)
		rs, window = r.read()
	}
	if window > rateWindow || window < rateWindow-10*time.Second || rs["a"].Publish != 1 || rs["a"].Deliver != 0 {
		t.Fatalf("later: %v over %v, want a: 1/s published, 0 delivered, over at most %v", rs, window, rateWindow)
	}
}
