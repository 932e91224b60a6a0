package main

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/qbroker/qbroker/internal/proccpu"
)

// Killing the active broker (--kill-active-after, with --single-active):
// a takeover measured in one run, without a shell. KillActiveAfter into
// the publishing, the broker serving the queue's active stream (the one
// whose delivered counter grows over a short window) is killed with
// SIGKILL; the run goes on through the other brokers. The checker's
// single-active figures give the takeover. A stream ack sent to the
// killed broker may have died with it unapplied: a message acked again
// after such an ack is counted apart (Verdict.AckedAgain), not as a
// duplicate. The broker counters are not summed over a run in which a
// broker died (its last ones are lost), and its CPU counts up to the kill.

// KillReport says which broker was killed, and when.
type KillReport struct {
	Broker string  `json:"broker"`
	After  float64 `json:"after_seconds"` // from the first publish
}

// killWindow is how long the delivered counters are watched to tell the
// active broker.
const killWindow = 300 * time.Millisecond

// startKill returns the whilePublishing hook that kills the active broker
// after cfg.KillActiveAfter and what it did: the report, or why it did
// not. The hook's goroutine ends by the time its stop function returns.
func startKill(cfg *Config, topo *Topology, pool *connPool, token string, report **KillReport, failures *[]string) func(context.Context) func() {
	return func(ctx context.Context) func() {
		start := time.Now()
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTimer(cfg.KillActiveAfter)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				*failures = append(*failures, "--kill-active-after: the publishing ended before the kill")
				return
			}
			i, err := activeBroker(ctx, topo, cfg.Queue, token)
			if err == nil {
				err = topo.kill(i)
			}
			if err != nil {
				*failures = append(*failures, fmt.Sprintf("--kill-active-after: %v", err))
				return
			}
			pool.markDead(i)
			*report = &KillReport{Broker: topo.Brokers[i], After: time.Since(start).Seconds()}
		}()
		return func() { cancel(); <-done }
	}
}

// activeBroker returns the index of the broker whose delivered counter of
// queue grows most over killWindow.
func activeBroker(ctx context.Context, topo *Topology, queue, token string) (int, error) {
	read := func() ([]float64, error) {
		out := make([]float64, len(topo.Metrics))
		for i, a := range topo.Metrics {
			fams, err := scrape(ctx, a, token)
			if err != nil {
				return nil, err
			}
			out[i] = queueCounters(fams, queue).Delivered
		}
		return out, nil
	}
	before, err := read()
	if err != nil {
		return 0, err
	}
	select {
	case <-time.After(killWindow):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	after, err := read()
	if err != nil {
		return 0, err
	}
	best, grew := 0, 0.0
	for i := range after {
		if d := after[i] - before[i]; d > grew {
			best, grew = i, d
		}
	}
	if grew == 0 {
		return 0, errors.New("no broker delivered in the window: no active stream to kill")
	}
	return best, nil
}

// kill ends spawned broker i with SIGKILL (its process group), keeping
// the CPU it used until then.
func (t *Topology) kill(i int) error {
	if !t.Spawned || i < 0 || i >= len(t.procs) {
		return fmt.Errorf("no spawned broker %d", i)
	}
	p := t.procs[i]
	if d, err := proccpu.Process(p.cmd.Process.Pid); err == nil {
		p.cpuAtKill = d
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill broker %s: %w", t.Brokers[i], err)
	}
	<-p.done
	p.killed = true
	return nil
}

// killedAny reports whether a broker was killed during the run.
func (t *Topology) killedAny() bool {
	for _, p := range t.procs {
		if p.killed {
			return true
		}
	}
	return false
}
