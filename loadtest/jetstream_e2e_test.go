package main

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// TestJetStreamBaselines runs the JetStream baselines as the command does:
// a nats-server built from the module go.mod requires, started as its own
// process, a few hundred messages at each durability, at least once (with
// Ack and with DoubleAck) from a backlog and at most once for a bounded
// time. It checks the figures are there, and that the server is gone
// afterwards. It asserts no timing.
func TestJetStreamBaselines(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is needed to build nats-server")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin, err := buildNATSServer(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		mode      qbroker.DeliveryMode
		backlog   int
		baselines []string
		want      []string // result names
		acks      []string
	}{
		{name: "at-least-once backlog", mode: qbroker.AtLeastOnce, backlog: 300,
			baselines: []string{baselineJetStreamSync, baselineJetStream},
			want:      []string{"jetstream-sync", "jetstream-sync-doubleack", "jetstream", "jetstream-doubleack"},
			acks:      []string{jsAckPlain, jsAckDouble, jsAckPlain, jsAckDouble}},
		{name: "at-most-once for a time", mode: qbroker.AtMostOnce,
			baselines: []string{baselineJetStreamSync}, want: []string{"jetstream-sync"}, acks: []string{jsAckPlain}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Producers: 2, Consumers: 4, Prefetch: 4, Batch: 10, Payload: 100, Mode: tt.mode,
				Backlog: tt.backlog, Messages: tt.backlog, Baselines: tt.baselines, BaselineDuration: 300 * time.Millisecond,
				DrainTimeout: time.Minute, NATSServerBin: bin}
			before := natsServers(t, bin)
			got, failures := runBaselines(ctx, &cfg, &Topology{}, nil)
			if len(failures) > 0 {
				t.Fatalf("failures: %v", failures)
			}
			var names []string
			cpu := 0.0
			for i, r := range got {
				names = append(names, r.Name)
				if r.Errors != 0 || r.PerSec <= 0 || r.Seconds <= 0 || r.Sessions != 6 || r.Ack != tt.acks[min(i, len(tt.acks)-1)] {
					t.Errorf("result %+v", r)
				}
				if tt.backlog > 0 && r.Messages != int64(tt.backlog) {
					t.Errorf("%s: %d messages delivered, want %d", r.Name, r.Messages, tt.backlog)
				}
				if tt.backlog == 0 && r.Messages <= 0 {
					t.Errorf("%s: nothing delivered", r.Name)
				}
				if r.MaxAckPending != jsDefaultMaxAckPending {
					t.Errorf("%s: MaxAckPending %d, want the default %d (4 consumers x prefetch 4)", r.Name, r.MaxAckPending, jsDefaultMaxAckPending)
				}
				cpu += r.ServerCPUSecPer1k
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("got results %v, want %v", names, tt.want)
			}
			if cpu <= 0 {
				t.Errorf("no nats-server CPU measured: %+v", got)
			}
			if after := natsServers(t, bin); after != before {
				t.Errorf("%d nats-server processes of %s left running", after-before, bin)
			}
		})
	}
}

// natsServers counts the running processes of bin.
func natsServers(t *testing.T, bin string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		exe, err := os.Readlink("/proc/" + e.Name() + "/exe")
		if err == nil && strings.TrimSuffix(exe, " (deleted)") == bin {
			n++
		}
	}
	return n
}
