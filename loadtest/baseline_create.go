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

// baselineCreate is the latency floor of a durable publish: --producers
// goroutines, each with its own session, create one sequential node at a
// time (the message's create alone, as a publish of one message ends in),
// in closed loop. Its latency percentiles stand beside qbroker's publish
// call latency.
const baselineCreate = "create"

// runCreate measures bare creates of payload-sized nodes (see
// baselineCreate) for cfg.BaselineDuration; the nodes are removed after.
func runCreate(ctx context.Context, cfg *Config, zkAddr string, topo *Topology, progress io.Writer) (BaselineResult, error) {
	res := BaselineResult{Name: baselineCreate, Sessions: cfg.Producers, Goroutines: cfg.Producers}
	parent := baselineRoot(cfg.Queue) + "/create"
	conns, err := openSessions(zkAddr, cfg.Producers)
	if err != nil {
		return res, err
	}
	defer closeSessions(conns)
	if err := zkutil.EnsurePath(conns[0], parent); err != nil {
		return res, err
	}
	defer func() { _ = removeTree(context.WithoutCancel(ctx), conns[0], parent) }()
	data := baselineData(cfg)
	acl := zk.WorldACL(zk.PermAll)

	var stop atomic.Bool
	var created, errs atomic.Int64
	hists := make([]*hdrhistogram.Histogram, len(conns))
	var wg sync.WaitGroup
	cpu0, cpuOK := topo.cpu()
	start := time.Now()
	for i, conn := range conns {
		hists[i] = newHist()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				t := time.Now()
				if _, err := conn.Create(parent+"/qn-", data, zk.FlagSequence, acl); err != nil {
					errs.Add(1)
					if zkutil.IsUnavailable(err) {
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				record(hists[i], time.Since(t))
				created.Add(1)
			}
		}()
	}
	tctx, stopTicker := context.WithCancel(ctx)
	tickerDone := baselineTicker(tctx, progress, baselineCreate, start, &created, "creates")
	stopAfter(ctx, cfg.BaselineDuration, &stop, nil)
	elapsed := time.Since(start)
	res.Messages = created.Load()
	cpu1, cpu1OK := topo.cpu()
	stopTicker()
	<-tickerDone
	joinWorkers(&wg, conns)

	res.finish(elapsed, cpu0, cpu1, cpuOK && cpu1OK)
	res.Errors = errs.Load()
	lat := summarize(mergeHists(hists))
	res.Latency = &lat
	return res, ctx.Err()
}
