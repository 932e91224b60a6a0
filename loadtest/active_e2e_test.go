package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// TestSingleActiveEndToEnd runs the load test with --single-active over
// two spawned brokers, consumers spread over both: the queue is created
// with single active consumer and the checker finds no two streams
// holding deliveries at once.
func TestSingleActiveEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topo, dir := spawnForTest(ctx, t, 2, false)
	cfg := Config{
		Producers: 2, Consumers: 4, ConnsPerBroker: 1,
		Messages: 1000, Payload: 100, Batch: 10, Prefetch: 4,
		Mode: qbroker.AtLeastOnce, NackRate: 0.1, Queue: "e2e-single-active", SingleActive: true,
		Order:   orderReport,
		Timeout: 2 * time.Minute, DrainTimeout: time.Minute,
		JSONPath: filepath.Join(dir, "single-active.json"),
	}
	var stdout, stderr bytes.Buffer
	if code := runOn(ctx, cfg, topo, &stdout, &stderr); code != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	if !strings.Contains(stdout.String(), "single active ") {
		t.Errorf("summary lacks the single-active line:\n%s", &stdout)
	}
	r := readReport(t, cfg.JSONPath)
	a := r.Check.SingleActive
	// Without single active consumer all four streams would hold
	// deliveries; with it one does, or a few if one lost its turn.
	if !r.OK || a == nil || a.Overlaps != 0 || a.Streams < 1 || a.Streams >= cfg.Consumers || r.Check.Acked != 1000 {
		t.Errorf("verdict: ok %v, single active %+v, %d acked\nstdout:\n%s", r.OK, a, r.Check.Acked, &stdout)
	}
}

// TestKillActiveEndToEnd runs --kill-active-after: the broker serving the
// active stream is killed with SIGKILL while producers publish; a stream
// on the other broker takes over, nothing acked is lost, no two streams
// held deliveries at once, and the run passes with the kill reported.
func TestKillActiveEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topo, dir := spawnForTest(ctx, t, 2, false)
	cfg := Config{
		SpawnBrokers: 2, Producers: 2, Consumers: 4, ConnsPerBroker: 1,
		Duration: 6 * time.Second, Payload: 100, Batch: 1, Prefetch: 1,
		Mode: qbroker.AtLeastOnce, Queue: "e2e-kill-active", SingleActive: true, KillActiveAfter: 2 * time.Second,
		Order:   orderReport,
		Timeout: 2 * time.Minute, DrainTimeout: time.Minute,
		JSONPath: filepath.Join(dir, "kill-active.json"),
	}
	var stdout, stderr bytes.Buffer
	if code := runOn(ctx, cfg, topo, &stdout, &stderr); code != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	r := readReport(t, cfg.JSONPath)
	a := r.Check.SingleActive
	if !r.OK || r.Kill == nil || a == nil || a.Overlaps != 0 || a.Handovers < 1 || r.Check.Lost != 0 {
		t.Fatalf("verdict: ok %v, kill %+v, single active %+v, lost %d\nstdout:\n%s", r.OK, r.Kill, a, r.Check.Lost, &stdout)
	}
	t.Logf("killed %s after %.1fs; longest takeover %.0f ms", r.Kill.Broker, r.Kill.After, a.MaxTakeoverMS)
}
