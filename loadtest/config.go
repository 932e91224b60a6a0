package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/zkqueue"
)

// Config is one load test: the topology, the workload, the baselines and
// the outputs. parseFlags builds it; the e2e test fills it directly.
type Config struct {
	// Topology: existing brokers, or spawned ones.
	Brokers      []string `json:"brokers,omitempty"`
	Metrics      []string `json:"metrics,omitempty"`
	ZooKeeper    string   `json:"zookeeper,omitempty"`
	SpawnBrokers int      `json:"spawn_brokers"`
	QBrokerBin   string   `json:"-"`
	Security     Security `json:"security"` // TLS and credentials (security.go)

	// Workload.
	Producers      int `json:"producers"`
	Consumers      int `json:"consumers"`
	ConnsPerBroker int `json:"conns_per_broker"`
	Messages       int `json:"messages"`
	// Backlog, when set, publishes that many messages before any
	// consumer starts, then measures how fast the consumers drain them.
	Backlog int `json:"backlog,omitempty"`
	// CompareShallow, with Backlog, runs the same messages again with the
	// consumers subscribed first, and reports the two side by side.
	CompareShallow bool                 `json:"compare_shallow,omitempty"`
	Duration       time.Duration        `json:"-"`
	Payload        int                  `json:"payload_bytes"`
	Kind           qbroker.QueueKind    `json:"kind"`
	PriorityMix    []PriorityShare      `json:"priority_mix,omitempty"`
	Mode           qbroker.DeliveryMode `json:"mode"`
	NackRate       float64              `json:"nack_rate"`
	Batch          int                  `json:"batch"`
	Rate           float64              `json:"rate"`
	// RateOfRaw, when set, runs the raw baseline first and sets Rate to
	// this fraction of its throughput: latency at a load relative to the
	// ceiling measured in the same run.
	RateOfRaw float64       `json:"rate_of_raw,omitempty"`
	Warmup    time.Duration `json:"-"`
	WarmupMax time.Duration `json:"-"`
	Prefetch  int           `json:"prefetch"`
	// ConfirmAcks: at least once, consumers take messages with Receive
	// and ack each with the Ack call, which returns once the ack is
	// committed, instead of acking on a Consume stream (sent, not
	// confirmed).
	ConfirmAcks bool `json:"confirm_acks,omitempty"`
	// ConfirmOnStream: at least once, consumers ack on their Consume
	// stream and each ack waits for the broker's confirmation that it
	// committed (ConsumeOptions.Confirm).
	ConfirmOnStream bool `json:"confirm_on_stream,omitempty"`
	// ZKNoSync: the spawned ZooKeeper does not sync its log before it
	// applies a transaction (forceSync=no), the durability of JetStream's
	// default; the report says so.
	ZKNoSync bool `json:"zk_no_sync,omitempty"`
	// Probe times a ping and a bare create beside the producers
	// (probe.go).
	Probe bool   `json:"probe,omitempty"`
	Queue string `json:"queue"`
	Order string `json:"order"`

	// Tenants (tenants.go): producers publish for this many tenants, t0
	// at NoisyFactor times the others' rate; Fair creates the queue with
	// fair dispatch by tenant; consumers spend Work on each message.
	Tenants     int           `json:"tenants,omitempty"`
	NoisyFactor float64       `json:"noisy_factor,omitempty"`
	Fair        bool          `json:"fair,omitempty"`
	Work        time.Duration `json:"-"`
	// SingleActive creates the queue with single active consumer, and
	// the checker fails the run if two streams held deliveries at once
	// (active.go).
	SingleActive bool `json:"single_active,omitempty"`
	// KillActiveAfter, with SingleActive and spawned brokers: this long
	// into the publishing, the broker serving the active stream is
	// killed with SIGKILL (kill.go); 0: none.
	KillActiveAfter time.Duration `json:"-"`
	// VisibilityTimeout, when set, is the queue's lease of at-least-once
	// deliveries (the broker's default otherwise).
	VisibilityTimeout time.Duration `json:"-"`
	// Packed creates the queue with packed storage (many messages per
	// ZooKeeper node); the report's ZooKeeper cost per message (zkcost.go)
	// shows what it saves.
	Packed bool `json:"packed,omitempty"`

	// Baselines.
	Baselines        []string      `json:"baselines"`
	BaselineDuration time.Duration `json:"-"`
	RawSessions      int           `json:"raw_sessions"`
	RawGoroutines    int           `json:"raw_goroutines_per_session"`
	NaivePrefill     int           `json:"naive_prefill"`
	NATSServerBin    string        `json:"-"`

	// Bounds and outputs.
	Timeout      time.Duration `json:"-"`
	DrainTimeout time.Duration `json:"-"`
	JSONPath     string        `json:"-"`
	HTMLPath     string        `json:"-"`
	CPUProfile   string        `json:"-"`
	Progress     bool          `json:"-"`
}

// PriorityShare is one term of --priority-mix: Percent of the messages
// get Priority.
type PriorityShare struct {
	Priority int     `json:"priority"`
	Percent  float64 `json:"percent"`
}

// Order checking: strict fails the run on an order violation, report
// only counts them.
const (
	orderStrict = "strict"
	orderReport = "report"
)

// Baseline names.
const (
	baselineRaw   = "raw"
	baselineNaive = "naive"
)

// defaultPriorityMix is used for --kind priority without --priority-mix.
const defaultPriorityMix = "0:10,5:30,9:60"

// errUsage marks a command-line error (exit status 2).
var errUsage = errors.New("usage")

// parseFlags parses the command line into a validated Config.
func parseFlags(args []string, out io.Writer) (Config, error) {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(out)
	var c Config
	f := defineFlags(fs, &c)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, err
		}
		return Config{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if err := c.complete(f, set); err != nil {
		return Config{}, err
	}
	return c, nil
}

// pendingFlags are the flags that become Config fields only once all
// flags are read.
type pendingFlags struct {
	brokers, metrics, baselines string
	kind, mode, mix             string
	noProgress                  bool
}

// defineFlags defines the flags on fs: most set c's fields, the others
// the pendingFlags returned.
func defineFlags(fs *flag.FlagSet, c *Config) *pendingFlags {
	f := &pendingFlags{}
	fs.StringVar(&f.brokers, "broker", "", "existing brokers' gRPC addresses, host:port,... (loopback only)")
	fs.StringVar(&f.metrics, "metrics", "", "existing brokers' /metrics addresses, host:port,... (for claim conflicts)")
	fs.StringVar(&c.ZooKeeper, "zk", "", "ZooKeeper host:port of existing brokers, for the baselines")
	fs.IntVar(&c.SpawnBrokers, "spawn-brokers", 0, "start a local ZooKeeper and this many brokers, and measure them")
	fs.StringVar(&c.QBrokerBin, "qbroker-bin", "", "qbroker binary for --spawn-brokers (default: go build ./cmd/qbroker)")
	fs.IntVar(&c.Producers, "producers", 8, "producer goroutines")
	fs.IntVar(&c.Consumers, "consumers", 64, "consumers (one Consume stream each)")
	fs.IntVar(&c.ConnsPerBroker, "conns-per-broker", 1, "client connections per broker, shared round-robin by producers and consumers; 0: one per producer or consumer")
	fs.IntVar(&c.Messages, "messages", 0, "messages to publish in all (0: until --duration)")
	fs.IntVar(&c.Backlog, "backlog", 0, "publish this many messages before the consumers start, then measure the drain (sets --messages; excludes --duration, --rate); with --spawn-brokers also the first delivery of a broker started on the backlog and the brokers' peak RSS")
	fs.BoolVar(&c.CompareShallow, "compare-shallow", false, "with --backlog: then run the same messages with the consumers subscribed first (a shallow queue) and report both")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "how long producers publish (0 with --messages: until all are published)")
	fs.IntVar(&c.Payload, "payload", 100, fmt.Sprintf("payload bytes (at least %d, the load test's header)", headerLen))
	fs.StringVar(&f.kind, "kind", "fifo", "queue kind: fifo or priority")
	fs.StringVar(&f.mix, "priority-mix", "", "priority:percent,... for --kind priority (default "+defaultPriorityMix+")")
	fs.StringVar(&f.mode, "mode", "at-most-once", "delivery mode: at-most-once or at-least-once")
	fs.Float64Var(&c.NackRate, "nack-rate", 0, "fraction of messages nacked once before being acked (at-least-once)")
	fs.IntVar(&c.Batch, "batch", 1, "messages per publish call (PublishBatch)")
	fs.Float64Var(&c.Rate, "rate", 0, "open loop: total publish rate in messages/s (0: closed loop, as fast as possible)")
	fs.Float64Var(&c.RateOfRaw, "rate-of-raw", 0, "open loop at this fraction of the raw baseline, which then runs first (0.5: half the ceiling); excludes --rate")
	fs.DurationVar(&c.Warmup, "warmup", 0, "run the same workload this long first (checked, not measured), so JIT and caches are warm, and with a spawned ZooKeeper on in runs of 5s until its JIT compilers are quiet (under 0.05 cores); with --backlog, whole backlogs on a queue of their own")
	fs.DurationVar(&c.WarmupMax, "warmup-max", 2*time.Minute, "bound on --warmup's runs past its duration")
	fs.BoolVar(&c.Probe, "probe", false, "while the producers publish, time a round trip to a broker (ping) and a bare ZooKeeper create on a session of its own, one of each every 2ms: the hops of a publish on the machine as loaded (needs ZooKeeper: --spawn-brokers or --zk)")
	fs.IntVar(&c.Prefetch, "prefetch", 1, "messages each consumer may have in flight (1..1000)")
	fs.BoolVar(&c.ZKNoSync, "zk-no-sync", false, "with --spawn-brokers: run ZooKeeper with forceSync=no (transactions applied before their log is synced, as JetStream's default durability; a machine crash loses the last ones), to compare like with like")
	fs.BoolVar(&c.ConfirmAcks, "confirm-acks", false, "at least once: consumers take up to --prefetch (at most 100) messages with Receive and ack each with the Ack call, which returns once the ack is committed, instead of acking on a Consume stream")
	fs.BoolVar(&c.ConfirmOnStream, "confirm-on-stream", false, "at least once: consumers ack on their Consume stream and each ack waits for the broker's confirmation that it committed (ConsumeOptions.Confirm)")
	fs.StringVar(&c.Queue, "queue", "", "queue name (default loadtest-<time>-<random>); created, deleted at the end")
	fs.IntVar(&c.Tenants, "tenants", 0, "publish for this many tenants (a \"tenant\" header), tenant t0 at --noisy-factor times the others' rate, sharing the open-loop --rate; the report gives each tenant's time in queue")
	fs.Float64Var(&c.NoisyFactor, "noisy-factor", 1, "with --tenants: tenant t0 publishes this many times the rate of each other tenant")
	fs.BoolVar(&c.Fair, "fair", false, "with --tenants: create the queue with fair dispatch by the tenant header")
	fs.BoolVar(&c.SingleActive, "single-active", false, "create the queue with single active consumer (one stream at a time across brokers); the check fails if two streams held deliveries at once and reports the handovers and the longest takeover")
	fs.DurationVar(&c.KillActiveAfter, "kill-active-after", 0, "with --single-active and at least 2 spawned brokers: SIGKILL the broker serving the active stream this long into the publishing; the report gives the takeover")
	fs.DurationVar(&c.VisibilityTimeout, "visibility-timeout", 0, "create the queue with this lease of at-least-once deliveries (0: the broker's default); with --single-active it bounds a takeover after a broker dies")
	fs.BoolVar(&c.Packed, "packed", false, "create the queue with packed storage (a publish's batch, and the publishes gathered with it, in one ZooKeeper node); the report's ZooKeeper cost per message shows what it saves")
	fs.DurationVar(&c.Work, "work", 0, "time each consumer spends on a message before settling it (0..1s): bounds the consumers' rate")
	fs.StringVar(&c.Order, "order", "auto", "order violations: strict (fail the run), report, or auto: strict with one broker, report with several")
	fs.StringVar(&f.baselines, "baselines", "", "comma-separated baselines: raw, naive, create (latency of one bare create per call, one session per producer), jetstream (NATS JetStream work queue on a nats-server process, default sync), jetstream-sync (sync_interval: always); at least once each runs with Ack and with DoubleAck, or none (default raw,naive when ZooKeeper is known)")
	fs.DurationVar(&c.BaselineDuration, "baseline-duration", 10*time.Second, "bound of each baseline")
	fs.IntVar(&c.RawSessions, "raw-sessions", 24, "raw baseline: ZooKeeper sessions")
	fs.IntVar(&c.RawGoroutines, "raw-goroutines", 16, "raw baseline: goroutines per session")
	fs.IntVar(&c.NaivePrefill, "naive-prefill", 2000, "naive baseline: messages in the queue when its consumers start")
	fs.StringVar(&c.NATSServerBin, "nats-server-bin", "", "nats-server binary for the jetstream baselines (default: go build "+natsServerModule+", the version go.mod requires)")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "hard bound of the whole run")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 60*time.Second, "how long consumers may take to finish after producers stop")
	fs.StringVar(&c.JSONPath, "json", "", "write the JSON report to this file")
	fs.StringVar(&c.HTMLPath, "html", "", "write the HTML report to this file")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the load generator's whole run (go tool pprof) to this file")
	fs.BoolVar(&f.noProgress, "quiet", false, "no live progress line on stderr")
	c.Security.define(fs)
	return f
}

// complete fills c from f and the defaults that depend on other flags,
// given the names of the flags set, and validates it.
func (c *Config) complete(f *pendingFlags, set map[string]bool) error {
	if set["messages"] && !set["duration"] {
		c.Duration = 0 // a message count alone bounds the run
	}
	if c.Backlog > 0 {
		if set["messages"] || set["duration"] || set["rate"] || set["rate-of-raw"] {
			return fmt.Errorf("%w: --backlog excludes --messages, --duration, --rate and --rate-of-raw", errUsage)
		}
		c.Messages, c.Duration = c.Backlog, 0
	} else if c.CompareShallow {
		return fmt.Errorf("%w: --compare-shallow needs --backlog", errUsage)
	}
	c.Progress = !f.noProgress
	c.Brokers = splitList(f.brokers)
	c.Metrics = splitList(f.metrics)
	if err := c.setKind(f.kind, f.mode, f.mix); err != nil {
		return err
	}
	if set["baselines"] {
		c.Baselines = splitList(f.baselines)
		if len(c.Baselines) == 1 && c.Baselines[0] == "none" {
			c.Baselines = nil
		}
	} else if c.SpawnBrokers > 0 || c.ZooKeeper != "" {
		c.Baselines = []string{baselineRaw, baselineNaive}
	}
	if c.Order == "auto" {
		// Brokers share the head of a queue: a consumer of one broker
		// may get a message after a newer one went to another.
		c.Order = orderStrict
		if c.SpawnBrokers > 1 || len(c.Brokers) > 1 {
			c.Order = orderReport
		}
	}
	if c.Queue == "" {
		c.Queue = fmt.Sprintf("loadtest-%s-%04x", time.Now().UTC().Format("20060102-150405"), rand.IntN(1<<16))
	}
	if err := c.validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

// setKind sets the queue kind, the delivery mode and the priority mix
// (the default one for a priority queue without mix).
func (c *Config) setKind(kind, mode, mix string) error {
	if err := c.Kind.UnmarshalText([]byte(kind)); err != nil || c.Kind == qbroker.KindSync {
		return fmt.Errorf("%w: --kind %q: want fifo or priority", errUsage, kind)
	}
	if err := c.Mode.UnmarshalText([]byte(mode)); err != nil {
		return fmt.Errorf("%w: --mode %q: want at-most-once or at-least-once", errUsage, mode)
	}
	if c.Kind == qbroker.KindPriority && mix == "" {
		mix = defaultPriorityMix
	}
	if mix != "" {
		if c.Kind != qbroker.KindPriority {
			return fmt.Errorf("%w: --priority-mix needs --kind priority", errUsage)
		}
		m, err := parsePriorityMix(mix)
		if err != nil {
			return fmt.Errorf("%w: --priority-mix: %v", errUsage, err)
		}
		c.PriorityMix = m
	}
	return nil
}

const usageText = `usage: loadtest [flags]

Measures qbroker through its Go client: producers publish, consumers
consume, every message is checked (no loss, no duplicate, per-producer
order), and throughput is compared with two baselines run on the same
ZooKeeper: raw create+delete pairs (the ceiling) and the seeds' naive
consumers racing for the head.

  loadtest --spawn-brokers 1                       # local ZooKeeper + 1 broker
  loadtest --broker 127.0.0.1:7070 --metrics 127.0.0.1:9090 --zk 127.0.0.1:2181

flags:
`

// validate checks ranges and the topology.
func (c *Config) validate() error {
	if err := c.validateTenants(); err != nil {
		return err
	}
	switch {
	case c.SpawnBrokers < 0:
		return fmt.Errorf("--spawn-brokers %d < 0", c.SpawnBrokers)
	case c.SpawnBrokers > 0 && (len(c.Brokers) > 0 || len(c.Metrics) > 0 || c.ZooKeeper != ""):
		return errors.New("--spawn-brokers excludes --broker, --metrics and --zk")
	case c.SpawnBrokers == 0 && len(c.Brokers) == 0:
		return errors.New("give --broker addresses or --spawn-brokers N")
	case len(c.Metrics) > 0 && len(c.Metrics) != len(c.Brokers):
		return fmt.Errorf("%d --metrics addresses for %d brokers", len(c.Metrics), len(c.Brokers))
	case c.Producers < 1 || c.Consumers < 1:
		return errors.New("--producers and --consumers must be at least 1")
	case c.ConnsPerBroker < 0:
		return fmt.Errorf("--conns-per-broker %d < 0", c.ConnsPerBroker)
	case c.Messages < 0 || c.Duration < 0 || c.Backlog < 0:
		return errors.New("--messages, --duration and --backlog must not be negative")
	case c.Messages == 0 && c.Duration == 0:
		return errors.New("give --messages or --duration")
	case c.Payload < headerLen || c.Payload > 512<<10:
		return fmt.Errorf("--payload %d not in [%d, %d]", c.Payload, headerLen, 512<<10)
	case c.NackRate < 0 || c.NackRate > 1:
		return fmt.Errorf("--nack-rate %v not in [0, 1]", c.NackRate)
	case c.NackRate > 0 && c.Mode != qbroker.AtLeastOnce:
		return errors.New("--nack-rate needs --mode at-least-once")
	case c.Batch < 1 || c.Batch > 1000:
		return fmt.Errorf("--batch %d not in [1, 1000]", c.Batch)
	case c.Rate < 0 || math.IsInf(c.Rate, 0) || math.IsNaN(c.Rate):
		return fmt.Errorf("--rate %v", c.Rate)
	case c.RateOfRaw < 0 || c.RateOfRaw > 10 || math.IsNaN(c.RateOfRaw):
		return fmt.Errorf("--rate-of-raw %v not in [0, 10]", c.RateOfRaw)
	case c.RateOfRaw > 0 && c.Rate > 0:
		return errors.New("--rate-of-raw excludes --rate")
	case c.RateOfRaw > 0 && c.SpawnBrokers == 0 && c.ZooKeeper == "":
		return errors.New("--rate-of-raw needs ZooKeeper for the raw baseline: --spawn-brokers or --zk")
	case c.Probe && c.SpawnBrokers == 0 && c.ZooKeeper == "":
		return errors.New("--probe needs ZooKeeper for its bare create: --spawn-brokers or --zk")
	case c.Warmup < 0:
		return fmt.Errorf("--warmup %v < 0", c.Warmup)
	case c.WarmupMax < 0:
		return fmt.Errorf("--warmup-max %v < 0", c.WarmupMax)
	case c.Prefetch < 1 || c.Prefetch > 1000:
		return fmt.Errorf("--prefetch %d not in [1, 1000]", c.Prefetch)
	case c.VisibilityTimeout < 0:
		return fmt.Errorf("--visibility-timeout %v < 0", c.VisibilityTimeout)
	case c.Packed && c.Fair:
		return errors.New("--packed excludes --fair (a packed queue has no fair dispatch)")
	case c.KillActiveAfter < 0:
		return fmt.Errorf("--kill-active-after %v < 0", c.KillActiveAfter)
	case c.KillActiveAfter > 0 && (!c.SingleActive || c.SpawnBrokers < 2 || c.Backlog > 0 || c.Probe):
		return errors.New("--kill-active-after needs --single-active and --spawn-brokers 2 or more, without --backlog or --probe")
	case c.ZKNoSync && c.SpawnBrokers == 0:
		return errors.New("--zk-no-sync needs --spawn-brokers (it configures the ZooKeeper the load tester starts)")
	case c.SingleActive && c.ConfirmAcks:
		return errors.New("--single-active excludes --confirm-acks (a single-active queue refuses Receive)")
	case c.ConfirmOnStream && (c.Mode != qbroker.AtLeastOnce || c.ConfirmAcks):
		return errors.New("--confirm-on-stream needs --mode at-least-once, and excludes --confirm-acks")
	case c.ConfirmAcks && (c.Mode != qbroker.AtLeastOnce || c.Prefetch > maxReceive):
		return fmt.Errorf("--confirm-acks needs --mode at-least-once and --prefetch at most %d (a Receive call's limit)", maxReceive)
	case c.Order != orderStrict && c.Order != orderReport:
		return fmt.Errorf("--order %q: want strict or report", c.Order)
	case c.Timeout <= 0 || c.DrainTimeout <= 0:
		return errors.New("--timeout and --drain-timeout must be positive")
	case c.BaselineDuration <= 0 && len(c.Baselines) > 0:
		return errors.New("--baseline-duration must be positive")
	case c.RawSessions < 1 || c.RawGoroutines < 1 || c.NaivePrefill < 1:
		return errors.New("--raw-sessions, --raw-goroutines and --naive-prefill must be at least 1")
	}
	for _, b := range c.Baselines {
		switch b {
		case baselineRaw, baselineNaive, baselineCreate:
			if c.SpawnBrokers == 0 && c.ZooKeeper == "" {
				return fmt.Errorf("baseline %s needs --zk (or --spawn-brokers)", b)
			}
		case baselineJetStream, baselineJetStreamSync:
		default:
			return fmt.Errorf("unknown baseline %q (want raw, naive, create, jetstream, jetstream-sync or none)", b)
		}
	}
	if err := c.Security.validate(c.SpawnBrokers); err != nil {
		return err
	}
	addrs := append(append(slices.Clone(c.Brokers), c.Metrics...), splitList(c.ZooKeeper)...)
	for _, a := range addrs {
		if err := checkLoopback(a); err != nil {
			return err
		}
	}
	return nil
}

// checkLoopback accepts host:port addresses on the loopback interface
// only: the load test never sends traffic elsewhere.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %v", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("address %q is not a loopback address (127.0.0.0/8, ::1, localhost)", addr)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parsePriorityMix parses "0:10,5:30,9:60": priority:percent terms whose
// percents add up to 100.
func parsePriorityMix(s string) ([]PriorityShare, error) {
	var out []PriorityShare
	total := 0.0
	seen := map[int]bool{}
	for _, term := range splitList(s) {
		ps, pc, ok := strings.Cut(term, ":")
		if !ok {
			return nil, fmt.Errorf("term %q: want priority:percent", term)
		}
		p, err := strconv.Atoi(strings.TrimSpace(ps))
		if err != nil || p < 0 || p > zkqueue.MaxPriority {
			return nil, fmt.Errorf("term %q: priority not in [0, %d]", term, zkqueue.MaxPriority)
		}
		if seen[p] {
			return nil, fmt.Errorf("priority %d given twice", p)
		}
		seen[p] = true
		pct, err := strconv.ParseFloat(strings.TrimSpace(pc), 64)
		if err != nil || pct <= 0 || math.IsInf(pct, 0) {
			return nil, fmt.Errorf("term %q: percent must be a positive number", term)
		}
		total += pct
		out = append(out, PriorityShare{Priority: p, Percent: pct})
	}
	if len(out) == 0 {
		return nil, errors.New("empty")
	}
	if math.Abs(total-100) > 1e-6 {
		return nil, fmt.Errorf("percents add up to %v, want 100", total)
	}
	return out, nil
}

// pickPriority maps u in [0, 100) to a priority of the mix.
func pickPriority(mix []PriorityShare, u float64) int {
	acc := 0.0
	for _, s := range mix {
		acc += s.Percent
		if u < acc {
			return s.Priority
		}
	}
	return mix[len(mix)-1].Priority
}
