package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/go-zookeeper/zk"

	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// The load probe (--probe) times, while the producers publish, the two
// hops a publish of one message makes, each alone: one round trip to a
// broker (Client.Ping, a gRPC health check, over the load test's first
// connection) and one bare ZooKeeper create of a message-sized node, on a
// session of its own. Each is paced at one call every probeInterval, so
// the probe adds little to the load it measures. Beside qbroker's publish
// latency this tells what the machine as loaded makes any publish cost,
// and what the broker adds to it; the create baseline is the same create
// on an idle machine.
const probeInterval = 2 * time.Millisecond

// LoadProbe is what the probe measured.
type LoadProbe struct {
	IntervalMS   float64        `json:"interval_ms"`
	Ping         LatencySummary `json:"ping"`
	Create       LatencySummary `json:"create"`
	PingErrors   int64          `json:"ping_errors"`
	CreateErrors int64          `json:"create_errors"`
}

// loadProbe is a running probe; stop ends it.
type loadProbe struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	conn   *zk.Conn
	parent string

	ping, create      *hdrhistogram.Histogram
	pingErrs, crtErrs int64
}

// startLoadProbe starts the probe against c's broker and the ZooKeeper at
// zkAddr, under a node of its own that stop removes.
func startLoadProbe(ctx context.Context, cfg *Config, c *qbroker.Client, zkAddr string) (*loadProbe, error) {
	conns, err := openSessions(zkAddr, 1)
	if err != nil {
		return nil, err
	}
	p := &loadProbe{conn: conns[0], parent: baselineRoot(cfg.Queue) + "/probe", ping: newHist(), create: newHist()}
	if err := zkutil.EnsurePath(p.conn, p.parent, nil); err != nil {
		p.conn.Close()
		return nil, err
	}
	data := baselineData(cfg)
	ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		p.pingErrs = paced(ctx, p.ping, func() error { return c.Ping(ctx) })
	}()
	go func() {
		defer p.wg.Done()
		p.crtErrs = paced(ctx, p.create, func() error {
			_, err := p.conn.Create(p.parent+"/qn-", data, zk.FlagSequence, worldACL)
			return err
		})
	}()
	return p, nil
}

// paced calls op every probeInterval until ctx ends, recording the
// latencies of the calls that succeed into h; it returns how many failed.
func paced(ctx context.Context, h *hdrhistogram.Histogram, op func() error) (errs int64) {
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return errs
		case <-t.C:
		}
		start := time.Now()
		if err := op(); err != nil {
			if !errors.Is(err, context.Canceled) {
				errs++
			}
			continue
		}
		record(h, time.Since(start))
	}
}

// stop ends the probe, removes its nodes and returns what it measured.
func (p *loadProbe) stop(ctx context.Context) LoadProbe {
	p.cancel()
	p.wg.Wait()
	_ = removeTree(context.WithoutCancel(ctx), p.conn, p.parent)
	p.conn.Close()
	return LoadProbe{
		IntervalMS: float64(probeInterval) / float64(time.Millisecond),
		Ping:       summarize(p.ping), Create: summarize(p.create),
		PingErrors: p.pingErrs, CreateErrors: p.crtErrs,
	}
}
