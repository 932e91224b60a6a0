package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, zktest.IgnoreGoroutines()...)
}

// spawnForTest starts a ZooKeeper and n brokers built from this tree (with
// the race detector when the test has it; secure: --spawn-secure), and
// returns them and a directory for the test's files. At the test's end it
// fails the test if a broker's log reports a data race, then stops them.
// Without ZooKeeper it skips the test, or fails it in CI.
func spawnForTest(ctx context.Context, t *testing.T, n int, secure bool) (*Topology, string) {
	t.Helper()
	if !zkserver.Installed() {
		if os.Getenv("CI") != "" {
			t.Fatalf("ZooKeeper is required in CI: %v", zkserver.ErrNotInstalled)
		}
		t.Skip(zkserver.ErrNotInstalled)
	}
	dir := t.TempDir()
	bin, err := buildQBroker(ctx, dir, raceEnabled)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := spawnTopology(ctx, n, bin, secure, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range topo.procs {
			if b, _ := os.ReadFile(p.logPath); bytes.Contains(b, []byte("DATA RACE")) {
				t.Errorf("broker log %s reports a data race:\n%s", p.logPath, b)
			}
		}
		topo.Close()
	})
	return topo, dir
}

// TestEndToEnd runs the load test as the command does, against a spawned
// ZooKeeper and two brokers built from this tree, in both delivery modes,
// and checks its verdict and its JSON report. It asserts no timing.
func TestEndToEnd(t *testing.T) {
	// Setup's bound; each case has its own below.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topo, dir := spawnForTest(ctx, t, 2, false)
	// ZooKeeper's JIT compilers compile from its start on: a reading of
	// none means their thread names no longer match.
	if d, ok := jitCPU(topo.zk.Pid()); !ok || d <= 0 {
		t.Errorf("JIT compilers of ZooKeeper (pid %d): %v, ok %v", topo.zk.Pid(), d, ok)
	}

	tests := []struct {
		name      string
		mode      qbroker.DeliveryMode
		nackRate  float64
		batch     int
		baselines []string
		rateOfRaw float64       // open loop relative to raw, which then runs first
		warmup    time.Duration // checked, not reported
		backlog   bool          // the 3000 messages published before the consumers start, then a shallow run of them (warmup: whole backlogs on a queue of its own)
		probe     bool          // --probe
		confirm   bool          // --confirm-acks
		packed    bool          // --packed
	}{
		{name: "at-most-once", mode: qbroker.AtMostOnce, batch: 10, baselines: []string{baselineRaw, baselineNaive, baselineCreate}, rateOfRaw: 0.2},
		{name: "at-least-once", mode: qbroker.AtLeastOnce, nackRate: 0.1, batch: 1, warmup: 300 * time.Millisecond, probe: true},
		{name: "confirmed-acks", mode: qbroker.AtLeastOnce, nackRate: 0.1, batch: 10, confirm: true},
		{name: "backlog", mode: qbroker.AtLeastOnce, batch: 100, backlog: true, baselines: []string{baselineJetStreamSync}, warmup: 200 * time.Millisecond},
		{name: "packed-backlog", mode: qbroker.AtLeastOnce, batch: 100, backlog: true, packed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{
				Producers: 4, Consumers: 8, ConnsPerBroker: 1,
				Messages: 3000, Payload: 100, Batch: tt.batch, Prefetch: 4,
				Mode: tt.mode, NackRate: tt.nackRate, Queue: "e2e-" + tt.name,
				RateOfRaw: tt.rateOfRaw, Warmup: tt.warmup, WarmupMax: 2 * time.Second, Probe: tt.probe, ConfirmAcks: tt.confirm, Packed: tt.packed,
				// Two brokers may invert a consumer's order legitimately;
				// loss and duplicates are what this test asserts.
				Order:     orderReport,
				Baselines: tt.baselines, BaselineDuration: 500 * time.Millisecond,
				RawSessions: 2, RawGoroutines: 4, NaivePrefill: 200,
				Timeout: 2 * time.Minute, DrainTimeout: time.Minute,
				JSONPath: filepath.Join(dir, tt.name+".json"),
				HTMLPath: filepath.Join(dir, tt.name+".html"),
			}
			if tt.backlog {
				cfg.Backlog, cfg.CompareShallow = cfg.Messages, true
			}
			var stdout, stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if code := runOn(ctx, cfg, topo, &stdout, &stderr); code != 0 {
				t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
			}
			if !strings.Contains(stdout.String(), "result       OK") {
				t.Errorf("summary does not say OK:\n%s", &stdout)
			}
			checkReport(t, cfg, tt.baselines)
			if tt.confirm != strings.Contains(stdout.String(), "confirmed acks (Receive, then an Ack call per message)") {
				t.Errorf("confirm-acks %v, summary:\n%s", tt.confirm, &stdout)
			}
			if tt.probe {
				checkProbe(t, cfg, topo, stdout.String())
			}
			if w := readReport(t, cfg.JSONPath).Warmup; (w != nil) != (tt.warmup > 0) ||
				w != nil && (w.Seconds < tt.warmup.Seconds() || w.JITCores == nil) {
				t.Errorf("warmup %v, report's %+v", tt.warmup, w)
			}
			if !strings.Contains(stdout.String(), "zk cost      per message ") {
				t.Errorf("summary lacks the ZooKeeper cost line:\n%s", &stdout)
			}
			if page, err := os.ReadFile(cfg.HTMLPath); err != nil || !bytes.Contains(page, []byte("<svg")) {
				t.Errorf("HTML report: %v, %d bytes without a chart", err, len(page))
			}
		})
	}
}

// jsonReport is the JSON report as a user reads it back: the fields
// checkReport checks.
type jsonReport struct {
	OK       bool `json:"ok"`
	Topology struct {
		Brokers []string `json:"brokers"`
		Spawned bool     `json:"spawned"`
	} `json:"topology"`
	Config struct {
		Mode     string  `json:"mode"`
		Messages int     `json:"messages"`
		NackRate float64 `json:"nack_rate"`
		Rate     float64 `json:"rate"`
		Packed   bool    `json:"packed"`
	} `json:"config"`
	PublishSeconds float64     `json:"publish_seconds"`
	Seconds        float64     `json:"seconds"`
	Kill           *KillReport `json:"kill"`
	DrainSeconds   float64     `json:"drain_seconds"`
	Throughput     struct {
		Published       int64   `json:"published"`
		Delivered       int64   `json:"delivered"`
		PublishedPerSec float64 `json:"published_per_sec"`
		DeliveredPerSec float64 `json:"delivered_per_sec"`
	} `json:"throughput"`
	Latency map[string]struct {
		Count int64   `json:"count"`
		P50   float64 `json:"p50_ms"`
		P999  float64 `json:"p99_9_ms"`
		Max   float64 `json:"max_ms"`
	} `json:"latency"`
	Check     Verdict `json:"check"`
	Conflicts *struct {
		Broker       brokerCounters `json:"broker"`
		PerDelivered float64        `json:"per_delivered"`
	} `json:"conflicts"`
	CPU       *CPUStats        `json:"cpu"`
	DrainCPU  *CPUStats        `json:"drain_cpu"`
	ZooKeeper *ZKTxnStats      `json:"zookeeper"`
	ZKCost    *ZKCost          `json:"zk_cost"`
	Baselines []BaselineResult `json:"baselines"`
	Deep      *DeepReport      `json:"deep"`
	Probe     *LoadProbe       `json:"probe"`
	Warmup    *WarmupReport    `json:"warmup"`
	Ratios    map[string]float64
	Timeline  []TimelinePoint `json:"timeline"`
}

// readReport reads a JSON report back as a user of it would.
func readReport(t *testing.T, path string) jsonReport {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r jsonReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("report does not parse: %v\n%s", err, b)
	}
	return r
}

// checkReport checks the JSON report of a run.
func checkReport(t *testing.T, cfg Config, baselines []string) {
	t.Helper()
	r := readReport(t, cfg.JSONPath)
	v := r.Check
	if !r.OK || !v.OK || v.Lost != 0 || v.Duplicates != 0 || v.Corrupt != 0 || v.Unknown != 0 || v.IDMismatches != 0 {
		t.Errorf("verdict: ok %v, %+v", r.OK, v)
	}
	if v.Published != 3000 || v.Delivered != 3000 || r.Throughput.Published != 3000 || r.Throughput.Delivered != 3000 {
		t.Errorf("got %d published, %d delivered (throughput %+v), want 3000", v.Published, v.Delivered, r.Throughput)
	}
	if r.Config.Mode != cfg.Mode.String() || r.Config.Messages != 3000 || len(r.Topology.Brokers) != 2 || !r.Topology.Spawned {
		t.Errorf("config %+v, topology %+v", r.Config, r.Topology)
	}
	if r.Throughput.PublishedPerSec <= 0 || r.Throughput.DeliveredPerSec <= 0 {
		t.Errorf("throughput %+v", r.Throughput)
	}
	for _, name := range []string{"publish", "end_to_end"} {
		l := r.Latency[name]
		if l.Count == 0 || l.P50 <= 0 || l.P999 < l.P50 || l.Max < l.P999 {
			t.Errorf("latency %s: %+v", name, l)
		}
	}
	if r.Conflicts == nil || r.Conflicts.Broker.Delivered < 3000 || r.Conflicts.Broker.Published != 3000 || r.Conflicts.PerDelivered < 0 {
		t.Errorf("broker counters: %+v", r.Conflicts)
	}
	if r.CPU == nil || r.CPU.BrokerPer1k <= 0 || r.CPU.ZooKeeperPer1k <= 0 {
		t.Errorf("cpu: %+v", r.CPU)
	}
	if cfg.Backlog > 0 && (r.DrainSeconds <= 0 || r.PublishSeconds+r.DrainSeconds > r.Seconds*1.01) {
		t.Errorf("backlog: published in %vs, drained in %vs, run %vs", r.PublishSeconds, r.DrainSeconds, r.Seconds)
	}
	// The drain's CPU is part of the run's, which holds the publishing too.
	switch d := r.DrainCPU; {
	case cfg.Backlog == 0 && d != nil:
		t.Errorf("drain cpu without a backlog: %+v", d)
	case cfg.Backlog > 0 && (d == nil || r.CPU == nil):
		t.Errorf("drain cpu %+v, run cpu %+v", d, r.CPU)
	case cfg.Backlog > 0 && (d.BrokerSeconds <= 0 || d.BrokerSeconds > r.CPU.BrokerSeconds || d.ZooKeeperSeconds <= 0 ||
		d.ZooKeeperSeconds > r.CPU.ZooKeeperSeconds || d.LoadtestPer1k <= 0 || d.LoadtestSeconds > r.CPU.LoadtestSeconds):
		t.Errorf("drain cpu %+v not within the run's %+v", d, r.CPU)
	}
	if cfg.Backlog > 0 {
		d := r.Deep
		if d == nil || d.Messages != 3000 || d.PublishPerSec <= 0 || d.ConsumePerSec <= 0 || d.PeakRSSBytes < 1<<20 {
			t.Errorf("deep figures: %+v", d)
		} else if d.Shallow == nil || !d.Shallow.OK || d.Shallow.ConsumePerSec <= 0 || d.ConsumeRatio <= 0 ||
			d.Cold == nil || d.Cold.StartSeconds <= 0 || d.Cold.FirstDeliverySeconds <= 0 {
			t.Errorf("deep figures: shallow %+v, ratio %v, cold %+v", d.Shallow, d.ConsumeRatio, d.Cold)
		}
	} else if r.Deep != nil {
		t.Errorf("deep figures without a backlog: %+v", r.Deep)
	}
	if cfg.Mode == qbroker.AtLeastOnce && v.Acked != 3000 {
		t.Errorf("at least once: %d acked, want 3000", v.Acked)
	}
	if cfg.NackRate > 0 {
		// About 300 of 3000 are nacked once, so redelivered.
		if v.Redeliveries < 100 || r.Conflicts == nil || r.Conflicts.Broker.Nacked < 100 {
			t.Errorf("nacks: %d redeliveries, broker %+v", v.Redeliveries, r.Conflicts)
		}
	}
	if z := r.ZooKeeper; z == nil || z.Transactions <= 0 || z.PerDelivered <= 0 || z.PerSec <= 0 || z.DaysPerEpoch <= 0 {
		t.Errorf("ZooKeeper transactions: %+v", z)
	}
	checkZKCost(t, cfg, r)
	// At least once, a JetStream baseline gives a result per ack style.
	var want []string
	for _, b := range baselines {
		want = append(want, b)
		if (b == baselineJetStream || b == baselineJetStreamSync) && cfg.Mode == qbroker.AtLeastOnce {
			want = append(want, b+doubleAckSuffix)
		}
	}
	if len(r.Baselines) != len(want) {
		t.Fatalf("got baselines %+v, want %v", r.Baselines, want)
	}
	for i, bl := range r.Baselines {
		if bl.Name != want[i] || bl.Messages <= 0 || bl.PerSec <= 0 || r.Ratios["vs_"+bl.Name] <= 0 {
			t.Errorf("baseline %+v, ratio %v", bl, r.Ratios["vs_"+bl.Name])
		}
		if strings.HasPrefix(bl.Name, baselineJetStream) && (bl.Messages != 3000 || bl.ServerCPUSecPer1k <= 0) {
			t.Errorf("JetStream baseline: %d messages (want 3000), nats-server %vs per 1k", bl.Messages, bl.ServerCPUSecPer1k)
		}
		if bl.Name == baselineCreate && (bl.Latency == nil || bl.Latency.Count == 0 || bl.Latency.P50MS <= 0) {
			t.Errorf("create baseline without latencies: %+v", bl)
		}
	}
	if cfg.RateOfRaw > 0 {
		if want := cfg.RateOfRaw * r.Baselines[0].PerSec; r.Config.Rate < want*0.999 || r.Config.Rate > want*1.001 {
			t.Errorf("open loop at %v msg/s, want %v of raw %v", r.Config.Rate, cfg.RateOfRaw, r.Baselines[0].PerSec)
		}
	}
	if len(r.Timeline) == 0 {
		t.Error("empty timeline")
	}
	if !cfg.Probe && r.Probe != nil {
		t.Errorf("probe figures without --probe: %+v", r.Probe)
	}
}

// checkProbe checks the figures of --probe in both reports, and that the
// probe removed the nodes it created.
func checkProbe(t *testing.T, cfg Config, topo *Topology, summary string) {
	t.Helper()
	p := readReport(t, cfg.JSONPath).Probe
	if p == nil || p.IntervalMS <= 0 || p.PingErrors != 0 || p.CreateErrors != 0 ||
		p.Ping.Count == 0 || p.Ping.P50MS <= 0 || p.Create.Count == 0 || p.Create.P50MS <= 0 {
		t.Fatalf("probe figures: %+v", p)
	}
	if !strings.Contains(summary, "under load   ping p50 ") {
		t.Errorf("summary lacks the probe's line:\n%s", summary)
	}
	conns, err := openSessions(topo.ZooKeeper, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSessions(conns)
	if ok, _, err := conns[0].Exists(baselineRoot(cfg.Queue) + "/probe"); err != nil || ok {
		t.Errorf("the probe's node: exists %v, %v; want it removed", ok, err)
	}
}

// checkZKCost checks what the report says a message cost ZooKeeper: with
// a backlog, per message published, with the nodes, data and live heap
// it added; otherwise per message delivered. It asserts no figure beyond
// its sign: how many messages a node holds is the engine's.
func checkZKCost(t *testing.T, cfg Config, r jsonReport) {
	t.Helper()
	if r.Config.Packed != cfg.Packed {
		t.Errorf("config.packed %v, want %v", r.Config.Packed, cfg.Packed)
	}
	c := r.ZKCost
	switch {
	case c == nil:
		t.Errorf("no ZooKeeper cost per message")
	case cfg.Backlog == 0:
		if c.Per != "delivered" || c.Messages != 3000 || c.Transactions <= 0 || c.Requests <= 0 || c.Znodes != 0 {
			t.Errorf("ZooKeeper cost per message delivered: %+v", c)
		}
	default:
		if c.Per != "published" || c.Messages != 3000 || c.Transactions <= 0 || c.Requests <= 0 ||
			c.Znodes <= 0 || c.ZnodesPerMessage <= 0 || c.MessagesPerZnode <= 0 || c.DataBytesPerMessage <= 0 {
			t.Errorf("ZooKeeper cost per message of the backlog: %+v", c)
		}
		if _, err := exec.LookPath("jcmd"); (err == nil) != (c.HeapNote == "") {
			t.Errorf("live heap per message: %v B, note %q; jcmd on the PATH: %v", c.HeapBytesPerMessage, c.HeapNote, err == nil)
		}
	}
}
