package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// BaselineResult is what a baseline measured on the same ZooKeeper as
// the brokers, with the same payload.
type BaselineResult struct {
	Name       string  `json:"name"`
	Seconds    float64 `json:"seconds"`
	Sessions   int     `json:"sessions"`
	Goroutines int     `json:"goroutines"`
	// Messages: create+delete pairs (raw) or messages delivered (naive).
	Messages int64   `json:"messages"`
	PerSec   float64 `json:"per_sec"`
	Errors   int64   `json:"errors"`
	// Naive only: the queue's depth at the start, and the lost races
	// (a getData or delete that found the node gone).
	Prefill               int     `json:"prefill,omitempty"`
	Conflicts             int64   `json:"conflicts,omitempty"`
	ConflictsOnGet        int64   `json:"conflicts_on_get,omitempty"`
	ConflictsOnDelete     int64   `json:"conflicts_on_delete,omitempty"`
	ConflictsPerDelivered float64 `json:"conflicts_per_delivered,omitempty"`
	Drained               bool    `json:"drained,omitempty"`
	// Create only: the latency of one create call.
	Latency *LatencySummary `json:"latency,omitempty"`
	// Spawned topologies: ZooKeeper's CPU per 1,000 messages (pairs),
	// and its average use in cores.
	ZooKeeperCPUSecPer1k float64 `json:"zookeeper_cpu_seconds_per_1k,omitempty"`
	ZooKeeperCores       float64 `json:"zookeeper_cpu_cores,omitempty"`
	// JetStream only: the ack style (ack or double-ack), the durable's
	// MaxAckPending, and the nats-server process's
	// CPU per 1,000 messages and average use in cores over the measure.
	Ack               string  `json:"ack,omitempty"`
	MaxAckPending     int     `json:"max_ack_pending,omitempty"`
	ServerCPUSecPer1k float64 `json:"server_cpu_seconds_per_1k,omitempty"`
	ServerCores       float64 `json:"server_cpu_cores,omitempty"`
}

// finish derives the rates from the messages counted over elapsed, and
// ZooKeeper's CPU use from two samples (when both were taken).
func (r *BaselineResult) finish(elapsed time.Duration, cpu0, cpu1 cpuSample, cpuOK bool) {
	r.Seconds = elapsed.Seconds()
	r.PerSec = float64(r.Messages) / r.Seconds
	if cpuOK && r.Messages > 0 {
		d := (cpu1.ZooKeeper - cpu0.ZooKeeper).Seconds()
		r.ZooKeeperCPUSecPer1k = d / float64(r.Messages) * 1000
		r.ZooKeeperCores = d / r.Seconds
	}
}

// baselineRoot is where the baselines write, next to nothing of the
// brokers'; removed when they end.
func baselineRoot(queue string) string { return "/qbroker-loadtest-baselines/" + queue }

// baselineData is the node data of a baseline message: a load-test payload
// of the configured size in the broker's encoding, so ZooKeeper moves the
// same bytes as for qbroker.
func baselineData(cfg *Config) []byte {
	return zkqueue.EncodeData(zkqueue.Message{Payload: encodePayload(nil, cfg.Payload, msgKey{}, time.Now()), Published: time.Now()})
}

// openSessions opens n ZooKeeper sessions and waits until each has one.
func openSessions(addr string, n int) ([]*zk.Conn, error) {
	conns := make([]*zk.Conn, 0, n)
	for range n {
		c, err := zkutil.Connect([]string{addr}, 10*time.Second, nil, nil)
		if err != nil {
			closeSessions(conns)
			return nil, err
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		if err := zkutil.WaitConnected(c, 10*time.Second); err != nil {
			closeSessions(conns)
			return nil, err
		}
	}
	return conns, nil
}

func closeSessions(conns []*zk.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// stopAfter sets stop when d has passed or ctx ends, whichever is first,
// and returns when stop is set or all workers are done.
func stopAfter(ctx context.Context, d time.Duration, stop *atomic.Bool, done <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-done:
	}
	stop.Store(true)
}

// joinWorkers waits for wg; if the workers do not end within 15s (a
// ZooKeeper call stuck), it closes the sessions, which fails their calls,
// and waits again.
func joinWorkers(wg *sync.WaitGroup, conns []*zk.Conn) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		closeSessions(conns)
		<-done
	}
}

// removeTree deletes a baseline's nodes, many to a Multi, then its
// parents as long as they are empty.
func removeTree(ctx context.Context, conn *zk.Conn, p string) error {
	children, _, err := conn.Children(p)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	paths := make([]string, len(children))
	for i, c := range children {
		paths[i] = p + "/" + c
	}
	if _, err := zkutil.DeleteNodes(ctx, conn, paths); err != nil {
		return err
	}
	for ; p != "/"; p = path.Dir(p) {
		if err := conn.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return nil // not empty: another baseline's or run's nodes
		}
	}
	return nil
}

// baselineTicker prints a progress line every second until ctx ends.
// The caller owns its goroutine: cancel ctx and wait for the returned
// channel.
func baselineTicker(ctx context.Context, out io.Writer, name string, start time.Time, count *atomic.Int64, unit string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if out == nil {
			return
		}
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last := int64(0)
		for {
			select {
			case now := <-t.C:
				n := count.Load()
				fmt.Fprintf(out, "%-8s %5.0fs  %s %9d (%6d/s)\n", name, now.Sub(start).Seconds(), unit, n, n-last)
				last = n
			case <-ctx.Done():
				return
			}
		}
	}()
	return done
}
