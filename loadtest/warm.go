package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/proccpu"
)

// A fresh ZooKeeper JVM compiles its hot paths while the first load runs:
// on this project's 2-core machine its C2 compiler thread took a third of
// a core for the first 15-20 s of a one-message publish run, whose rate
// rose from 500 to 1,800 msg/s meanwhile and then stayed. A ZooKeeper in
// production has long finished compiling, so a warmup with a spawned
// ZooKeeper goes on past --warmup until its JIT compilers are quiet.

// jitQuiet is the JIT compilers' CPU, as a share of one core over the
// last warm run, under which a spawned ZooKeeper counts as warm.
const jitQuiet = 0.05

// warmStep is the length of each warm run past --warmup.
const warmStep = 5 * time.Second

// WarmupReport is how long the warmup ran and how busy ZooKeeper's JIT
// compilers still were in its last run.
type WarmupReport struct {
	Seconds float64 `json:"seconds"`
	// JITCores: the JIT compiler threads' CPU over the last warm run
	// (LastRunSeconds long), in cores; absent when ZooKeeper was not
	// spawned.
	JITCores       *float64 `json:"jit_cores,omitempty"`
	LastRunSeconds float64  `json:"last_run_seconds,omitempty"`
}

// warmUntilQuiet runs run(cfg.Warmup) and then, with a spawned
// ZooKeeper, run(warmStep) while its JIT compilers used more than
// jitQuiet of a core in the run before, until cfg.WarmupMax has passed.
func warmUntilQuiet(ctx context.Context, cfg *Config, topo *Topology, run func(time.Duration) error) (WarmupReport, error) {
	start := time.Now()
	pid := 0
	if topo.Spawned && topo.zk != nil {
		pid = topo.zk.Pid()
	}
	var rep WarmupReport
	for d := cfg.Warmup; ; d = warmStep {
		before, okBefore := jitCPU(pid)
		t0 := time.Now()
		err := run(d)
		after, okAfter := jitCPU(pid)
		rep.Seconds = time.Since(start).Seconds()
		if err != nil {
			return rep, err
		}
		if !okBefore || !okAfter {
			return rep, nil
		}
		rep.LastRunSeconds = time.Since(t0).Seconds()
		cores := (after - before).Seconds() / rep.LastRunSeconds
		rep.JITCores = &cores
		if cores < jitQuiet || time.Since(start) >= cfg.WarmupMax || ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
}

// jitCPU returns the CPU time of a JVM's JIT compiler threads (C1 and
// C2, named "C1 CompilerThre..." and "C2 CompilerThre..."); ok is false
// when pid is 0 or its threads cannot be read.
func jitCPU(pid int) (d time.Duration, ok bool) {
	if pid == 0 {
		return 0, false
	}
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	for _, t := range tasks {
		comm, err := os.ReadFile(dir + "/" + t.Name() + "/comm")
		if err != nil || !strings.Contains(string(comm), "CompilerThre") {
			continue // a thread that ended since the listing, or not a compiler
		}
		stat, err := os.ReadFile(dir + "/" + t.Name() + "/stat")
		if err != nil {
			continue
		}
		cpu, err := proccpu.ParseStat(string(stat))
		if err != nil {
			return 0, false
		}
		d += cpu
	}
	return d, true
}

// warmup runs the workload before the measured run, checked like any run
// but left out of the report, so the measured run meets a warm ZooKeeper
// (JIT, caches) and warm brokers: for cfg.Warmup, and on past it while a
// spawned ZooKeeper is still compiling (warmUntilQuiet). A backlog
// workload is run whole (publish, then drain), as often as that takes, on
// a queue of its own: the measured backlog must be one no consumer of its
// queue saw published (its claims read the messages, as after a broker
// restart), while a broker whose consumers took from a queue remembers
// what it publishes there.
//
// The warm queue is deleted after the measured run (the returned func),
// not before it: deleting it took ZooKeeper down paths the warm runs had
// not, and its JIT compiled again during the measured drain (C2 at 0.2-0.4
// cores for the first second of a 20,000 drain at prefetch 1, which then
// ran at 11,742 msg/s against 14,909 with the deletion after it).
//
// With a spawned ZooKeeper, each warm backlog run also takes the readings
// the measured one takes around its publishing (readZK) and starts a cold
// broker on its backlog (coldProbe): the first time they ran, ZooKeeper
// compiled anew, its JIT taking half a core for the first 2-3 s of the
// measured drain (a 20,000 drain at prefetch 1 then cost ZooKeeper
// 0.149 s of CPU per 1,000 messages, against 0.097 without them).
func warmup(ctx context.Context, cfg Config, topo *Topology, admin *qbroker.Client, pool *connPool, opts []qbroker.Option, progress io.Writer) (WarmupReport, func(), error) {
	if cfg.Backlog == 0 {
		rep, err := warmUntilQuiet(ctx, &cfg, topo, func(d time.Duration) error {
			c := cfg
			c.Duration, c.Messages = d, 0
			return warmRun(ctx, c, pool, progress, workloadHooks{})
		})
		return rep, func() {}, err
	}
	cfg.Queue += "-warmup"
	if _, err := admin.CreateQueue(ctx, cfg.Queue, cfg.queueOptions()); err != nil {
		return WarmupReport{}, func() {}, fmt.Errorf("warmup: %w", err)
	}
	cleanup := func() { deleteQueue(ctx, admin, cfg.Queue) }
	var hooks workloadHooks
	probe := func(ctx context.Context) {}
	if topo.Spawned {
		token := metricsToken(&cfg, topo)
		probe = func(ctx context.Context) { _, _ = readZK(ctx, &cfg, topo, token) }
		hooks.beforeDrain = func(ctx context.Context) {
			probe(ctx)
			_, _ = coldProbe(ctx, &cfg, topo, opts) // its failures show in the measured run's
		}
	}
	rep, err := warmUntilQuiet(ctx, &cfg, topo, func(d time.Duration) error {
		for end := time.Now().Add(d); ; {
			probe(ctx)
			if err := warmRun(ctx, cfg, pool, progress, hooks); err != nil || !time.Now().Before(end) {
				return err
			}
		}
	})
	return rep, cleanup, err
}

// warmRun runs one warmup workload and checks it.
func warmRun(ctx context.Context, cfg Config, pool *connPool, progress io.Writer, hooks workloadHooks) error {
	w, err := runWorkload(ctx, &cfg, pool, progress, hooks)
	if err != nil {
		return fmt.Errorf("warmup: %w", err)
	}
	if !w.Verdict.OK || len(w.Problems) > 0 {
		return fmt.Errorf("warmup: %d lost, %d duplicates, %d order violations; %s",
			w.Verdict.Lost, w.Verdict.Duplicates, w.Verdict.OrderViolations, strings.Join(append(w.Verdict.Problems, w.Problems...), "; "))
	}
	return nil
}
