package natsbridge

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/qbroker/qbroker/internal/events"
)

// Drop reasons, the values of the reason label of
// qbroker_events_dropped_total.
const (
	ReasonBufferFull   = "buffer_full"
	ReasonPublishError = "publish_error"
	ReasonClosed       = "closed"
)

var allKinds = []events.Kind{
	events.Published, events.Delivered, events.Acked, events.Nacked,
	events.DeadLettered, events.SyncJoined, events.SyncOpened,
}

type metrics struct {
	published  *prometheus.CounterVec
	byKind     map[events.Kind]prometheus.Counter // pre-resolved published counters
	dropped    *prometheus.CounterVec
	dropFull   prometheus.Counter
	dropPub    prometheus.Counter
	dropClosed prometheus.Counter
	reconnects prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "qbroker_events_published_total",
			Help: "Queue events sent to NATS (JetStream: acknowledged by the stream), by event kind.",
		}, []string{"event"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "qbroker_events_dropped_total",
			Help: "Queue events not sent to NATS, by reason (buffer_full, publish_error, closed).",
		}, []string{"reason"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "qbroker_nats_reconnects_total",
			Help: "Reconnections of the event bridge's NATS connection.",
		}),
		byKind: make(map[events.Kind]prometheus.Counter, len(allKinds)),
	}
	for _, k := range allKinds {
		m.byKind[k] = m.published.WithLabelValues(string(k))
	}
	m.dropFull = m.dropped.WithLabelValues(ReasonBufferFull)
	m.dropPub = m.dropped.WithLabelValues(ReasonPublishError)
	m.dropClosed = m.dropped.WithLabelValues(ReasonClosed)
	return m
}

func (m *metrics) publishedInc(k events.Kind) {
	if c, ok := m.byKind[k]; ok {
		c.Inc()
		return
	}
	m.published.WithLabelValues(string(k)).Inc()
}

// RegisterDisabled registers the bridge's metrics on r for a broker that
// runs without the bridge: every series exists and stays at 0
// (qbroker_nats_connected included), so dashboards and alerts work the same
// with or without NATS. It fails like New when the metrics are registered
// already.
func RegisterDisabled(r prometheus.Registerer) error {
	return newMetrics().register(r, nil)
}

// register registers the metrics and a qbroker_nats_connected gauge that
// reads nc's state (0 when nc is nil) on r; on error nothing stays
// registered.
func (m *metrics) register(r prometheus.Registerer, nc *nats.Conn) error {
	if r == nil {
		return nil
	}
	connected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "qbroker_nats_connected",
		Help: "1 when the event bridge's NATS connection is up, else 0.",
	}, func() float64 {
		if nc != nil && nc.IsConnected() {
			return 1
		}
		return 0
	})
	cs := []prometheus.Collector{m.published, m.dropped, m.reconnects, connected}
	for i, c := range cs {
		if err := r.Register(c); err != nil {
			for _, done := range cs[:i] {
				r.Unregister(done)
			}
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return fmt.Errorf("natsbridge: register metrics (one bridge per registry): %w", err)
			}
			return fmt.Errorf("natsbridge: register metrics: %w", err)
		}
	}
	return nil
}
