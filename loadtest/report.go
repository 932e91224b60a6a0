package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Report is the outcome of a run: the JSON report (--json) as is, the
// source of the human summary and of the HTML page.
type Report struct {
	Version     int            `json:"version"`
	Started     time.Time      `json:"started"`
	Config      reportConfig   `json:"config"`
	Topology    reportTopology `json:"topology"`
	OK          bool           `json:"ok"`
	Failures    []string       `json:"failures,omitempty"`
	Interrupted bool           `json:"interrupted,omitempty"`
	// Warnings are reported without failing the run.
	Warnings []string `json:"warnings,omitempty"`
	// PublishSeconds: from the first publish to the last producer's
	// end; Seconds: to the last message delivered (acked).
	PublishSeconds float64 `json:"publish_seconds"`
	Seconds        float64 `json:"seconds"`
	// DrainSeconds: with a backlog, from the consumers' start to the
	// last message delivered (acked); the delivered rate is over it.
	DrainSeconds float64    `json:"drain_seconds,omitempty"`
	Throughput   Throughput `json:"throughput"`
	Latency      Latencies  `json:"latency"`
	// Warmup: with --warmup, how long it ran (it goes on past --warmup
	// while a spawned ZooKeeper is still compiling; warm.go).
	Warmup *WarmupReport `json:"warmup,omitempty"`
	// Probe: with --probe, the hops of a publish timed alone while
	// the producers published (probe.go).
	Probe *LoadProbe `json:"probe,omitempty"`
	// Kill: with --kill-active-after, the broker killed and when.
	Kill      *KillReport    `json:"kill,omitempty"`
	Check     Verdict        `json:"check"`
	Errors    ErrorStats     `json:"errors"`
	Conflicts *ConflictStats `json:"conflicts,omitempty"`
	CPU       *CPUStats      `json:"cpu,omitempty"`
	// DrainCPU: with a backlog, the CPU time of the drain alone, per
	// message drained.
	DrainCPU *CPUStats `json:"drain_cpu,omitempty"`
	// ZooKeeper: its transactions over the run (from its zxid), when
	// ZooKeeper is known and no leader election came in between.
	ZooKeeper *ZKTxnStats `json:"zookeeper,omitempty"`
	// ZKCost: what a message cost ZooKeeper (zkcost.go): per message
	// delivered, or with a backlog per message of it published.
	ZKCost    *ZKCost          `json:"zk_cost,omitempty"`
	Baselines []BaselineResult `json:"baselines,omitempty"`
	// Ratios: qbroker's delivered/s divided by each baseline's rate.
	Ratios map[string]float64 `json:"ratios,omitempty"`
	// Deep: with a backlog, the deep queue's figures (deep.go).
	Deep     *DeepReport     `json:"deep,omitempty"`
	Timeline []TimelinePoint `json:"timeline"`

	// Tenants: with --tenants, each tenant's time in queue (tenants.go).
	Tenants []TenantLatency `json:"tenants,omitempty"`
}

const reportVersion = 1

type reportConfig struct {
	Config
	DurationSeconds         float64 `json:"duration_seconds"`
	WarmupSeconds           float64 `json:"warmup_seconds,omitempty"`
	BaselineDurationSeconds float64 `json:"baseline_duration_seconds"`
	TimeoutSeconds          float64 `json:"timeout_seconds"`
}

type reportTopology struct {
	Brokers   []string `json:"brokers"`
	Metrics   []string `json:"metrics,omitempty"`
	ZooKeeper string   `json:"zookeeper,omitempty"`
	Spawned   bool     `json:"spawned"`
}

// Throughput counts distinct messages: delivered means delivered at most
// once, or acked at least once.
type Throughput struct {
	Published       int64   `json:"published"`
	Delivered       int64   `json:"delivered"`
	PublishedPerSec float64 `json:"published_per_sec"`
	DeliveredPerSec float64 `json:"delivered_per_sec"`
	TargetRate      float64 `json:"target_rate,omitempty"`
	// MaxSendLagMS: open loop, the most a publish started after it was
	// due.
	MaxSendLagMS float64 `json:"max_send_lag_ms,omitempty"`
}

// Latencies: Publish is the duration of each publish call (one sample per
// call, so per batch); EndToEnd is from a message's send time (its due
// time in open loop) to its first delivery.
type Latencies struct {
	Publish  LatencySummary `json:"publish"`
	EndToEnd LatencySummary `json:"end_to_end"`
}

// ErrorStats counts the errors of client calls by gRPC code and by call.
type ErrorStats struct {
	Total  int64            `json:"total"`
	ByCode map[string]int64 `json:"by_code"`
	ByOp   map[string]int64 `json:"by_op"`
}

// ConflictStats are the brokers' counters over the run: claims lost to
// another consumer per message delivered, and the brokers' ZooKeeper
// requests per message delivered, by "op/result".
type ConflictStats struct {
	Broker                 brokerCounters     `json:"broker"`
	PerDelivered           float64            `json:"per_delivered"`
	ZKRequestsPerDelivered map[string]float64 `json:"zk_requests_per_delivered,omitempty"`
}

// CPUStats is the CPU time of the spawned processes over the run.
type CPUStats struct {
	BrokerSeconds    float64 `json:"broker_seconds"`
	ZooKeeperSeconds float64 `json:"zookeeper_seconds"`
	BrokerPer1k      float64 `json:"broker_seconds_per_1k"`
	ZooKeeperPer1k   float64 `json:"zookeeper_seconds_per_1k"`
	// Cores: average CPU use over the run (1 = one core busy).
	BrokerCores    float64 `json:"broker_cores"`
	ZooKeeperCores float64 `json:"zookeeper_cores"`
	// The load test's own producers and consumers share the machine.
	LoadtestSeconds float64 `json:"loadtest_seconds"`
	LoadtestCores   float64 `json:"loadtest_cores"`
	LoadtestPer1k   float64 `json:"loadtest_seconds_per_1k"`
}

// reportInput is everything a report is assembled from.
type reportInput struct {
	Config    Config
	Topology  *Topology
	Started   time.Time
	Workload  *workloadResult
	Counters  *brokerCounters // broker counters' delta; nil when not scraped
	CPU       *cpuSample      // spawned processes' CPU delta; nil when unknown
	DrainCPU  *cpuSample      // the same over a backlog's drain; nil when none
	Zxids     *[2]int64       // ZooKeeper's last zxid before and after; nil when unknown
	BacklogZK *[2]zkReading   // with a backlog: ZooKeeper before and after its publishing
	Baselines []BaselineResult
	Deep      *DeepReport   // with a backlog
	Warmup    *WarmupReport // with --warmup
	Probe     *LoadProbe    // with --probe
	Kill      *KillReport   // with --kill-active-after
	Failures  []string      // run-level failures (setup, scrape, baselines)
}

// buildReport assembles a report. It does no I/O.
func buildReport(in reportInput) *Report {
	c := in.Config
	w := in.Workload
	r := &Report{
		Version: reportVersion,
		Started: in.Started,
		Config: reportConfig{Config: c, DurationSeconds: c.Duration.Seconds(), WarmupSeconds: c.Warmup.Seconds(),
			BaselineDurationSeconds: c.BaselineDuration.Seconds(), TimeoutSeconds: c.Timeout.Seconds()},
		Topology: reportTopology{Brokers: in.Topology.Brokers, Metrics: in.Topology.Metrics,
			ZooKeeper: in.Topology.ZooKeeper, Spawned: in.Topology.Spawned},
		Interrupted:    w.Interrupted,
		PublishSeconds: w.PublishEnd.Sub(w.Start).Seconds(),
		Seconds:        w.End.Sub(w.Start).Seconds(),
		Check:          w.Verdict,
		Baselines:      in.Baselines,
		Timeline:       w.Timeline,
		Deep:           in.Deep,
		Warmup:         in.Warmup,
		Probe:          in.Probe,
		Kill:           in.Kill,
		Tenants:        w.Tenants,
	}
	delivered := w.Verdict.Delivered
	if c.Mode == qbroker.AtLeastOnce {
		delivered = w.Verdict.Acked
	}
	deliverSeconds := r.Seconds
	if !w.DrainStart.IsZero() {
		r.DrainSeconds = w.End.Sub(w.DrainStart).Seconds()
		deliverSeconds = r.DrainSeconds
	}
	r.Throughput = Throughput{
		Published:       w.Verdict.Published,
		Delivered:       delivered,
		PublishedPerSec: perSec(w.Verdict.Published, r.PublishSeconds),
		DeliveredPerSec: perSec(delivered, deliverSeconds),
		TargetRate:      c.Rate,
		MaxSendLagMS:    float64(w.MaxSendLag) / float64(time.Millisecond),
	}
	r.Latency = Latencies{Publish: summarize(w.Publish), EndToEnd: summarize(w.EndToEnd)}
	r.Errors = ErrorStats{ByCode: w.ErrorsByCode, ByOp: w.ErrorsByOp}
	for _, n := range w.ErrorsByCode {
		r.Errors.Total += n
	}
	if in.Counters != nil {
		r.Conflicts = conflictStats(*in.Counters)
	}
	if in.CPU != nil && r.Seconds > 0 {
		r.CPU = cpuStats(*in.CPU, r.Seconds, delivered)
	}
	if in.DrainCPU != nil && r.DrainSeconds > 0 {
		r.DrainCPU = cpuStats(*in.DrainCPU, r.DrainSeconds, delivered)
	}
	if z := in.Zxids; z != nil {
		if st, ok := zkTxnStats(z[0], z[1], delivered, r.Seconds); ok {
			r.ZooKeeper = &st
		}
	}
	if c.Backlog > 0 {
		if z := in.BacklogZK; z != nil {
			r.ZKCost = backlogCost(z[0], z[1], w.Verdict.Published)
		}
	} else {
		r.ZKCost = runCost(r.ZooKeeper, in.Counters, delivered)
	}
	for _, b := range in.Baselines {
		if b.PerSec > 0 {
			if r.Ratios == nil {
				r.Ratios = map[string]float64{}
			}
			r.Ratios["vs_"+b.Name] = r.Throughput.DeliveredPerSec / b.PerSec
		}
	}
	r.Failures = slices.Clone(in.Failures)
	if w.Interrupted {
		r.Failures = append(r.Failures, "interrupted before every message was delivered: no verdict")
	}
	r.Failures = append(r.Failures, w.Verdict.Problems...)
	r.Failures = append(r.Failures, w.Problems...)
	r.Warnings = w.Verdict.Warnings
	r.OK = len(r.Failures) == 0 && w.Verdict.OK
	if !r.OK && len(r.Failures) == 0 {
		r.Failures = []string{"check failed"}
	}
	return r
}

// conflictStats relates the brokers' counters over the run to the
// messages they delivered.
func conflictStats(bc brokerCounters) *ConflictStats {
	cs := &ConflictStats{Broker: bc}
	if d := bc.Delivered; d > 0 {
		cs.PerDelivered = bc.Conflicts / d
		for k, v := range bc.ZKRequests {
			if cs.ZKRequestsPerDelivered == nil {
				cs.ZKRequestsPerDelivered = map[string]float64{}
			}
			cs.ZKRequestsPerDelivered[k] = v / d
		}
	}
	return cs
}

// cpuStats relates the CPU time over a run of seconds (> 0) to the run's
// length and to the messages delivered.
func cpuStats(cpu cpuSample, seconds float64, delivered int64) *CPUStats {
	st := &CPUStats{
		BrokerSeconds:    cpu.Brokers.Seconds(),
		ZooKeeperSeconds: cpu.ZooKeeper.Seconds(),
		BrokerCores:      cpu.Brokers.Seconds() / seconds,
		ZooKeeperCores:   cpu.ZooKeeper.Seconds() / seconds,
		LoadtestSeconds:  cpu.Self.Seconds(),
		LoadtestCores:    cpu.Self.Seconds() / seconds,
	}
	if delivered > 0 {
		st.BrokerPer1k = st.BrokerSeconds / float64(delivered) * 1000
		st.ZooKeeperPer1k = st.ZooKeeperSeconds / float64(delivered) * 1000
		st.LoadtestPer1k = st.LoadtestSeconds / float64(delivered) * 1000
	}
	return st
}

func perSec(n int64, sec float64) float64 {
	if sec <= 0 {
		return 0
	}
	return float64(n) / sec
}

// writeJSON writes the report to path.
func writeJSON(path string, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// writeSummary prints the human summary.
func writeSummary(out io.Writer, r *Report) {
	var b strings.Builder
	c := r.Config
	writeRun(&b, r)
	t := r.Throughput
	if r.DrainSeconds > 0 {
		fmt.Fprintf(&b, "throughput   published %d in %.1fs = %.0f msg/s, then drained %d in %.1fs = %.0f msg/s\n",
			t.Published, r.PublishSeconds, t.PublishedPerSec, t.Delivered, r.DrainSeconds, t.DeliveredPerSec)
	} else {
		fmt.Fprintf(&b, "throughput   published %d in %.1fs = %.0f msg/s; delivered %d in %.1fs = %.0f msg/s\n",
			t.Published, r.PublishSeconds, t.PublishedPerSec, t.Delivered, r.Seconds, t.DeliveredPerSec)
	}
	if r.Deep != nil {
		writeDeep(&b, r.Deep)
	}
	writeLatency(&b, "publish call", r.Latency.Publish)
	if p := r.Probe; p != nil {
		fmt.Fprintf(&b, "under load   ping p50 %s p99 %s, bare create p50 %s p99 %s (one of each every %gms while publishing; %d and %d failed)\n",
			ms(p.Ping.P50MS), ms(p.Ping.P99MS), ms(p.Create.P50MS), ms(p.Create.P99MS), p.IntervalMS, p.PingErrors, p.CreateErrors)
	}
	writeLatency(&b, "end to end", r.Latency.EndToEnd)
	writeTenants(&b, r.Tenants, r.Config.Fair)
	if r.Conflicts != nil {
		fmt.Fprintf(&b, "conflicts    %.0f lost claims for %.0f broker deliveries = %.3f per message\n",
			r.Conflicts.Broker.Conflicts, r.Conflicts.Broker.Delivered, r.Conflicts.PerDelivered)
		if z := r.Conflicts.ZKRequestsPerDelivered; len(z) > 0 {
			keys := slices.Sorted(maps.Keys(z))
			b.WriteString("zk requests  per message:")
			for _, k := range keys {
				fmt.Fprintf(&b, " %s %.2f", k, z[k])
			}
			b.WriteString("\n")
		}
	}
	if r.CPU != nil {
		fmt.Fprintf(&b, "cpu          brokers %.2fs (%.2f cores) = %.3fs per 1k msgs; ZooKeeper %.2fs (%.2f cores) = %.3fs per 1k msgs; servers together %.3fs per 1k msgs; load test %.2f cores\n",
			r.CPU.BrokerSeconds, r.CPU.BrokerCores, r.CPU.BrokerPer1k, r.CPU.ZooKeeperSeconds, r.CPU.ZooKeeperCores, r.CPU.ZooKeeperPer1k,
			r.CPU.BrokerPer1k+r.CPU.ZooKeeperPer1k, r.CPU.LoadtestCores)
	}
	if d := r.DrainCPU; d != nil {
		fmt.Fprintf(&b, "cpu drain    brokers %.2f cores, ZooKeeper %.2f, load test %.2f, together %.2f; per 1k msgs brokers %.3fs, ZooKeeper %.3fs, load test %.3fs, together %.3fs\n",
			d.BrokerCores, d.ZooKeeperCores, d.LoadtestCores, d.BrokerCores+d.ZooKeeperCores+d.LoadtestCores,
			d.BrokerPer1k, d.ZooKeeperPer1k, d.LoadtestPer1k, d.BrokerPer1k+d.ZooKeeperPer1k+d.LoadtestPer1k)
	}
	if z := r.ZooKeeper; z != nil {
		fmt.Fprintf(&b, "zk txns      %d transactions = %.2f per message, %.0f/s: the zxid counter of a leader (2^32) lasts %.1f days at this rate\n",
			z.Transactions, z.PerDelivered, z.PerSec, z.DaysPerEpoch)
	}
	if r.ZKCost != nil {
		writeZKCost(&b, r.ZKCost)
	}
	fmt.Fprintf(&b, "errors       %d", r.Errors.Total)
	if r.Errors.Total > 0 {
		fmt.Fprintf(&b, " by code %v, by call %v", r.Errors.ByCode, r.Errors.ByOp)
	}
	b.WriteString("\n")
	writeBaselines(&b, r)
	v := r.Check
	fmt.Fprintf(&b, "check        %d published (%d uncertain, %d refused), %d delivered, %d deliveries, %d redeliveries",
		v.Published, v.Uncertain, v.Refused, v.Delivered, v.Deliveries, v.Redeliveries)
	if c.Mode == qbroker.AtLeastOnce {
		fmt.Fprintf(&b, ", %d acked", v.Acked)
		if v.AckedAgain > 0 {
			fmt.Fprintf(&b, " (%d again: their first ack died with the killed broker)", v.AckedAgain)
		}
	}
	fmt.Fprintf(&b, "; lost %d, duplicates %d, order violations %d\n", v.Lost, v.Duplicates, v.OrderViolations)
	if a := v.SingleActive; a != nil {
		takeover := "none"
		if a.Handovers > 0 {
			takeover = "longest takeover " + ms(a.MaxTakeoverMS)
		}
		fmt.Fprintf(&b, "single active %d stream(s) held deliveries, %d handover(s) (%s); overlaps %d\n",
			a.Streams, a.Handovers, takeover, a.Overlaps)
	}
	if k := r.Kill; k != nil {
		fmt.Fprintf(&b, "killed       broker %s (the active stream's) with SIGKILL %.1fs into the publishing; broker counters not summed\n",
			k.Broker, k.After)
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(&b, "warning      %s\n", strings.TrimSpace(w))
	}
	if r.OK {
		b.WriteString("result       OK\n")
	} else {
		b.WriteString("result       FAILED\n")
	}
	fmt.Fprint(out, b.String())
}

// writeRun prints the topology and the workload, then a blank line.
func writeRun(b *strings.Builder, r *Report) {
	c := r.Config
	topo := fmt.Sprintf("%d broker(s) at %s", len(r.Topology.Brokers), strings.Join(r.Topology.Brokers, ","))
	if r.Topology.Spawned {
		topo = fmt.Sprintf("%d spawned broker(s), ZooKeeper %s", len(r.Topology.Brokers), r.Topology.ZooKeeper)
		if c.ZKNoSync {
			topo += " without a sync per transaction (forceSync=no)"
		}
	}
	fmt.Fprintf(b, "qbroker load test: %s\n", topo)
	fmt.Fprintf(b, "  %s %s queue %s, %d producers, %d consumers (prefetch %d), payload %d B, batch %d",
		c.Mode, c.Kind, c.Queue, c.Producers, c.Consumers, c.Prefetch, c.Payload, c.Batch)
	if c.Rate > 0 {
		fmt.Fprintf(b, ", open loop at %.0f msg/s", c.Rate)
		if c.RateOfRaw > 0 {
			fmt.Fprintf(b, " (%.2f of raw)", c.RateOfRaw)
		}
		fmt.Fprintf(b, " (publishes started at most %s late)", ms(r.Throughput.MaxSendLagMS))
	} else {
		b.WriteString(", closed loop")
	}
	if c.Mode == qbroker.AtLeastOnce {
		switch {
		case c.ConfirmAcks:
			b.WriteString(", confirmed acks (Receive, then an Ack call per message)")
		case c.ConfirmOnStream:
			b.WriteString(", confirmed acks on the Consume stream (each ack waits for the broker's confirmation)")
		default:
			b.WriteString(", acks on the Consume stream (not confirmed)")
		}
	}
	if c.NackRate > 0 {
		fmt.Fprintf(b, ", nack rate %.2f", c.NackRate)
	}
	if c.Backlog > 0 {
		fmt.Fprintf(b, ", a backlog of %d published before the consumers started", c.Backlog)
	}
	switch w := r.Warmup; {
	case w != nil && w.JITCores != nil:
		fmt.Fprintf(b, ", measured after a %.0fs warmup (ZooKeeper's JIT compilers at %.2f cores in its last %.0fs)",
			w.Seconds, *w.JITCores, w.LastRunSeconds)
	case w != nil:
		fmt.Fprintf(b, ", measured after a %.0fs warmup", w.Seconds)
	}
	b.WriteString("\n\n")
}

// writeBaselines prints a line a baseline, with qbroker's ratio to it.
func writeBaselines(b *strings.Builder, r *Report) {
	for _, bl := range r.Baselines {
		switch bl.Name {
		case baselineRaw:
			fmt.Fprintf(b, "baseline     raw ZooKeeper create+delete: %.0f pairs/s (%d sessions, %d goroutines)",
				bl.PerSec, bl.Sessions, bl.Goroutines)
		case baselineNaive:
			fmt.Fprintf(b, "baseline     naive consumers (seeds' recipe): %.0f msg/s, %.1f lost races per message (%d consumers, depth %d)",
				bl.PerSec, bl.ConflictsPerDelivered, bl.Sessions, bl.Prefill)
		case baselineCreate:
			fmt.Fprintf(b, "baseline     bare ZooKeeper create, one a call: %.0f/s (%d sessions); create p50 %s, p99 %s; qbroker publish call p50 %s, p99 %s",
				bl.PerSec, bl.Sessions, ms(bl.Latency.P50MS), ms(bl.Latency.P99MS), ms(r.Latency.Publish.P50MS), ms(r.Latency.Publish.P99MS))
		default:
			fmt.Fprintf(b, "baseline     %s: %s: %.0f msg/s", bl.Name, jetStreamLabel(bl), bl.PerSec)
		}
		if bl.ZooKeeperCPUSecPer1k > 0 {
			fmt.Fprintf(b, "; ZooKeeper %.3fs per 1k", bl.ZooKeeperCPUSecPer1k)
		}
		if bl.ServerCPUSecPer1k > 0 {
			fmt.Fprintf(b, "; nats-server %.3fs per 1k (%.2f cores)", bl.ServerCPUSecPer1k, bl.ServerCores)
		}
		if ratio, ok := r.Ratios["vs_"+bl.Name]; ok {
			fmt.Fprintf(b, "; qbroker = %.2fx", ratio)
		}
		b.WriteString("\n")
	}
}

// jetStreamLabel describes a JetStream baseline's set-up for the
// summary.
func jetStreamLabel(bl BaselineResult) string {
	sync := "files synced every 2 minutes (the default)"
	if strings.HasPrefix(bl.Name, baselineJetStreamSync) {
		sync = "sync_interval: always"
	}
	ack := fmt.Sprintf("Ack, not waited for (MaxAckPending %d)", bl.MaxAckPending)
	if bl.Ack == jsAckDouble {
		ack = fmt.Sprintf("DoubleAck, each waited for (MaxAckPending %d)", bl.MaxAckPending)
	}
	return fmt.Sprintf("NATS JetStream work queue on a nats-server process, %s, a connection per worker, %s", sync, ack)
}

func writeLatency(b *strings.Builder, name string, s LatencySummary) {
	if s.Count == 0 {
		fmt.Fprintf(b, "%-12s no samples\n", name)
		return
	}
	fmt.Fprintf(b, "%-12s p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (%d samples)\n",
		name, ms(s.P50MS), ms(s.P90MS), ms(s.P99MS), ms(s.P999MS), ms(s.MaxMS), s.Count)
}

// ms formats milliseconds with a sensible precision.
func ms(v float64) string {
	switch {
	case v < 1:
		return fmt.Sprintf("%.3fms", v)
	case v < 100:
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.0fms", v)
}
