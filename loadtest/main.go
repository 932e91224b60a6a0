package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "loadtest: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, the next one kills at once (and the
	// parent-death signal takes the spawned processes with us).
	context.AfterFunc(ctx, stop)
	// The last resort of --timeout: cleanup is bounded too, but should
	// anything hang past it, exit anyway.
	watchdog := time.AfterFunc(cfg.Timeout+time.Minute, func() {
		fmt.Fprintf(os.Stderr, "loadtest: FAILED: still running %v after --timeout; exiting\n", time.Minute)
		os.Exit(1)
	})
	defer watchdog.Stop()
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "loadtest: --cpuprofile: %v\n", err)
			os.Exit(2)
		}
		defer f.Close()
	}
	code := run(ctx, cfg, os.Stdout, os.Stderr)
	pprof.StopCPUProfile()
	stop()
	os.Exit(code)
}

// run does the whole test and returns the exit status: 0 when every check
// passed, 1 otherwise.
func run(ctx context.Context, cfg Config, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	topo := externalTopology(cfg)
	if cfg.SpawnBrokers > 0 {
		fmt.Fprintf(stderr, "loadtest: starting ZooKeeper and %d broker(s)\n", cfg.SpawnBrokers)
		var err error
		topo, err = spawnTopology(ctx, cfg.SpawnBrokers, cfg.QBrokerBin, cfg.Security.SpawnSecure, cfg.ZKNoSync)
		if err != nil {
			fmt.Fprintf(stderr, "loadtest: FAILED: %v\n", err)
			return 1
		}
		defer topo.Close()
	}
	return runOn(ctx, cfg, topo, stdout, stderr)
}

// runOn runs the test against topo, prints the summary, writes the
// report files and returns the exit status.
func runOn(ctx context.Context, cfg Config, topo *Topology, stdout, stderr io.Writer) int {
	var progress io.Writer
	if cfg.Progress {
		progress = stderr
	}
	r, err := execute(ctx, cfg, topo, progress)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, context.Cause(ctx))
		}
		fmt.Fprintf(stderr, "loadtest: FAILED: %v\n", err)
		return 1
	}
	writeSummary(stdout, r)
	if cfg.JSONPath != "" {
		if err := writeJSON(cfg.JSONPath, r); err != nil {
			fmt.Fprintf(stderr, "loadtest: FAILED: %v\n", err)
			return 1
		}
	}
	if cfg.HTMLPath != "" {
		if err := writeHTML(cfg.HTMLPath, r); err != nil {
			fmt.Fprintf(stderr, "loadtest: FAILED: %v\n", err)
			return 1
		}
	}
	if !r.OK {
		fmt.Fprintf(stderr, "loadtest: FAILED:\n  %s\n", strings.Join(r.Failures, "\n  "))
		return 1
	}
	return 0
}

// execute runs the workload and the baselines against topo and assembles
// the report. It fails only when the test could not run; a run that
// broke a guarantee returns a report whose OK is false.
func execute(ctx context.Context, cfg Config, topo *Topology, progress io.Writer) (*Report, error) {
	started := time.Now()
	sec := cfg.Security
	if topo.Security != nil {
		sec = *topo.Security
	}
	opts, err := sec.options()
	if err != nil {
		return nil, err
	}
	pool, err := newConnPool(ctx, topo.Brokers, cfg.ConnsPerBroker, opts...)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	admin, err := pool.admin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := admin.CreateQueue(ctx, cfg.Queue, cfg.queueOptions()); err != nil {
		return nil, err
	}
	queueDeleted := false
	deleteOnce := func() {
		if queueDeleted {
			return
		}
		queueDeleted = true
		if a, err := pool.admin(ctx); err == nil { // a live broker's, after --kill-active-after
			deleteQueue(ctx, a, cfg.Queue)
		}
	}
	defer deleteOnce()

	first, err := rawBaselineFirst(ctx, &cfg, topo, progress)
	if err != nil {
		return nil, err
	}
	var failures []string
	var warm *WarmupReport
	if cfg.Warmup > 0 {
		w, cleanup, err := warmup(ctx, cfg, topo, admin, pool, opts, progress)
		defer cleanup() // after the measured run (warmup)
		if err != nil {
			failures = append(failures, err.Error())
		}
		warm = &w
	}
	var hooks workloadHooks
	var cold *ColdStart
	var probe *LoadProbe
	if cfg.Probe {
		hooks.whilePublishing = func(ctx context.Context) func() {
			p, err := startLoadProbe(ctx, &cfg, admin, topo.ZooKeeper)
			if err != nil {
				failures = append(failures, fmt.Sprintf("probe: %v", err))
				return nil
			}
			return func() {
				lp := p.stop(ctx)
				probe = &lp
			}
		}
	}
	if cfg.Backlog > 0 && topo.Spawned {
		hooks.beforeDrain = func(ctx context.Context) {
			var err error
			if cold, err = coldProbe(ctx, &cfg, topo, opts); err != nil {
				failures = append(failures, err.Error())
			}
		}
	}
	var kill *KillReport
	if cfg.KillActiveAfter > 0 {
		hooks.whilePublishing = startKill(&cfg, topo, pool, metricsToken(&cfg, topo), &kill, &failures)
	}
	in, scrapeFailures, err := measureWorkload(ctx, &cfg, topo, pool, progress, hooks)
	if err != nil {
		return nil, err
	}
	in.Started = started
	in.Warmup = warm
	in.Probe = probe
	in.Kill = kill
	failures = append(failures, scrapeFailures...)
	failures = append(failures, topo.exited()...)
	if cfg.Backlog > 0 && !in.Workload.Interrupted {
		var more []string
		in.Deep, more = deepFigures(ctx, cfg, topo, pool, progress, in.Workload)
		in.Deep.Cold = cold
		failures = append(failures, more...)
	}
	deleteOnce()

	in.Baselines = first
	if !in.Workload.Interrupted {
		after, baselineFailures := runBaselines(ctx, &cfg, topo, progress)
		in.Baselines = append(in.Baselines, after...)
		failures = append(failures, baselineFailures...)
	}
	in.Failures = failures
	return buildReport(in), nil
}

// rawBaselineFirst, with --rate-of-raw, measures the ceiling first on the
// same ZooKeeper (warmed up by the same raw load first when asked), sets
// cfg.Rate to the asked fraction of it and takes the raw baseline out of
// those still to run. It returns the baseline it ran, if any.
func rawBaselineFirst(ctx context.Context, cfg *Config, topo *Topology, progress io.Writer) ([]BaselineResult, error) {
	if cfg.RateOfRaw <= 0 {
		return nil, nil
	}
	if cfg.Warmup > 0 {
		_, err := warmUntilQuiet(ctx, cfg, topo, func(d time.Duration) error {
			wcfg := *cfg
			wcfg.BaselineDuration = d
			_, err := runRaw(ctx, &wcfg, topo, progress)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("baseline raw warmup: %w", err)
		}
	}
	b, err := runRaw(ctx, cfg, topo, progress)
	if err != nil {
		return nil, fmt.Errorf("baseline raw (for --rate-of-raw): %w", err)
	}
	cfg.Rate = cfg.RateOfRaw * b.PerSec
	cfg.Baselines = slices.DeleteFunc(slices.Clone(cfg.Baselines), func(s string) bool { return s == baselineRaw })
	return []BaselineResult{b}, nil
}

// measureWorkload runs the workload, with the brokers' counters scraped
// and the spawned processes' CPU read before and after it. It returns the
// report's input so far and the scrapes that failed; an error only when
// the workload could not run.
func measureWorkload(ctx context.Context, cfg *Config, topo *Topology, pool *connPool, progress io.Writer, hooks workloadHooks) (reportInput, []string, error) {
	var failures []string
	var before, after brokerCounters
	var err error
	scraped := len(topo.Metrics) > 0
	token := metricsToken(cfg, topo)
	if scraped {
		if before, err = scrapeAll(ctx, topo.Metrics, cfg.Queue, token); err != nil {
			failures = append(failures, err.Error())
			scraped = false
		}
	}
	cpu0, cpuOK := topo.cpu()
	var backlogZK *[2]zkReading
	if cfg.Backlog > 0 {
		// What the backlog costs ZooKeeper: read before its publishing
		// and once it is published, before anything else.
		r0, fs := readZK(ctx, cfg, topo, token)
		failures = append(failures, fs...)
		then := hooks.beforeDrain
		hooks.beforeDrain = func(ctx context.Context) {
			r1, fs := readZK(ctx, cfg, topo, token)
			failures = append(failures, fs...)
			backlogZK = &[2]zkReading{r0, r1}
			if then != nil {
				then(ctx)
			}
		}
	}
	// The drain's own CPU: the run's holds the publishing too.
	var drain0, drain1 cpuSample
	var drainOK bool
	if cfg.Backlog > 0 {
		hooks.drainStarts = func() { drain0, drainOK = topo.cpu() }
		hooks.drainEnds = func() {
			var ok bool
			drain1, ok = topo.cpu()
			drainOK = drainOK && ok
		}
	}
	zxid0, zxidErr := readZxid(topo.ZooKeeper)
	w, err := runWorkload(ctx, cfg, pool, progress, hooks)
	if err != nil {
		return reportInput{}, nil, err
	}
	cpu1, cpu1OK := topo.cpu()
	in := reportInput{Config: *cfg, Topology: topo, Workload: w, BacklogZK: backlogZK}
	if drainOK {
		d := drain1.sub(drain0)
		in.DrainCPU = &d
	}
	if topo.ZooKeeper != "" {
		zxid1, err := readZxid(topo.ZooKeeper)
		// An external ZooKeeper may not allow srvr: then no figure.
		if err = errors.Join(zxidErr, err); err != nil && topo.Spawned {
			failures = append(failures, fmt.Sprintf("ZooKeeper transactions: %v", err))
		} else if err == nil {
			in.Zxids = &[2]int64{zxid0, zxid1}
		}
	}
	if scraped && topo.killedAny() {
		scraped = false // a killed broker's last counters are lost: no sum
	}
	if scraped {
		// Bounded by its own timeout: wanted after an interrupt too.
		if after, err = scrapeAll(context.WithoutCancel(ctx), topo.Metrics, cfg.Queue, token); err != nil {
			failures = append(failures, err.Error())
		} else {
			d := after.sub(before)
			in.Counters = &d
		}
	}
	if cpuOK && cpu1OK {
		d := cpu1.sub(cpu0)
		in.CPU = &d
	}
	return in, failures, nil
}

// runBaselines runs the baselines cfg names, until ctx ends. It returns
// their results and the failures of those that did not run.
func runBaselines(ctx context.Context, cfg *Config, topo *Topology, progress io.Writer) ([]BaselineResult, []string) {
	var out []BaselineResult
	var failures []string
	natsBin := cfg.NATSServerBin
	for _, name := range cfg.Baselines {
		if ctx.Err() != nil {
			break
		}
		var b BaselineResult
		var err error
		switch name {
		case baselineRaw:
			b, err = runRaw(ctx, cfg, topo, progress)
		case baselineNaive:
			b, err = runNaive(ctx, cfg, topo, progress)
		case baselineCreate:
			b, err = runCreate(ctx, cfg, topo, progress)
		default:
			if natsBin == "" {
				dir, derr := os.MkdirTemp("", "qbroker-loadtest-nats-")
				if derr != nil {
					failures = append(failures, fmt.Sprintf("baseline %s: %v", name, derr))
					continue
				}
				defer os.RemoveAll(dir)
				if natsBin, err = buildNATSServer(ctx, dir); err != nil {
					failures = append(failures, fmt.Sprintf("baseline %s: %v", name, err))
					continue
				}
			}
			bs, err := runJetStream(ctx, cfg, natsBin, name == baselineJetStreamSync, progress)
			out = append(out, bs...)
			if err != nil {
				failures = append(failures, fmt.Sprintf("baseline %v", err))
			}
			continue
		}
		if err != nil {
			failures = append(failures, fmt.Sprintf("baseline %s: %v", name, err))
			continue
		}
		out = append(out, b)
	}
	return out, failures
}

// deleteQueue deletes the queue a run made, also after ctx ended, within
// its own timeout.
func deleteQueue(ctx context.Context, admin *qbroker.Client, name string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_ = admin.DeleteQueue(dctx, name)
}

// deepFigures completes a backlog run w: the spawned brokers' peak memory
// so far (the deep run's), then, with --compare-shallow, the shallow run
// of the same messages. It returns the figures and the failures met
// (with those of the shallow run).
func deepFigures(ctx context.Context, cfg Config, topo *Topology, pool *connPool, progress io.Writer, w *workloadResult) (*DeepReport, []string) {
	var failures []string
	delivered := w.Verdict.Delivered
	if cfg.Mode == qbroker.AtLeastOnce {
		delivered = w.Verdict.Acked
	}
	d := deepReport(cfg, w, delivered)
	if topo.Spawned {
		rss, err := topo.peakRSS()
		if err != nil {
			failures = append(failures, fmt.Sprintf("brokers' peak RSS: %v", err))
		}
		d.PeakRSSBytes = rss
	}
	if cfg.CompareShallow && ctx.Err() == nil {
		s, err := shallowRun(ctx, cfg, pool, progress)
		if err != nil {
			return d, append(failures, err.Error())
		}
		d.Shallow = s
		if s.ConsumePerSec > 0 {
			d.ConsumeRatio = d.ConsumePerSec / s.ConsumePerSec
		}
		failures = append(failures, s.Failures...)
	}
	return d, failures
}
