package main

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// The jetstream baselines run the workload against what a user would pick
// instead of qbroker: a NATS JetStream work queue (file storage) on an
// in-process nats-server on this machine. "jetstream" keeps the server's
// default durability (it syncs its files every 2 minutes); "jetstream-sync"
// syncs every write, as ZooKeeper does every commit, so the two compare at
// equal durability.
const (
	baselineJetStream     = "jetstream"
	baselineJetStreamSync = "jetstream-sync"
)

// runJetStream runs cfg's producers and consumers against a JetStream
// work queue: producers publish cfg.Batch messages a call (async publish,
// then waiting for every ack); consumers fetch up to cfg.Prefetch
// messages at a time and ack each one (at-least-once), or take them
// without acks (at-most-once). With a backlog it publishes first and
// measures the drain, else it runs for cfg.BaselineDuration and counts
// what was delivered.
func runJetStream(ctx context.Context, cfg *Config, syncAlways bool, progress io.Writer) (BaselineResult, error) {
	name := baselineJetStream
	if syncAlways {
		name = baselineJetStreamSync
	}
	res := BaselineResult{Name: name, Sessions: cfg.Producers + cfg.Consumers, Goroutines: cfg.Producers + cfg.Consumers}
	dir, err := os.MkdirTemp("", "qbroker-loadtest-jetstream-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: dir, SyncAlways: syncAlways})
	if err != nil {
		return res, err
	}
	go ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		return res, errors.New("nats-server not ready")
	}
	js, closeJS, err := jetStreamQueue(ctx, ns.ClientURL(), cfg)
	if err != nil {
		return res, err
	}
	defer closeJS()
	start := time.Now()
	n, errs, err := jetStreamWorkload(ctx, js, cfg, func(delivered *atomic.Int64) (stop func()) {
		tctx, cancel := context.WithCancel(ctx)
		done := baselineTicker(tctx, progress, name, start, delivered, "delivered")
		return func() { cancel(); <-done }
	})
	if err != nil {
		return res, err
	}
	res.Messages, res.Errors = n.delivered, errs
	res.finish(n.elapsed(start), cpuSample{}, cpuSample{}, false)
	return res, nil
}

// jetStreamQueue connects to url and creates the work-queue stream and
// its shared pull consumer.
func jetStreamQueue(ctx context.Context, url string, cfg *Config) (jetstream.Consumer, func(), error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOADTEST", Subjects: []string{"loadtest"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage}); err != nil {
		nc.Close()
		return nil, nil, err
	}
	ack := jetstream.AckExplicitPolicy
	if cfg.Mode != qbroker.AtLeastOnce {
		ack = jetstream.AckNonePolicy
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "LOADTEST", jetstream.ConsumerConfig{Durable: "workers", AckPolicy: ack,
		MaxAckPending: -1, AckWait: 30 * time.Second})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return &jsQueue{Consumer: c, js: js}, nc.Close, nil
}

// jsQueue is the consumer with the context it publishes through.
type jsQueue struct {
	jetstream.Consumer
	js jetstream.JetStream
}

// jsCounts is what a jetstream run counted.
type jsCounts struct {
	delivered  int64
	drainStart time.Time // with a backlog
	end        time.Time
}

// elapsed is the measured time: the drain with a backlog, else the run.
func (n jsCounts) elapsed(start time.Time) time.Duration {
	if !n.drainStart.IsZero() {
		return n.end.Sub(n.drainStart)
	}
	return n.end.Sub(start)
}

// jetStreamWorkload runs the producers and consumers (see runJetStream)
// and returns what was delivered and how many calls failed; ticker
// reports progress until the func it returns is called.
func jetStreamWorkload(ctx context.Context, c jetstream.Consumer, cfg *Config, ticker func(*atomic.Int64) func()) (jsCounts, int64, error) {
	q := c.(*jsQueue)
	payload := encodePayload(nil, cfg.Payload, msgKey{}, time.Now())
	var delivered, errs atomic.Int64
	defer ticker(&delivered)()
	var out jsCounts
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var backlog int64
	if cfg.Backlog > 0 {
		if backlog = jsPublishN(runCtx, q.js, cfg, payload, int64(cfg.Backlog), &errs); ctx.Err() != nil {
			return out, errs.Load(), ctx.Err()
		}
		out.drainStart = time.Now()
	}
	var wg sync.WaitGroup
	for range cfg.Consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			jsConsume(runCtx, q, cfg, &delivered, &errs)
		}()
	}
	if cfg.Backlog > 0 {
		waitCount(runCtx, &delivered, backlog, cfg.DrainTimeout)
	} else {
		pctx, pstop := context.WithTimeout(runCtx, cfg.BaselineDuration)
		_ = jsPublishN(pctx, q.js, cfg, payload, 0, &errs)
		pstop()
	}
	out.end = time.Now()
	out.delivered = delivered.Load()
	stop()
	wg.Wait()
	return out, errs.Load(), ctx.Err()
}

// jsPublishN publishes with cfg.Producers goroutines, cfg.Batch messages
// a call, n messages in all (0: until ctx ends), and returns how many were
// acknowledged by the server.
func jsPublishN(ctx context.Context, js jetstream.JetStream, cfg *Config, payload []byte, n int64, errs *atomic.Int64) int64 {
	var taken, published atomic.Int64
	var wg sync.WaitGroup
	for range cfg.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				k := int64(cfg.Batch)
				if n > 0 {
					from := taken.Add(k) - k
					if from >= n {
						return
					}
					k = min(k, n-from)
				}
				if err := jsPublishBatch(ctx, js, payload, int(k)); err != nil {
					if ctx.Err() == nil {
						errs.Add(1)
					}
					continue
				}
				published.Add(k)
			}
		}()
	}
	wg.Wait()
	return published.Load()
}

// jsPublishBatch publishes k messages and waits for all their acks.
func jsPublishBatch(ctx context.Context, js jetstream.JetStream, payload []byte, k int) error {
	if k == 1 {
		_, err := js.Publish(ctx, "loadtest", payload)
		return err
	}
	futures := make([]jetstream.PubAckFuture, 0, k)
	for range k {
		f, err := js.PublishAsync("loadtest", payload)
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// jsConsume fetches up to cfg.Prefetch messages at a time until ctx ends,
// acking each in at-least-once mode, and counts them.
func jsConsume(ctx context.Context, q *jsQueue, cfg *Config, delivered, errs *atomic.Int64) {
	for ctx.Err() == nil {
		batch, err := q.Fetch(cfg.Prefetch, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			errs.Add(1)
			continue
		}
		for m := range batch.Messages() {
			if cfg.Mode == qbroker.AtLeastOnce {
				if err := m.Ack(); err != nil {
					errs.Add(1)
					continue
				}
			}
			delivered.Add(1)
		}
	}
}

// waitCount waits until c reaches n, ctx ends or timeout passes.
func waitCount(ctx context.Context, c *atomic.Int64, n int64, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for c.Load() < n && ctx.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}
