package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// workloadResult is what one run of producers and consumers measured.
type workloadResult struct {
	Start      time.Time // producers started (consumers were subscribed, unless Backlog)
	PublishEnd time.Time // the last producer finished
	// DrainStart: with Backlog, when the consumers started, after every
	// message was published; zero otherwise.
	DrainStart time.Time
	End        time.Time // every published message was complete, or the drain gave up
	Verdict    Verdict
	// Problems beyond the checker's: drain timeout, consumers that
	// ended, messages left in the queue.
	Problems     []string
	Interrupted  bool
	Publish      *hdrhistogram.Histogram // publish call latency
	EndToEnd     *hdrhistogram.Histogram // send time to first delivery
	ErrorsByCode map[string]int64
	ErrorsByOp   map[string]int64
	Timeline     []TimelinePoint
	// MaxSendLag: open loop, the most a publish call started after its
	// due time. Much more than a publish latency means the producers
	// could not keep the rate (add producers).
	MaxSendLag time.Duration
	Tenants    []TenantLatency // with --tenants
}

// shared is what every producer and consumer of a run reports to.
type shared struct {
	cfg     *Config
	checker *Checker
	live    *liveCounters
	errs    *errorCounts
	tenants *tenantHists // with --tenants
}

// runWorkload runs producers and consumers on the existing queue
// cfg.Queue. It subscribes the consumers, runs the producers until their
// quota or deadline (with a backlog, the producers first, then the
// consumers), waits until every published message is delivered
// (acked at least once) or cfg.DrainTimeout passes, closes the consumers
// and checks that the queue is empty. Every goroutine it starts has ended
// when it returns.
func runWorkload(ctx context.Context, cfg *Config, pool *connPool, progress io.Writer, hooks workloadHooks) (*workloadResult, error) {
	ackMode := cfg.Mode == qbroker.AtLeastOnce
	live := &liveCounters{}
	sh := &shared{cfg: cfg, checker: NewChecker(cfg.Producers, ackMode), live: live, errs: newErrorCounts(live)}
	if cfg.Tenants > 0 {
		sh.tenants = newTenantHists(cfg.Tenants)
	}
	if cfg.SingleActive {
		sh.checker.holds = newHoldLog()
	}
	if cfg.KillActiveAfter > 0 {
		sh.checker.ackLost = pool.workerKilled
	}
	res := &workloadResult{}

	// Consumers first, so producers publish into a consumed queue; with
	// a backlog, after the producers, so they find it all there.
	var consumers *consumerGroup
	var err error
	if cfg.Backlog == 0 {
		clients, err := consumerClients(ctx, sh, pool)
		if err != nil {
			return nil, err
		}
		consumers = startConsumers(ctx, sh, clients)
	}
	res.Start = time.Now()
	producers, err := newProducers(ctx, sh, pool, res.Start)
	if err != nil {
		if consumers != nil {
			consumers.close()
		}
		return nil, err
	}
	var phase atomic.Value
	phase.Store("publish")
	sctx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	s := newSampler(live, res.Start, progress, ackMode, func() string { return phase.Load().(string) })
	go s.run(sctx)
	var stopBeside func()
	if hooks.whilePublishing != nil {
		stopBeside = hooks.whilePublishing(ctx)
	}
	runProducers(ctx, producers)
	if stopBeside != nil {
		stopBeside()
	}
	res.PublishEnd = time.Now()
	phase.Store("drain")
	if cfg.Backlog > 0 {
		if hooks.beforeDrain != nil && ctx.Err() == nil {
			phase.Store("cold broker")
			hooks.beforeDrain(ctx)
			phase.Store("drain")
		}
		// Connected before the drain's clock starts, as the JetStream
		// baseline's consumers are: the drain times the streams, not
		// the dials.
		clients, err := consumerClients(ctx, sh, pool)
		if err != nil {
			stopSampler()
			<-s.done
			return nil, err
		}
		if hooks.drainStarts != nil {
			hooks.drainStarts()
		}
		res.DrainStart = time.Now()
		consumers = startConsumers(ctx, sh, clients)
	}

	if ctx.Err() == nil {
		res.Problems = append(res.Problems, drain(ctx, sh, &consumers.left)...)
	}
	res.Interrupted = ctx.Err() != nil
	res.End = time.Now()
	if hooks.drainEnds != nil {
		hooks.drainEnds()
	}
	res.Problems = append(res.Problems, consumers.close()...)
	stopSampler()
	<-s.done
	judge(ctx, pool, sh, res)
	res.addFigures(sh, producers, consumers, s)
	return res, nil
}

// workloadHooks are what a run does besides publishing and consuming.
type workloadHooks struct {
	// beforeDrain, with a backlog, runs once every message is published,
	// before the consumers start.
	beforeDrain func(context.Context)
	// whilePublishing starts what runs beside the producers; the
	// function it returns stops it when the last producer finished.
	whilePublishing func(context.Context) (stop func())
	// drainStarts, with a backlog, runs as the drain's clock starts;
	// drainEnds as the run's clock stops (the drain's end).
	drainStarts, drainEnds func()
}

// runProducers runs the producers until their quota or deadline and
// waits for them.
func runProducers(ctx context.Context, producers []*producer) {
	var wg sync.WaitGroup
	for _, p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.run(ctx)
		}()
	}
	wg.Wait()
}

// judge gives a run that ended its verdict.
func judge(ctx context.Context, pool *connPool, sh *shared, res *workloadResult) {
	cfg := sh.cfg
	if !res.Interrupted {
		res.Verdict = sh.checker.Verdict(cfg.Order == orderStrict)
		if p := leftovers(ctx, cfg, pool, res.Verdict); p != "" {
			res.Problems = append(res.Problems, p)
		}
	} else {
		// Not every message had its chance: counts, but no verdict.
		res.Verdict = sh.checker.Verdict(false)
		res.Verdict.OK, res.Verdict.Lost, res.Verdict.Problems = false, 0, nil
	}
}

// addFigures adds a run's figures: its producers' publish latencies,
// its consumers' end-to-end ones, the errors counted and the sampled
// timeline.
func (res *workloadResult) addFigures(sh *shared, producers []*producer, consumers *consumerGroup, s *sampler) {
	pubHists := make([]*hdrhistogram.Histogram, len(producers))
	for i, p := range producers {
		pubHists[i] = p.hist
		res.MaxSendLag = max(res.MaxSendLag, p.maxLag)
	}
	res.Publish = mergeHists(pubHists)
	res.EndToEnd = mergeHists(consumers.hists)
	res.Tenants = sh.tenants.summaries(sh.cfg)
	res.ErrorsByCode, res.ErrorsByOp = sh.errs.snapshot()
	res.Timeline = s.points
}

// consumerGroup owns the consumers' goroutines.
type consumerGroup struct {
	stop  chan struct{}
	wg    sync.WaitGroup
	left  atomic.Int64 // consumers still running
	errs  chan error   // why consumers ended, buffered for all
	hists []*hdrhistogram.Histogram
}

// consumerClients returns the connections of cfg.Consumers consumers,
// spread over the pool.
func consumerClients(ctx context.Context, sh *shared, pool *connPool) ([]*qbroker.Client, error) {
	out := make([]*qbroker.Client, sh.cfg.Consumers)
	for i := range out {
		cl, err := pool.client(ctx, i)
		if err != nil {
			return nil, err
		}
		out[i] = cl
	}
	return out, nil
}

// startConsumers starts a consumer on each of clients.
func startConsumers(ctx context.Context, sh *shared, clients []*qbroker.Client) *consumerGroup {
	n := len(clients)
	g := &consumerGroup{stop: make(chan struct{}), errs: make(chan error, n)}
	for i, cl := range clients {
		c := &consumer{shared: sh, id: i, client: cl, hist: newHist()}
		g.hists = append(g.hists, c.hist)
		g.wg.Add(1)
		g.left.Add(1)
		go func() {
			defer g.wg.Done()
			defer g.left.Add(-1)
			if err := c.run(ctx, g.stop); err != nil {
				g.errs <- err
			}
		}()
	}
	return g
}

// close stops the consumers, waits for them and returns why any of them
// had ended before.
func (g *consumerGroup) close() []string {
	close(g.stop)
	g.wg.Wait()
	close(g.errs)
	var out []string
	for err := range g.errs {
		out = append(out, err.Error())
	}
	return out
}

// newProducers sets up the producers, spread over the pool, with their
// share of cfg.Messages, their deadline and, in open loop, their
// schedule. Producers whose share is 0 are left out.
func newProducers(ctx context.Context, sh *shared, pool *connPool, start time.Time) ([]*producer, error) {
	cfg := sh.cfg
	var out []*producer
	for i := range cfg.Producers {
		cl, err := pool.client(ctx, i)
		if err != nil {
			return nil, err
		}
		p := &producer{shared: sh, id: i, client: cl, hist: newHist(),
			rng: rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))}
		if cfg.Messages > 0 {
			p.quota = cfg.Messages / cfg.Producers
			if i < cfg.Messages%cfg.Producers {
				p.quota++
			}
			if p.quota == 0 {
				continue
			}
		}
		if cfg.Duration > 0 {
			p.until = start.Add(cfg.Duration)
		}
		if cfg.Rate > 0 {
			p.next, p.interval = openLoopSchedule(cfg, i, start)
			if cfg.Tenants > 0 {
				p.next, p.interval = tenantSchedule(cfg, i, start)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// openLoopSchedule returns when producer i's first call is due and its
// interval per message. Each producer publishes Rate/P messages a second,
// one call of Batch messages every Batch*P/Rate; the producers' calls are
// staggered evenly over that period, so that calls arrive one every
// Batch/Rate in total instead of in bursts of P.
func openLoopSchedule(cfg *Config, i int, start time.Time) (first time.Time, interval time.Duration) {
	interval = time.Duration(float64(time.Second) * float64(cfg.Producers) / cfg.Rate)
	return start.Add(time.Duration(float64(time.Second) * float64(i*cfg.Batch) / cfg.Rate)), interval
}

// drain waits until every published message is complete. It returns the
// problems that ended it otherwise.
func drain(ctx context.Context, sh *shared, consumersLeft *atomic.Int64) []string {
	cfg := sh.cfg
	deadline := time.Now().Add(cfg.DrainTimeout)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	what := "delivered"
	if cfg.Mode == qbroker.AtLeastOnce {
		what = "acked"
	}
	for {
		published, completed := sh.checker.Progress()
		switch {
		case completed >= published:
			return nil
		case consumersLeft.Load() == 0:
			return []string{fmt.Sprintf("every consumer ended: %d of %d published messages %s", completed, published, what)}
		case time.Now().After(deadline):
			return []string{fmt.Sprintf("drain timed out after %v: %d of %d published messages %s", cfg.DrainTimeout, completed, published, what)}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// leftovers checks, once consumers are closed, that the queue holds no
// ready or in-flight message beyond those whose publish failed (which may
// or may not have been written). The broker applies settlements sent on a
// stream before it ends, so a short wait suffices.
func leftovers(ctx context.Context, cfg *Config, pool *connPool, v Verdict) string {
	cl, err := pool.admin(ctx)
	if err != nil {
		return err.Error()
	}
	allowed := v.Uncertain
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := cl.Stats(ctx, cfg.Queue)
		if err != nil {
			return fmt.Sprintf("stats after the run: %v", err)
		}
		left := int64(st.Ready + st.InFlight)
		if left <= allowed {
			return ""
		}
		if time.Now().After(deadline) || !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return fmt.Sprintf("%d messages left in the queue after the run (ready %d, in flight %d)", left, st.Ready, st.InFlight)
		}
	}
}
