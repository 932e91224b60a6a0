package main

import (
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

func TestParsePriorityMix(t *testing.T) {
	tests := []struct {
		in      string
		want    []PriorityShare
		wantErr string
	}{
		{in: "0:10,5:30,9:60", want: []PriorityShare{{0, 10}, {5, 30}, {9, 60}}},
		{in: " 3 : 100 ", want: []PriorityShare{{3, 100}}},
		{in: "0:33.3,1:33.3,2:33.4", want: []PriorityShare{{0, 33.3}, {1, 33.3}, {2, 33.4}}},
		{in: "255:50,0:50", want: []PriorityShare{{255, 50}, {0, 50}}},
		{in: "", wantErr: "empty"},
		{in: "0:10,5:30", wantErr: "add up to 40"},
		{in: "0:50,0:50", wantErr: "given twice"},
		{in: "256:100", wantErr: "priority not in"},
		{in: "-1:100", wantErr: "priority not in"},
		{in: "x:100", wantErr: "priority not in"},
		{in: "0:0,1:100", wantErr: "positive"},
		{in: "0:-10,1:110", wantErr: "positive"},
		{in: "0", wantErr: "want priority:percent"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parsePriorityMix(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, %v, want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, %v, want %v", got, err, tt.want)
			}
		})
	}
}

func TestPickPriority(t *testing.T) {
	mix := []PriorityShare{{0, 10}, {5, 30}, {9, 60}}
	for _, tt := range []struct {
		u    float64
		want int
	}{{0, 0}, {9.99, 0}, {10, 5}, {39.9, 5}, {40, 9}, {99.999, 9}, {100, 9}} {
		if got := pickPriority(mix, tt.u); got != tt.want {
			t.Errorf("pickPriority(%v): got %d, want %d", tt.u, got, tt.want)
		}
	}
}

// parseFlagsCase is a command line and either a check of the Config
// parsed or the usage error it must get.
type parseFlagsCase struct {
	name    string
	args    []string
	check   func(t *testing.T, c Config)
	wantErr string
}

// validFlags are command lines that parse, with a check of the result.
var validFlags = []parseFlagsCase{
	{
		name: "spawn defaults",
		args: []string{"--spawn-brokers", "1"},
		check: func(t *testing.T, c Config) {
			if c.Producers != 8 || c.Consumers != 64 || c.Payload != 100 || c.Duration != 10*time.Second ||
				c.Timeout != 10*time.Minute || c.Mode != qbroker.AtMostOnce || c.Kind != qbroker.KindFIFO {
				t.Errorf("got %+v", c)
			}
			if !reflect.DeepEqual(c.Baselines, []string{"raw", "naive"}) {
				t.Errorf("got baselines %v, want raw,naive", c.Baselines)
			}
			if !strings.HasPrefix(c.Queue, "loadtest-") {
				t.Errorf("got queue %q", c.Queue)
			}
			if c.Order != orderStrict {
				t.Errorf("got order %q with one broker, want strict", c.Order)
			}
		},
	},
	{
		name: "a backlog bounds the run by its count",
		args: []string{"--spawn-brokers", "1", "--backlog", "20000"},
		check: func(t *testing.T, c Config) {
			if c.Backlog != 20000 || c.Messages != 20000 || c.Duration != 0 {
				t.Errorf("got backlog %d, messages %d, duration %v; want 20000, 20000, 0", c.Backlog, c.Messages, c.Duration)
			}
		},
	},
	{
		name: "several brokers only report order violations",
		args: []string{"--spawn-brokers", "2"},
		check: func(t *testing.T, c Config) {
			if c.Order != orderReport {
				t.Errorf("got order %q, want report", c.Order)
			}
		},
	},
	{
		name: "order given",
		args: []string{"--broker", "127.0.0.1:1,127.0.0.1:2", "--order", "strict"},
		check: func(t *testing.T, c Config) {
			if c.Order != orderStrict {
				t.Errorf("got order %q, want strict", c.Order)
			}
		},
	},
	{
		name: "messages alone leave no duration",
		args: []string{"--spawn-brokers", "1", "--messages", "3000"},
		check: func(t *testing.T, c Config) {
			if c.Messages != 3000 || c.Duration != 0 {
				t.Errorf("got messages %d, duration %v, want 3000, 0", c.Messages, c.Duration)
			}
		},
	},
	{
		name: "external brokers without zk have no baselines",
		args: []string{"--broker", "127.0.0.1:7070,127.0.0.1:7071", "--metrics", "localhost:9090,[::1]:9091"},
		check: func(t *testing.T, c Config) {
			if len(c.Brokers) != 2 || len(c.Metrics) != 2 || c.Baselines != nil {
				t.Errorf("got %+v", c)
			}
		},
	},
	{
		name: "priority with default mix",
		args: []string{"--spawn-brokers", "1", "--kind", "priority", "--baselines", "none"},
		check: func(t *testing.T, c Config) {
			if c.Kind != qbroker.KindPriority || len(c.PriorityMix) != 3 || c.Baselines != nil {
				t.Errorf("got kind %v, mix %v, baselines %v", c.Kind, c.PriorityMix, c.Baselines)
			}
		},
	},
	{
		name: "open loop relative to raw, after a warmup",
		args: []string{"--spawn-brokers", "1", "--rate-of-raw", "0.5", "--warmup", "5s"},
		check: func(t *testing.T, c Config) {
			if c.RateOfRaw != 0.5 || c.Rate != 0 || c.Warmup != 5*time.Second {
				t.Errorf("got rate-of-raw %v, rate %v, warmup %v", c.RateOfRaw, c.Rate, c.Warmup)
			}
		},
	},
	{
		name: "confirmed acks and a nats-server binary",
		args: []string{"--spawn-brokers", "1", "--mode", "at-least-once", "--confirm-acks", "--prefetch", "100",
			"--baselines", "jetstream-sync,jetstream", "--nats-server-bin", "/opt/nats-server"},
		check: func(t *testing.T, c Config) {
			if !c.ConfirmAcks || c.Prefetch != 100 || c.NATSServerBin != "/opt/nats-server" ||
				!reflect.DeepEqual(c.Baselines, []string{"jetstream-sync", "jetstream"}) {
				t.Errorf("got confirm-acks %v, prefetch %d, nats-server-bin %q, baselines %v", c.ConfirmAcks, c.Prefetch, c.NATSServerBin, c.Baselines)
			}
		},
	},
	{
		name: "single active consumer",
		args: []string{"--spawn-brokers", "2", "--mode", "at-least-once", "--single-active", "--visibility-timeout", "5s"},
		check: func(t *testing.T, c Config) {
			o := c.queueOptions()
			if !c.SingleActive || !o.SingleActiveConsumer || o.VisibilityTimeout != 5*time.Second {
				t.Errorf("got single-active %v, queue options %+v", c.SingleActive, o)
			}
		},
	},
	{
		name: "packed",
		args: []string{"--spawn-brokers", "1", "--backlog", "1000", "--batch", "100", "--packed"},
		check: func(t *testing.T, c Config) {
			if o := c.queueOptions(); !c.Packed || !o.Packed {
				t.Errorf("got packed %v, queue options %+v", c.Packed, o)
			}
		},
	},
}

// badFlags are command lines refused with a usage error.
var badFlags = []parseFlagsCase{
	{name: "rate and rate-of-raw", args: []string{"--spawn-brokers", "1", "--rate", "100", "--rate-of-raw", "0.5"}, wantErr: "excludes --rate"},
	{name: "rate-of-raw needs zk", args: []string{"--broker", "127.0.0.1:7070", "--rate-of-raw", "0.5"}, wantErr: "needs ZooKeeper"},
	{name: "negative rate-of-raw", args: []string{"--spawn-brokers", "1", "--rate-of-raw", "-1"}, wantErr: "--rate-of-raw"},
	{name: "negative warmup", args: []string{"--spawn-brokers", "1", "--warmup", "-1s"}, wantErr: "--warmup"},
	{name: "no topology", args: nil, wantErr: "--broker"},
	{name: "zk-no-sync needs spawned", args: []string{"--broker", "127.0.0.1:7070", "--zk-no-sync"}, wantErr: "--zk-no-sync needs --spawn-brokers"},
	{name: "both topologies", args: []string{"--spawn-brokers", "1", "--broker", "127.0.0.1:1"}, wantErr: "excludes"},
	{name: "not loopback", args: []string{"--broker", "10.0.0.1:7070"}, wantErr: "not a loopback"},
	{name: "zk not loopback", args: []string{"--broker", "127.0.0.1:7070", "--zk", "example.com:2181"}, wantErr: "not a loopback"},
	{name: "metrics count", args: []string{"--broker", "127.0.0.1:7070", "--metrics", "127.0.0.1:1,127.0.0.1:2"}, wantErr: "2 --metrics addresses for 1"},
	{name: "baselines need zk", args: []string{"--broker", "127.0.0.1:7070", "--baselines", "raw"}, wantErr: "needs --zk"},
	{name: "unknown baseline", args: []string{"--spawn-brokers", "1", "--baselines", "fast"}, wantErr: "unknown baseline"},
	{name: "mix without priority", args: []string{"--spawn-brokers", "1", "--priority-mix", "0:100"}, wantErr: "needs --kind priority"},
	{name: "bad mix", args: []string{"--spawn-brokers", "1", "--kind", "priority", "--priority-mix", "0:50"}, wantErr: "add up to 50"},
	{name: "nack at most once", args: []string{"--spawn-brokers", "1", "--nack-rate", "0.1"}, wantErr: "needs --mode at-least-once"},
	{name: "bad mode", args: []string{"--spawn-brokers", "1", "--mode", "exactly-once"}, wantErr: "--mode"},
	{name: "sync kind", args: []string{"--spawn-brokers", "1", "--kind", "sync"}, wantErr: "--kind"},
	{name: "small payload", args: []string{"--spawn-brokers", "1", "--payload", "10"}, wantErr: "--payload 10"},
	{name: "no bound", args: []string{"--spawn-brokers", "1", "--duration", "0"}, wantErr: "--messages or --duration"},
	{name: "prefetch", args: []string{"--spawn-brokers", "1", "--prefetch", "0"}, wantErr: "--prefetch"},
	{name: "batch", args: []string{"--spawn-brokers", "1", "--batch", "1001"}, wantErr: "--batch"},
	{name: "bad order", args: []string{"--spawn-brokers", "1", "--order", "sometimes"}, wantErr: "--order"},
	{name: "backlog and duration", args: []string{"--spawn-brokers", "1", "--backlog", "10", "--duration", "5s"}, wantErr: "--backlog excludes"},
	{name: "backlog and rate", args: []string{"--spawn-brokers", "1", "--backlog", "10", "--rate", "100"}, wantErr: "--backlog excludes"},
	{name: "negative backlog", args: []string{"--spawn-brokers", "1", "--backlog", "-1"}, wantErr: "--backlog must not be negative"},
	{name: "shallow comparison without a backlog", args: []string{"--spawn-brokers", "1", "--compare-shallow"}, wantErr: "--compare-shallow needs --backlog"},
	{name: "confirmed acks at most once", args: []string{"--spawn-brokers", "1", "--confirm-acks"}, wantErr: "--confirm-acks needs --mode at-least-once"},
	{name: "confirmed acks beyond a Receive", args: []string{"--spawn-brokers", "1", "--mode", "at-least-once", "--confirm-acks", "--prefetch", "101"}, wantErr: "--prefetch at most 100"},
	{name: "single active with Receive", args: []string{"--spawn-brokers", "1", "--mode", "at-least-once", "--single-active", "--confirm-acks"}, wantErr: "--single-active excludes --confirm-acks"},
	{name: "kill without single active", args: []string{"--spawn-brokers", "2", "--kill-active-after", "5s"}, wantErr: "--kill-active-after needs --single-active"},
	{name: "kill with one broker", args: []string{"--spawn-brokers", "1", "--single-active", "--mode", "at-least-once", "--kill-active-after", "5s"}, wantErr: "--kill-active-after needs"},
	{name: "packed and fair", args: []string{"--spawn-brokers", "1", "--rate", "100", "--producers", "2", "--tenants", "2", "--fair", "--packed"}, wantErr: "--packed excludes --fair"},
	{name: "negative visibility timeout", args: []string{"--spawn-brokers", "1", "--visibility-timeout", "-1s"}, wantErr: "--visibility-timeout"},
	{name: "stray argument", args: []string{"--spawn-brokers", "1", "extra"}, wantErr: "unexpected argument"},
}

func TestParseFlags(t *testing.T) {
	for _, tt := range slices.Concat(validFlags, badFlags) {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errUsage) {
					t.Fatalf("got %v, want a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

// Open-loop calls arrive evenly spread, one every Batch/Rate, whatever the
// number of producers, and add up to Rate messages a second.
func TestOpenLoopSchedule(t *testing.T) {
	start := time.Unix(1000, 0)
	for _, tt := range []struct {
		producers, batch int
		rate             float64
	}{{32, 10, 1000}, {32, 1, 1000}, {8, 100, 20000}, {3, 7, 333}} {
		cfg := &Config{Producers: tt.producers, Batch: tt.batch, Rate: tt.rate}
		var due []time.Duration
		period := time.Duration(0)
		for i := range tt.producers {
			first, interval := openLoopSchedule(cfg, i, start)
			period = time.Duration(tt.batch) * interval
			for k := range 3 { // three calls each
				due = append(due, first.Sub(start)+time.Duration(k)*period)
			}
		}
		slices.Sort(due)
		gap := time.Duration(float64(time.Second) * float64(tt.batch) / tt.rate)
		for j := 1; j < len(due); j++ {
			if d := due[j] - due[j-1]; d < gap-time.Microsecond || d > gap+time.Microsecond {
				t.Fatalf("%+v: calls %d and %d are %v apart, want %v", tt, j-1, j, d, gap)
			}
		}
		if got := float64(tt.batch) / period.Seconds() * float64(tt.producers); got < tt.rate*0.999 || got > tt.rate*1.001 {
			t.Errorf("%+v: total %v msg/s", tt, got)
		}
	}
}

// With tenants, each tenant's calls, and the quiet tenants' calls together,
// arrive evenly spread over their interval, not in a burst once a quiet
// interval; without a noisy tenant the schedule is openLoopSchedule's.
func TestTenantSchedule(t *testing.T) {
	start := time.Unix(1000, 0)
	cfg := &Config{Producers: 50, Batch: 1, Rate: 218, Tenants: 10, NoisyFactor: 100}
	quietInterval := tenantInterval(cfg, 1)
	var quiet []time.Duration
	for i := range cfg.Producers {
		first, interval := tenantSchedule(cfg, i, start)
		if interval != tenantInterval(cfg, i) {
			t.Fatalf("producer %d: interval %v, want %v", i, interval, tenantInterval(cfg, i))
		}
		if off := first.Sub(start); off < 0 || off >= interval {
			t.Fatalf("producer %d: first call %v after start, want within its interval %v", i, off, interval)
		}
		if tenantOf(cfg, i) != 0 {
			quiet = append(quiet, first.Sub(start))
		}
	}
	slices.Sort(quiet)
	// 45 quiet producers over a 2.5 s interval: evenly, about 56 ms apart;
	// no two closer than a producer's share of it.
	minGap := quietInterval / time.Duration(cfg.Producers)
	for j := 1; j < len(quiet); j++ {
		if d := quiet[j] - quiet[j-1]; d < minGap-time.Microsecond {
			t.Fatalf("quiet calls %d and %d are %v apart, want at least %v", j-1, j, d, minGap)
		}
	}
	if span := quiet[len(quiet)-1] - quiet[0]; span < quietInterval*8/10 {
		t.Errorf("quiet calls span %v of their %v interval: a burst", span, quietInterval)
	}

	// Without a noisy tenant: the same schedule as openLoopSchedule.
	ref := &Config{Producers: 50, Batch: 1, Rate: 20, Tenants: 10, NoisyFactor: 1}
	for i := range ref.Producers {
		f1, i1 := tenantSchedule(ref, i, start)
		f2, i2 := openLoopSchedule(ref, i, start)
		if d := f1.Sub(f2); d < -time.Microsecond || d > time.Microsecond || i1 != i2 {
			t.Fatalf("producer %d: tenant schedule %v every %v, open loop %v every %v", i, f1.Sub(start), i1, f2.Sub(start), i2)
		}
	}
}
