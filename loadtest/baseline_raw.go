package main

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// runRaw is the ceiling of any ZooKeeper queue: create+delete pairs of
// sequential nodes under one parent, pipelined, with no contention at
// all (each goroutine deletes the node it created). cfg.RawSessions
// sessions each run cfg.RawGoroutines goroutines: one session alone tops
// out far below ZooKeeper's capacity.
func runRaw(ctx context.Context, cfg *Config, topo *Topology, progress io.Writer) (BaselineResult, error) {
	res := BaselineResult{Name: baselineRaw, Sessions: cfg.RawSessions, Goroutines: cfg.RawSessions * cfg.RawGoroutines}
	op := func(conn *zk.Conn, parent string, data []byte) error {
		p, err := conn.Create(parent+"/qn-", data, zk.FlagSequence, worldACL)
		if err != nil {
			return err
		}
		return conn.Delete(p, -1)
	}
	return runZKOps(ctx, cfg, topo, progress, zkOps{res: res, perSession: cfg.RawGoroutines, unit: "pairs", op: op})
}

// worldACL is the ACL of the baselines' nodes.
var worldACL = zk.WorldACL(zk.PermAll)

// zkOps is a baseline of ZooKeeper calls: its result to fill in (named,
// with its sessions), the goroutines per session, the unit its progress
// counts, the call, and where each goroutine's latency histogram goes
// (nil: none is kept).
type zkOps struct {
	res        BaselineResult
	perSession int
	unit       string
	hists      *[]*hdrhistogram.Histogram
	op         func(conn *zk.Conn, parent string, data []byte) error
}

// runZKOps runs o.res.Sessions sessions of o.perSession goroutines, each
// calling o.op in closed loop under a fresh parent node (removed after)
// until cfg.BaselineDuration passes, and counts the calls that succeed.
// With o.hists, each goroutine also records its calls' latencies into one
// (o.hists gets one per goroutine). A call failing because ZooKeeper is
// away is retried after 10 ms.
func runZKOps(ctx context.Context, cfg *Config, topo *Topology, progress io.Writer, o zkOps) (BaselineResult, error) {
	res := o.res
	parent := baselineRoot(cfg.Queue) + "/" + res.Name
	conns, err := openSessions(topo.ZooKeeper, res.Sessions)
	if err != nil {
		return res, err
	}
	defer closeSessions(conns)
	if err := zkutil.EnsurePath(conns[0], parent, nil); err != nil {
		return res, err
	}
	defer func() { _ = removeTree(context.WithoutCancel(ctx), conns[0], parent) }()
	data := baselineData(cfg)

	var stop atomic.Bool
	var done, errs atomic.Int64
	var wg sync.WaitGroup
	cpu0, cpuOK := topo.cpu()
	start := time.Now()
	for _, conn := range conns {
		for range o.perSession {
			var h *hdrhistogram.Histogram
			if o.hists != nil {
				h = newHist()
				*o.hists = append(*o.hists, h)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					var t time.Time
					if h != nil {
						t = time.Now()
					}
					if err := o.op(conn, parent, data); err != nil {
						errs.Add(1)
						if zkutil.IsUnavailable(err) {
							time.Sleep(10 * time.Millisecond)
						}
						continue
					}
					if h != nil {
						record(h, time.Since(t))
					}
					done.Add(1)
				}
			}()
		}
	}
	tctx, stopTicker := context.WithCancel(ctx)
	tickerDone := baselineTicker(tctx, progress, res.Name, start, &done, o.unit)
	stopAfter(ctx, cfg.BaselineDuration, &stop, nil)
	elapsed := time.Since(start)
	res.Messages = done.Load()
	cpu1, cpu1OK := topo.cpu()
	stopTicker()
	<-tickerDone
	joinWorkers(&wg, conns)

	res.finish(elapsed, cpu0, cpu1, cpuOK && cpu1OK)
	res.Errors = errs.Load()
	return res, ctx.Err()
}
