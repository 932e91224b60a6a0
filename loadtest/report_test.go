package main

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9+0.002*math.Abs(b) }

func TestSummarize(t *testing.T) {
	h := newHist()
	// 1..1000 ms, one sample each.
	for i := 1; i <= 1000; i++ {
		record(h, time.Duration(i)*time.Millisecond)
	}
	s := summarize(h)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"p50", s.P50MS, 500}, {"p90", s.P90MS, 900}, {"p99", s.P99MS, 990},
		{"p99.9", s.P999MS, 999}, {"max", s.MaxMS, 1000}, {"mean", s.MeanMS, 500.5},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if s.Count != 1000 {
		t.Errorf("count: got %d, want 1000", s.Count)
	}
	// The CDF is monotonic and ends at the max.
	for i := 1; i < len(s.CDF); i++ {
		if s.CDF[i].Percentile < s.CDF[i-1].Percentile || s.CDF[i].MS < s.CDF[i-1].MS {
			t.Fatalf("CDF not monotonic at %d: %v then %v", i, s.CDF[i-1], s.CDF[i])
		}
	}
	if last := s.CDF[len(s.CDF)-1]; last.Percentile != 100 || !near(last.MS, 1000) {
		t.Errorf("CDF ends at %v", last)
	}
	// Buckets count every sample: 1-2ms holds 1, 2-5ms 3, 5-10ms 5, ...
	var n int64
	for _, b := range s.Histogram {
		n += b.Count
	}
	if n != 1000 || s.Histogram[0].FromMS != 1 || s.Histogram[0].Count != 1 || s.Histogram[1].Count != 3 {
		t.Errorf("histogram %v", s.Histogram)
	}
}

func TestSummarizeEmptyAndClamped(t *testing.T) {
	if s := summarize(newHist()); s.Count != 0 || s.P99MS != 0 || s.CDF != nil {
		t.Errorf("empty: got %+v", s)
	}
	h := newHist()
	record(h, -time.Second) // a clock step
	record(h, time.Hour)
	if s := summarize(h); s.Count != 2 || s.MaxMS < 599000 {
		t.Errorf("clamped: got %+v", s)
	}
}

// fakeWorkload is a finished at-least-once run: 10s of publishing, 1s
// of drain, 9000 messages.
func fakeWorkload() *workloadResult {
	start := time.Unix(1700000000, 0)
	pub, e2e := newHist(), newHist()
	for i := range 9000 {
		record(pub, time.Duration(i%10+1)*time.Millisecond)
		record(e2e, time.Duration(i%50+1)*time.Millisecond)
	}
	return &workloadResult{
		Start: start, PublishEnd: start.Add(10 * time.Second), End: start.Add(12 * time.Second),
		Verdict:      Verdict{Published: 9000, Delivered: 9000, Deliveries: 9900, Redeliveries: 900, Acked: 9000, OK: true},
		Publish:      pub,
		EndToEnd:     e2e,
		ErrorsByCode: map[string]int64{"Unavailable": 2, "FailedPrecondition": 1},
		ErrorsByOp:   map[string]int64{"publish": 2, "ack": 1},
		Timeline:     []TimelinePoint{{T: 1, Seconds: 1, Published: 900, Delivered: 850}},
	}
}

func TestBuildReport(t *testing.T) {
	cfg := Config{Mode: qbroker.AtLeastOnce, Producers: 8, Consumers: 64, Duration: 10 * time.Second, Queue: "q"}
	in := reportInput{
		Config:   cfg,
		Topology: &Topology{Brokers: []string{"127.0.0.1:1"}, Spawned: true},
		Workload: fakeWorkload(),
		Counters: &brokerCounters{Conflicts: 495, Delivered: 9900},
		CPU:      &cpuSample{Brokers: 6 * time.Second, ZooKeeper: 12 * time.Second},
		Baselines: []BaselineResult{
			{Name: baselineRaw, PerSec: 15000},
			{Name: baselineNaive, PerSec: 250, ConflictsPerDelivered: 60},
		},
	}
	r := buildReport(in)
	if !r.OK || len(r.Failures) != 0 {
		t.Fatalf("got OK %v, failures %v", r.OK, r.Failures)
	}
	checks := []struct {
		name      string
		got, want float64
	}{
		{"published/s", r.Throughput.PublishedPerSec, 900},
		{"delivered/s", r.Throughput.DeliveredPerSec, 750}, // acked, over 12s
		{"conflicts per delivered", r.Conflicts.PerDelivered, 0.05},
		{"broker cpu per 1k", r.CPU.BrokerPer1k, 6.0 / 9},
		{"zk cpu per 1k", r.CPU.ZooKeeperPer1k, 12.0 / 9},
		{"zk cores", r.CPU.ZooKeeperCores, 1},
		{"vs raw", r.Ratios["vs_raw"], 0.05},
		{"vs naive", r.Ratios["vs_naive"], 3},
		{"errors", float64(r.Errors.Total), 3},
		{"p50 end to end", r.Latency.EndToEnd.P50MS, 25},
	}
	for _, c := range checks {
		if !near(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}

	// The JSON report parses back into the same numbers.
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got := back["config"].(map[string]any)["mode"]; got != "at-least-once" {
		t.Errorf("config.mode: got %v", got)
	}
	if got := back["ratios"].(map[string]any)["vs_raw"].(float64); !near(got, 0.05) {
		t.Errorf("ratios.vs_raw: got %v", got)
	}

	var sum bytes.Buffer
	writeSummary(&sum, r)
	for _, want := range []string{"750 msg/s", "0.050 per message", "qbroker = 0.05x", "qbroker = 3.00x", "result       OK"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum.String())
		}
	}
}

func TestBuildReportFailures(t *testing.T) {
	w := fakeWorkload()
	w.Verdict = Verdict{Published: 10, Delivered: 9, Lost: 1, Problems: []string{"1 lost", "  p0#3 never delivered"}}
	w.Problems = []string{"drain timed out"}
	r := buildReport(reportInput{Config: Config{}, Topology: &Topology{}, Workload: w, Failures: []string{"scrape failed"}})
	if r.OK {
		t.Fatal("got OK for a run with a loss")
	}
	want := []string{"scrape failed", "1 lost", "  p0#3 never delivered", "drain timed out"}
	if strings.Join(r.Failures, "|") != strings.Join(want, "|") {
		t.Errorf("got failures %q, want %q", r.Failures, want)
	}
	if r.CPU != nil || r.Conflicts != nil || r.Ratios != nil {
		t.Errorf("got cpu %v, conflicts %v, ratios %v without inputs", r.CPU, r.Conflicts, r.Ratios)
	}

	// Order violations under --order report warn without failing.
	w = fakeWorkload()
	w.Verdict.OrderViolations, w.Verdict.Warnings = 1, []string{"1 order violation", "  consumer 0 got p0#1 after p0#2"}
	r = buildReport(reportInput{Topology: &Topology{}, Workload: w})
	var sum bytes.Buffer
	writeSummary(&sum, r)
	if !r.OK || len(r.Failures) != 0 || len(r.Warnings) != 2 || !strings.Contains(sum.String(), "warning      consumer 0 got p0#1 after p0#2") {
		t.Errorf("order report: got OK %v, failures %q, warnings %q, summary:\n%s", r.OK, r.Failures, r.Warnings, &sum)
	}

	// Refused publishes (a full queue) are reported apart from uncertain
	// ones, and fail nothing.
	w = fakeWorkload()
	w.Verdict.Uncertain, w.Verdict.Refused = 2, 40
	r = buildReport(reportInput{Topology: &Topology{}, Workload: w})
	sum.Reset()
	writeSummary(&sum, r)
	if !r.OK || !strings.Contains(sum.String(), "9000 published (2 uncertain, 40 refused)") {
		t.Errorf("refusals: got OK %v, summary:\n%s", r.OK, &sum)
	}

	w = fakeWorkload()
	w.Interrupted = true
	if r := buildReport(reportInput{Topology: &Topology{}, Workload: w}); r.OK || !strings.Contains(r.Failures[0], "interrupted") {
		t.Errorf("interrupted: got OK %v, failures %v", r.OK, r.Failures)
	}
}

func TestRenderHTML(t *testing.T) {
	w := fakeWorkload()
	w.Timeline = []TimelinePoint{{T: 1, Seconds: 1, Published: 900}, {T: 2, Seconds: 1, Published: 950, Delivered: 940, Acked: 900}}
	r := buildReport(reportInput{
		Config:    Config{Mode: qbroker.AtLeastOnce, Queue: "q<script>"},
		Topology:  &Topology{Brokers: []string{"127.0.0.1:1"}},
		Workload:  w,
		Baselines: []BaselineResult{{Name: baselineRaw, PerSec: 15000}, {Name: baselineNaive, PerSec: 250}},
	})
	page, err := renderHTML(r)
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	if n := strings.Count(s, "<svg"); n != 5 {
		t.Errorf("got %d charts, want 5 (throughput, 2 histograms, CDF, baselines)", n)
	}
	if strings.Contains(s, "q<script>") {
		t.Error("queue name not escaped")
	}
	// Self-contained: no reference to anything but the SVG namespaces.
	for _, u := range regexp.MustCompile(`(?:src|href)=|https?://[^"' )]+|@import|url\(`).FindAllString(s, -1) {
		if u != "http://www.w3.org/2000/svg" && u != "http://www.w3.org/1999/xlink" {
			t.Errorf("page references %q", u)
		}
	}
}

func TestParseZxid(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want int64
		ok   bool
	}{
		{"standalone", "Zookeeper version: 3.8.4-9316c2a7a97e1666d8f4593f34dd6fc36ecc436c, built on 2024-02-12 22:16 UTC\nLatency min/avg/max: 0/0.6/21\nReceived: 9\nSent: 8\nConnections: 1\nOutstanding: 0\nZxid: 0x1000004a2\nMode: standalone\nNode count: 5", 0x1000004a2, true},
		{"no zxid", "This ZooKeeper instance is not currently serving requests", 0, false},
		{"bad hex", "Zxid: 0xzz", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseZxid(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("got %#x, %v; want %#x, ok %v", got, err, tt.want, tt.ok)
			}
		})
	}
}

func TestZKTxnStats(t *testing.T) {
	const epoch = int64(3) << 32
	tests := []struct {
		name             string
		z0, z1           int64
		delivered        int64
		seconds          float64
		ok               bool
		txns             int64
		perMsg, perSec   float64
		daysPerEpochNear float64
	}{
		{"same epoch", epoch + 100, epoch + 100 + 50_000, 20_000, 10, true, 50_000, 2.5, 5_000, 9.942},
		{"election in between", epoch + 100, epoch + (1 << 32) + 5, 20_000, 10, false, 0, 0, 0, 0},
		{"nothing delivered", epoch, epoch + 10, 0, 1, true, 10, 0, 10, 4_971.03},
		{"no time", epoch, epoch + 10, 5, 0, false, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, ok := zkTxnStats(tt.z0, tt.z1, tt.delivered, tt.seconds)
			if ok != tt.ok || s.Transactions != tt.txns || s.PerDelivered != tt.perMsg || s.PerSec != tt.perSec ||
				math.Abs(s.DaysPerEpoch-tt.daysPerEpochNear) > tt.daysPerEpochNear*1e-3 {
				t.Errorf("got %+v, %v; want %d txns, %v per message, %v/s, %v days per epoch, ok %v",
					s, ok, tt.txns, tt.perMsg, tt.perSec, tt.daysPerEpochNear, tt.ok)
			}
		})
	}
}

func TestJSMaxAckPending(t *testing.T) {
	tests := []struct {
		consumers, prefetch, want int
	}{
		{16, 1, 0},      // the server's default, 1000, holds them all
		{64, 1, 0},      //
		{10, 100, 0},    // exactly 1000
		{16, 100, 1600}, // more than the default: sized to the consumers
		{64, 64, 4096},
	}
	for _, tt := range tests {
		if got := jsMaxAckPending(tt.consumers, tt.prefetch); got != tt.want {
			t.Errorf("jsMaxAckPending(%d, %d): got %d, want %d", tt.consumers, tt.prefetch, got, tt.want)
		}
	}
}

func TestNATSConfig(t *testing.T) {
	for _, sync := range []bool{false, true} {
		got := natsConfig(4222, "/tmp/a dir/store", sync)
		for _, want := range []string{`listen: "127.0.0.1:4222"`, "jetstream {", `store_dir: "/tmp/a dir/store"`} {
			if !strings.Contains(got, want) {
				t.Errorf("sync %v: config lacks %q:\n%s", sync, want, got)
			}
		}
		if has := strings.Contains(got, "sync_interval: always"); has != sync {
			t.Errorf("sync %v: sync_interval: always in the config: %v\n%s", sync, has, got)
		}
	}
}
