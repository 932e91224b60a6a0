package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// The jetstream baselines run the workload against what a user would pick
// instead of qbroker: a NATS JetStream work queue (file storage) on a
// nats-server run as its users run it, its own process on this machine.
// "jetstream" keeps the server's default durability (it syncs its files
// every 2 minutes); "jetstream-sync" sets `sync_interval: always`, so
// every write is fsynced, as ZooKeeper does every commit, and the two
// compare at equal durability.
//
// At least once, each runs twice, once per ack style: plain Ack (the
// consumer does not wait for the server; its result keeps the baseline's
// name) and DoubleAck (the consumer waits until the server confirms the
// ack; the result's name ends in -doubleack). At most once it runs with
// plain Ack only: a pull consumer of a work queue must ack explicitly,
// and a message acked as soon as it arrives is delivered at most once.
const (
	baselineJetStream     = "jetstream"
	baselineJetStreamSync = "jetstream-sync"
	doubleAckSuffix       = "-doubleack"
)

// JetStream ack styles, as reported.
const (
	jsAckPlain  = "ack"        // Ack: sent, not confirmed
	jsAckDouble = "double-ack" // DoubleAck: the server confirms it
)

// jsDefaultMaxAckPending is the server's default MaxAckPending of a
// consumer.
const jsDefaultMaxAckPending = 1000

// jsMaxAckPending is the MaxAckPending a user would give the consumers'
// durable: the server's default (0 here), unless the consumers together
// may hold more (consumers × prefetch), then that.
func jsMaxAckPending(consumers, prefetch int) int {
	if n := consumers * prefetch; n > jsDefaultMaxAckPending {
		return n
	}
	return 0
}

// jsFetchWait bounds a Fetch that finds fewer messages than it asked
// for; it only matters once the queue is empty.
const jsFetchWait = time.Second

// runJetStream runs the JetStream baseline (jetstream, or jetstream-sync
// with syncAlways) on a nats-server started from bin: once at most once
// (plain Ack), twice at least once (plain Ack, then DoubleAck), each on a
// fresh server.
func runJetStream(ctx context.Context, cfg *Config, bin string, syncAlways bool, progress io.Writer) ([]BaselineResult, error) {
	styles := []string{jsAckPlain}
	if cfg.Mode == qbroker.AtLeastOnce {
		styles = []string{jsAckPlain, jsAckDouble}
	}
	var out []BaselineResult
	for _, ack := range styles {
		r, err := runJetStreamOnce(ctx, cfg, bin, syncAlways, ack, progress)
		if err != nil {
			return out, fmt.Errorf("%s: %w", jsName(syncAlways, ack), err)
		}
		out = append(out, r)
	}
	return out, nil
}

// jsName names the JetStream baseline of a durability and an ack style.
func jsName(syncAlways bool, ack string) string {
	name := baselineJetStream
	if syncAlways {
		name = baselineJetStreamSync
	}
	if ack == jsAckDouble {
		name += doubleAckSuffix
	}
	return name
}

// runJetStreamOnce starts a nats-server in a temporary directory, runs
// the workload against it with the ack style ack and stops it. Every
// producer and every consumer has its own NATS connection. Producers
// publish cfg.Batch messages a call (one: Publish, waiting for its ack;
// more: PublishAsync, then waiting for every ack); consumers share one
// durable pull consumer (explicit acks, MaxAckPending as jsMaxAckPending
// says) and Fetch up to cfg.Prefetch messages at a time. With a backlog it
// publishes first and measures the drain, else it publishes for
// cfg.BaselineDuration. Either way the measure ends when every published
// message is delivered (acked) and the stream is empty, that is when the
// server has applied every ack; the server's CPU is read over the same
// span.
func runJetStreamOnce(ctx context.Context, cfg *Config, bin string, syncAlways bool, ack string, progress io.Writer) (BaselineResult, error) {
	conns := cfg.Producers + cfg.Consumers
	res := BaselineResult{Name: jsName(syncAlways, ack), Sessions: conns, Goroutines: conns, Ack: ack,
		MaxAckPending: jsMaxAckPending(cfg.Consumers, cfg.Prefetch)}
	if res.MaxAckPending == 0 {
		res.MaxAckPending = jsDefaultMaxAckPending
	}
	dir, err := os.MkdirTemp("", "qbroker-loadtest-jetstream-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	srv, err := startNATS(ctx, bin, dir, syncAlways)
	if err != nil {
		return res, err
	}
	defer srv.stop()
	q, err := newJSQueue(ctx, srv.url, cfg, ack)
	if err != nil {
		return res, err
	}
	defer q.close()
	start := time.Now()
	n, errs, err := q.run(ctx, cfg, srv, func(delivered *atomic.Int64) (stop func()) {
		tctx, cancel := context.WithCancel(ctx)
		done := baselineTicker(tctx, progress, res.Name, start, delivered, "delivered")
		return func() { cancel(); <-done }
	})
	if err != nil {
		return res, err
	}
	if srv.exited() {
		return res, fmt.Errorf("nats-server exited during the run:\n%s", tail(srv.logPath))
	}
	if n.left > 0 {
		return res, fmt.Errorf("%d of %d published messages still in the stream after %v", n.left, n.published, cfg.DrainTimeout)
	}
	res.Messages, res.Errors = n.delivered, errs
	res.finish(n.end.Sub(n.measureStart), cpuSample{}, cpuSample{}, false)
	res.setServerCPU(n.cpu0, n.cpu1, n.cpuOK)
	return res, nil
}

// setServerCPU sets the baseline server's CPU per 1,000 messages and its
// average use in cores from two samples (when both were taken).
func (r *BaselineResult) setServerCPU(cpu0, cpu1 time.Duration, ok bool) {
	if !ok || r.Messages == 0 || r.Seconds <= 0 {
		return
	}
	d := (cpu1 - cpu0).Seconds()
	r.ServerCPUSecPer1k = d / float64(r.Messages) * 1000
	r.ServerCores = d / r.Seconds
}

// jsQueue is the work-queue stream with its durable consumer, and every
// connection the run opened: the admin's, one per producer and one per
// consumer.
type jsQueue struct {
	url   string
	ack   string
	admin *nats.Conn
	js    jetstream.JetStream // the admin's
	mu    sync.Mutex
	conns []*nats.Conn
}

const (
	jsStream   = "LOADTEST"
	jsSubject  = "loadtest"
	jsConsumer = "workers"
)

// newJSQueue connects to url and creates the stream and the consumers'
// durable.
func newJSQueue(ctx context.Context, url string, cfg *Config, ack string) (*jsQueue, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	q := &jsQueue{url: url, ack: ack, admin: nc}
	if q.js, err = jetstream.New(nc); err != nil {
		q.close()
		return nil, err
	}
	if _, err := q.js.CreateStream(ctx, jetstream.StreamConfig{Name: jsStream, Subjects: []string{jsSubject},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage}); err != nil {
		q.close()
		return nil, err
	}
	cc := jetstream.ConsumerConfig{Durable: jsConsumer, AckPolicy: jetstream.AckExplicitPolicy,
		MaxAckPending: jsMaxAckPending(cfg.Consumers, cfg.Prefetch), AckWait: 30 * time.Second}
	if _, err := q.js.CreateOrUpdateConsumer(ctx, jsStream, cc); err != nil {
		q.close()
		return nil, err
	}
	return q, nil
}

// connect opens a worker's own connection.
func (q *jsQueue) connect() (jetstream.JetStream, error) {
	nc, err := nats.Connect(q.url)
	if err != nil {
		return nil, err
	}
	q.mu.Lock()
	q.conns = append(q.conns, nc)
	q.mu.Unlock()
	return jetstream.New(nc)
}

// close closes every connection.
func (q *jsQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, nc := range q.conns {
		nc.Close()
	}
	q.conns = nil
	q.admin.Close()
}

// left returns how many messages the stream holds.
func (q *jsQueue) left(ctx context.Context) (uint64, error) {
	s, err := q.js.Stream(ctx, jsStream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// jsCounts is what a jetstream run counted.
type jsCounts struct {
	published, delivered int64
	left                 uint64    // messages still in the stream at the end
	measureStart         time.Time // the drain's start with a backlog, else the run's
	end                  time.Time // every message delivered and the stream empty, or the drain gave up
	cpu0, cpu1           time.Duration
	cpuOK                bool
}

// run runs the producers and consumers (see runJetStreamOnce) and returns
// what it counted and how many calls failed; ticker reports progress
// until the func it returns is called.
func (q *jsQueue) run(ctx context.Context, cfg *Config, srv *natsProc, ticker func(*atomic.Int64) func()) (jsCounts, int64, error) {
	payload := encodePayload(nil, cfg.Payload, msgKey{}, time.Now())
	var delivered, errs atomic.Int64
	defer ticker(&delivered)()
	producers := make([]jetstream.JetStream, cfg.Producers)
	consumers := make([]jetstream.Consumer, cfg.Consumers)
	for i := range producers {
		js, err := q.connect()
		if err != nil {
			return jsCounts{}, 0, err
		}
		producers[i] = js
	}
	for i := range consumers {
		js, err := q.connect()
		if err != nil {
			return jsCounts{}, 0, err
		}
		if consumers[i], err = js.Consumer(ctx, jsStream, jsConsumer); err != nil {
			return jsCounts{}, 0, err
		}
	}
	var out jsCounts
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	sampleCPU := func() (time.Duration, bool) {
		d, err := srv.cpu()
		return d, err == nil
	}
	out.measureStart = time.Now()
	var ok0 bool
	if cfg.Backlog > 0 {
		if out.published = jsPublishN(runCtx, producers, cfg, payload, int64(cfg.Backlog), &errs); ctx.Err() != nil {
			return out, errs.Load(), ctx.Err()
		}
		out.measureStart = time.Now()
	}
	out.cpu0, ok0 = sampleCPU()
	var wg sync.WaitGroup
	for _, c := range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			jsConsume(runCtx, c, cfg, q.ack, &delivered, &errs)
		}()
	}
	if cfg.Backlog == 0 {
		pctx, pstop := context.WithTimeout(runCtx, cfg.BaselineDuration)
		out.published = jsPublishN(pctx, producers, cfg, payload, 0, &errs)
		pstop()
	}
	out.left = q.waitDone(runCtx, &delivered, out.published, cfg.DrainTimeout)
	out.end = time.Now()
	var ok1 bool
	out.cpu1, ok1 = sampleCPU()
	out.cpuOK = ok0 && ok1
	out.delivered = delivered.Load()
	stop()
	wg.Wait()
	return out, errs.Load(), ctx.Err()
}

// waitDone waits until n messages are delivered (acked) and the stream is
// empty, ctx ends or timeout passes, and returns how many messages the
// stream still holds (0 when done).
func (q *jsQueue) waitDone(ctx context.Context, delivered *atomic.Int64, n int64, timeout time.Duration) uint64 {
	deadline := time.Now().Add(timeout)
	for {
		if delivered.Load() >= n {
			left, err := q.left(ctx)
			if err == nil && left == 0 {
				return 0
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			left, err := q.left(context.WithoutCancel(ctx))
			if err != nil || left == 0 {
				left = uint64(max(n-delivered.Load(), 1))
			}
			return left
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// jsPublishN publishes with one goroutine per producer (each on its own
// connection), cfg.Batch messages a call, n messages in all (0: until ctx
// ends), and returns how many the server acknowledged.
func jsPublishN(ctx context.Context, producers []jetstream.JetStream, cfg *Config, payload []byte, n int64, errs *atomic.Int64) int64 {
	var taken, published atomic.Int64
	var wg sync.WaitGroup
	for _, js := range producers {
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
		_, err := js.Publish(ctx, jsSubject, payload)
		return err
	}
	futures := make([]jetstream.PubAckFuture, 0, k)
	for range k {
		f, err := js.PublishAsync(jsSubject, payload)
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
// acks each in the style ack, and counts them.
func jsConsume(ctx context.Context, c jetstream.Consumer, cfg *Config, ack string, delivered, errs *atomic.Int64) {
	for ctx.Err() == nil {
		batch, err := c.Fetch(cfg.Prefetch, jetstream.FetchMaxWait(jsFetchWait))
		if err != nil {
			if ctx.Err() == nil {
				errs.Add(1)
			}
			continue
		}
		for m := range batch.Messages() {
			switch ack {
			case jsAckPlain:
				err = m.Ack()
			case jsAckDouble:
				err = m.DoubleAck(ctx)
			}
			if err != nil {
				if ctx.Err() == nil {
					errs.Add(1)
				}
				continue
			}
			delivered.Add(1)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			errs.Add(1)
		}
	}
}
