package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// DeepReport relates a backlog run (--backlog) to what a deep queue is
// about: how fast it was filled and drained beside a shallow run of the
// same messages (--compare-shallow), how soon a broker started cold on
// the backlog delivers, and how much memory the brokers needed for it.
type DeepReport struct {
	Messages int `json:"messages"`
	// The deep run: published with no consumer, then drained.
	PublishPerSec float64 `json:"publish_per_sec"`
	ConsumePerSec float64 `json:"consume_per_sec"`
	// The shallow run: the same messages with the consumers subscribed
	// first, so the queue stays short. Absent without --compare-shallow.
	Shallow *ShallowRun `json:"shallow,omitempty"`
	// ConsumeRatio: the deep consume rate over the shallow one.
	ConsumeRatio float64 `json:"consume_ratio,omitempty"`
	// Cold: a broker process started once the backlog was published.
	Cold *ColdStart `json:"cold,omitempty"`
	// PeakRSSBytes: the spawned brokers' peak resident memory (VmHWM)
	// from their start to the end of the deep run, the largest of them.
	PeakRSSBytes int64 `json:"peak_rss_bytes,omitempty"`
}

// ShallowRun is the shallow run's figures.
type ShallowRun struct {
	PublishPerSec float64  `json:"publish_per_sec"`
	ConsumePerSec float64  `json:"consume_per_sec"`
	OK            bool     `json:"ok"`
	Failures      []string `json:"failures,omitempty"`
}

// ColdStart is what a broker started cold on the backlog took: from its
// process's start until it served (gRPC and /metrics answering), and from
// then until its first Receive returned a message. The message is
// received at least once and nacked at once, so it goes back to its place
// and the drain delivers it (with a delivery count of 2: its end-to-end
// latency is left out).
type ColdStart struct {
	StartSeconds         float64 `json:"start_seconds"`
	FirstDeliverySeconds float64 `json:"first_delivery_seconds"`
}

// coldProbe starts one more broker on topo's ZooKeeper, waits until it
// serves, measures its first delivery from cfg.Queue, gives the message
// back and stops the broker.
func coldProbe(ctx context.Context, cfg *Config, topo *Topology, opts []qbroker.Option) (*ColdStart, error) {
	start := time.Now()
	p, grpcAddr, _, err := runBroker(ctx, topo.tmp, topo.bin, topo.ZooKeeper, len(topo.procs), topo.extra...)
	if err != nil {
		return nil, fmt.Errorf("cold broker: %w", err)
	}
	defer p.stop()
	ready := time.Now()
	c, err := dial(ctx, grpcAddr, opts)
	if err != nil {
		return nil, fmt.Errorf("cold broker: %w", err)
	}
	defer c.Close()
	ms, err := c.Receive(ctx, cfg.Queue, qbroker.ReceiveOptions{Max: 1, Wait: 30 * time.Second,
		Mode: qbroker.AtLeastOnce, Visibility: time.Minute})
	first := time.Since(ready)
	if err != nil {
		return nil, fmt.Errorf("cold broker: receive: %w", err)
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("cold broker: no message within 30s from a backlog of %d", cfg.Backlog)
	}
	if err := ms[0].Nack(ctx, 0); err != nil {
		return nil, fmt.Errorf("cold broker: nack: %w", err)
	}
	return &ColdStart{StartSeconds: ready.Sub(start).Seconds(), FirstDeliverySeconds: first.Seconds()}, nil
}

// peakRSS returns the largest VmHWM of the spawned brokers.
func (t *Topology) peakRSS() (int64, error) {
	var peak int64
	for _, p := range t.procs {
		n, err := procPeakRSS(p.cmd.Process.Pid)
		if err != nil {
			return 0, err
		}
		peak = max(peak, n)
	}
	return peak, nil
}

// procPeakRSS reads a process's peak resident set size (VmHWM) from
// /proc/<pid>/status.
func procPeakRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseVmHWM(f)
}

func parseVmHWM(r io.Reader) (int64, error) {
	s := bufio.NewScanner(r)
	for s.Scan() {
		v, ok := strings.CutPrefix(s.Text(), "VmHWM:")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("malformed VmHWM line %q", s.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed VmHWM line %q: %v", s.Text(), err)
		}
		return kb << 10, nil
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no VmHWM in status")
}

// shallowRun runs the deep run's messages again with the consumers
// subscribed first.
func shallowRun(ctx context.Context, cfg Config, pool *connPool, progress io.Writer) (*ShallowRun, error) {
	cfg.Messages, cfg.Backlog, cfg.Duration = cfg.Backlog, 0, 0
	w, err := runWorkload(ctx, &cfg, pool, progress, workloadHooks{})
	if err != nil {
		return nil, fmt.Errorf("shallow run: %w", err)
	}
	delivered := w.Verdict.Delivered
	if cfg.Mode == qbroker.AtLeastOnce {
		delivered = w.Verdict.Acked
	}
	s := &ShallowRun{
		PublishPerSec: perSec(w.Verdict.Published, w.PublishEnd.Sub(w.Start).Seconds()),
		ConsumePerSec: perSec(delivered, w.End.Sub(w.Start).Seconds()),
		OK:            w.Verdict.OK && len(w.Problems) == 0 && !w.Interrupted,
	}
	for _, p := range append(w.Verdict.Problems, w.Problems...) {
		s.Failures = append(s.Failures, "shallow run: "+p)
	}
	if !s.OK && len(s.Failures) == 0 {
		s.Failures = []string{"shallow run: check failed"}
	}
	return s, nil
}

// deepReport assembles the deep figures of a backlog run w.
func deepReport(cfg Config, w *workloadResult, delivered int64) *DeepReport {
	return &DeepReport{
		Messages:      cfg.Backlog,
		PublishPerSec: perSec(w.Verdict.Published, w.PublishEnd.Sub(w.Start).Seconds()),
		ConsumePerSec: perSec(delivered, w.End.Sub(w.DrainStart).Seconds()),
	}
}

// writeDeep prints the deep figures.
func writeDeep(b *strings.Builder, d *DeepReport) {
	fmt.Fprintf(b, "deep queue   %d messages: publish %.0f msg/s, consume %.0f msg/s", d.Messages, d.PublishPerSec, d.ConsumePerSec)
	if d.PeakRSSBytes > 0 {
		fmt.Fprintf(b, "; broker peak RSS %.0f MiB", float64(d.PeakRSSBytes)/(1<<20))
	}
	b.WriteString("\n")
	if s := d.Shallow; s != nil {
		fmt.Fprintf(b, "shallow      the same messages, consumers first: publish %.0f msg/s, consume %.0f msg/s; deep/shallow consume %.2f\n",
			s.PublishPerSec, s.ConsumePerSec, d.ConsumeRatio)
	}
	if c := d.Cold; c != nil {
		fmt.Fprintf(b, "cold broker  started on the backlog: serving after %.2fs, first delivery %.3fs later\n",
			c.StartSeconds, c.FirstDeliverySeconds)
	}
}
