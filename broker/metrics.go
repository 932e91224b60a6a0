package broker

import (
	"runtime/debug"
	"sync"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/qbroker/qbroker/internal/connlimit"
)

// metrics are the broker's Prometheus series (listed in doc.go and
// docs/operations.md). Queue-labelled series are bounded by labels: beyond its cap,
// queues share the label "_other".
type metrics struct {
	labels *queueLabels

	published    *prometheus.CounterVec
	duplicates   *prometheus.CounterVec
	delivered    *prometheus.CounterVec
	acked        *prometheus.CounterVec
	nacked       *prometheus.CounterVec
	redelivered  *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	conflicts    *prometheus.CounterVec
	badNodes     *prometheus.CounterVec
	expired      *prometheus.CounterVec
	queueTime    *prometheus.HistogramVec
	packSize     *prometheus.HistogramVec
	zkDuration   *prometheus.HistogramVec
	zkCommit     *prometheus.HistogramVec
	sessionState prometheus.Gauge
	reconnects   prometheus.Counter
	zkData       prometheus.Gauge
	zkBudget     prometheus.Gauge
	depth        *prometheus.GaugeVec
	inFlight     *prometheus.GaugeVec
	dead         *prometheus.GaugeVec
	oldestAge    *prometheus.GaugeVec
	consumers    *prometheus.GaugeVec
	leader       prometheus.Gauge
	grpc         *grpcprom.ServerMetrics

	// expiredUnsent: at-least-once deliveries claimed but given back
	// unsent (lease nearly run out, or session lost, before the send).
	expiredUnsent  *prometheus.CounterVec
	streamsRefused *prometheus.CounterVec
	connsRefused   *prometheus.CounterVec
	connsOpen      prometheus.Gauge

	// The coordination services (coord.go).
	lockWait        prometheus.Histogram
	locksHeld       prometheus.Gauge
	lockRevocations prometheus.Counter
	leaders         prometheus.Gauge

	counterOps       *prometheus.CounterVec
	counterWrites    prometheus.Counter
	counterConflicts prometheus.Counter
	counterRollovers prometheus.Counter
	sem              semaphoreMetrics // coord_semaphore.go
	// The barrier services (coord_barrier.go).
	barrierWaits     prometheus.Gauge
	participants     prometheus.Gauge
	barrierEnterWait prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, labelCap int) *metrics {
	qv := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"queue"}, extra...))
	}
	gv := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"queue"})
	}
	m := &metrics{
		labels:       newQueueLabels(labelCap),
		published:    qv("qbroker_messages_published_total", "Messages published."),
		duplicates:   qv("qbroker_messages_duplicate_total", "Published messages answered as repeats of a dedup id, not published again."),
		delivered:    qv("qbroker_messages_delivered_total", "Messages delivered to consumers, by delivery mode.", "mode"),
		acked:        qv("qbroker_messages_acked_total", "At-least-once deliveries acknowledged."),
		nacked:       qv("qbroker_messages_nacked_total", "At-least-once deliveries negatively acknowledged."),
		redelivered:  qv("qbroker_messages_redelivered_total", "Deliveries of messages delivered before (delivery count > 1)."),
		deadLettered: qv("qbroker_messages_dead_lettered_total", "Messages moved to the dead letters (or dropped) after too many deliveries."),
		conflicts:    qv("qbroker_claim_conflicts_total", "Claims lost to another consumer (NoNode or BadVersion on the head)."),
		badNodes:     qv("qbroker_bad_message_nodes_total", "Message nodes whose data does not decode, skipped and never delivered (Purge deletes them)."),
		expired:      qv("qbroker_messages_expired_total", "Messages removed by their queue's message TTL on this broker (dropped or dead-lettered)."),
		queueTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "qbroker_message_queue_seconds",
			Help:    "Time from publish to delivery (first delivery and redeliveries alike).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60, 600},
		}, []string{"queue"}),
		packSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "qbroker_pack_messages",
			Help:    "Messages per pack written by this broker (packed queues: one node holds a pack).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000},
		}, []string{"queue"}),
		zkDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "qbroker_zk_request_duration_seconds",
			Help:    "ZooKeeper request latency by operation and result.",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"op", "result"}),
		zkCommit: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "qbroker_zk_commit_seconds",
			Help:    "Writes through group commit (claims, acks, releases, publishes), from their submission to their answer: the wait for a batch and a session, and the multi, by result.",
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"result"}),
		sessionState: prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_zk_session_state",
			Help: "1 while the broker has a ZooKeeper session, 0 otherwise."}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "qbroker_zk_reconnects_total",
			Help: "ZooKeeper sessions (re)established after the first."}),
		zkData: prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_zk_data_bytes",
			Help: "ZooKeeper's data as the data budget counts it (approximate data size plus a charge per znode, the largest of the ensemble's servers); -1 while unknown."}),
		zkBudget: prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_zk_data_budget_bytes",
			Help: "The ZooKeeper data budget (--zk-data-budget): publishes are refused before qbroker_zk_data_bytes would pass it; 0 when there is none."}),
		depth:     gv("qbroker_queue_depth", "Ready messages (refreshed periodically for queues this broker serves)."),
		inFlight:  gv("qbroker_queue_in_flight", "Leased (unacknowledged) messages."),
		dead:      gv("qbroker_queue_dead", "Dead letters."),
		oldestAge: gv("qbroker_queue_oldest_age_seconds", "Age of the oldest ready message."),
		consumers: gv("qbroker_consumers", "Consume streams open on this broker."),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_leader",
			Help: "1 while this broker holds leadership (lease sweeping)."}),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
			grpcprom.WithHistogramBuckets([]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30}))),
		streamsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "qbroker_streams_refused_total",
			Help: "Consume and JoinSync streams refused (max_streams, per_identity) or ended for sending no subscribe request in time (no_subscribe)."},
			[]string{"reason"}),
		connsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "qbroker_connections_refused_total",
			Help: "Client connections refused or closed by a limit (max_conns, per_ip, evicted_unproven, handshake_timeout), and calls refused at a client's connection limit (per_identity)."},
			[]string{"reason"}),
		connsOpen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_connections_open",
			Help: "Client connections open on the broker's limited listeners."}),
	}
	m.lockWait = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "qbroker_lock_wait_seconds",
		Help:    "Time from a Lock stream's request to its grant.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60, 600}})
	m.locksHeld = prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_locks_held",
		Help: "Locks held by this broker's Lock streams."})
	m.lockRevocations = prometheus.NewCounter(prometheus.CounterOpts{Name: "qbroker_lock_revocations_total",
		Help: "Revocation requests made through this broker (Revoke calls that reached a holder)."})
	m.leaders = prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_election_leaders",
		Help: "Elections led by this broker's Campaign streams."})
	m.counterOps = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "qbroker_counter_operations_total",
		Help: "Counter service calls answered OK, by op (get, add, compare_and_set, set)."}, []string{"op"})
	for _, op := range []string{"get", "add", "compare_and_set", "set"} {
		m.counterOps.WithLabelValues(op)
	}
	m.counterWrites = prometheus.NewCounter(prometheus.CounterOpts{Name: "qbroker_counter_writes_total",
		Help: "Writes of counters in ZooKeeper (Adds combined into one write count once)."})
	m.counterConflicts = prometheus.NewCounter(prometheus.CounterOpts{Name: "qbroker_counter_conflicts_total",
		Help: "Counter writes and checks refused because the counter had changed since it was read; each is retried."})
	m.counterRollovers = prometheus.NewCounter(prometheus.CounterOpts{Name: "qbroker_counter_rollovers_total",
		Help: "Counter writes that moved the value to a new node before its data version could wrap."})
	m.barrierWaits = prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_barrier_waits",
		Help: "Barrier Wait calls waiting on this broker."})
	m.participants = prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_double_barrier_participants",
		Help: "Double barrier participants of this broker's Enter streams (entering, entered or leaving)."})
	m.barrierEnterWait = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "qbroker_double_barrier_enter_wait_seconds",
		Help:    "Time from a double barrier Enter stream's request to ENTERED.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60, 600}})
	m.expiredUnsent = qv("qbroker_deliveries_expired_unsent_total",
		"At-least-once deliveries claimed but given back unsent: their lease had (nearly) run out, or the ZooKeeper session was lost, before they could be sent.")
	// Refusals have series from the start, at 0, so that a rate over
	// them shows the first refusal (a series appearing at 1 has no
	// earlier sample to count from).
	for _, r := range streamRefusals {
		m.streamsRefused.WithLabelValues(r)
	}
	for _, r := range connlimit.Reasons {
		m.connsRefused.WithLabelValues(string(r))
	}
	m.sem = newSemaphoreMetrics(reg)
	if reg == nil {
		return m
	}
	version := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{Name: "qbroker_build_info",
		Help: "Always 1; the labels describe the build.", ConstLabels: prometheus.Labels{"version": version}})
	build.Set(1)
	for _, c := range []prometheus.Collector{m.published, m.duplicates, m.delivered, m.acked, m.nacked, m.redelivered,
		m.deadLettered, m.conflicts, m.queueTime, m.packSize, m.zkDuration, m.zkCommit, m.sessionState, m.reconnects, m.zkData, m.zkBudget, m.depth, m.inFlight, m.dead,
		m.oldestAge, m.consumers, m.leader, m.grpc, m.expiredUnsent, build, m.streamsRefused, m.connsRefused, m.connsOpen,
		m.lockWait, m.locksHeld, m.lockRevocations, m.leaders, m.badNodes, m.expired,
		m.counterOps, m.counterWrites, m.counterConflicts, m.counterRollovers,
		m.barrierWaits, m.participants, m.barrierEnterWait} {
		reg.MustRegister(c)
	}
	return m
}

// initQueue creates label's counters at 0, so that Prometheus's rate and
// increase see a queue's first event (a series that appears at 1 has no
// earlier sample to count from).
func (m *metrics) initQueue(label string) {
	for _, c := range []*prometheus.CounterVec{m.published, m.duplicates, m.acked, m.nacked, m.redelivered,
		m.deadLettered, m.conflicts, m.badNodes, m.expiredUnsent, m.expired} {
		c.WithLabelValues(label)
	}
	for _, mode := range []string{modeAtMostOnce, modeAtLeastOnce} {
		m.delivered.WithLabelValues(label, mode)
	}
}

// queueLabels bounds the queue label's values: the first cap distinct
// queues keep their name, later ones share "_other", so a client creating
// 100,000 queues cannot grow the broker's series without bound.
type queueLabels struct {
	mu   sync.Mutex
	cap  int
	seen map[string]struct{}
}

// OtherQueue is the label of queues beyond the cap.
const OtherQueue = "_other"

func newQueueLabels(cap int) *queueLabels {
	return &queueLabels{cap: cap, seen: make(map[string]struct{})}
}

func (l *queueLabels) get(queue string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[queue]; ok {
		return queue
	}
	if len(l.seen) >= l.cap {
		return OtherQueue
	}
	l.seen[queue] = struct{}{}
	return queue
}
