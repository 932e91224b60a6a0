package main

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// runRaw is the ceiling of any ZooKeeper queue: create+delete pairs of
// sequential nodes under one parent, pipelined, with no contention at
// all (each goroutine deletes the node it created). cfg.RawSessions
// sessions each run cfg.RawGoroutines goroutines: one session alone tops
// out far below ZooKeeper's capacity.
func runRaw(ctx context.Context, cfg *Config, zkAddr string, topo *Topology, progress io.Writer) (BaselineResult, error) {
	res := BaselineResult{Name: baselineRaw, Sessions: cfg.RawSessions, Goroutines: cfg.RawSessions * cfg.RawGoroutines}
	parent := baselineRoot(cfg.Queue) + "/raw"
	conns, err := openSessions(zkAddr, cfg.RawSessions)
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
	var pairs, errs atomic.Int64
	var wg sync.WaitGroup
	cpu0, cpuOK := topo.cpu()
	start := time.Now()
	for _, conn := range conns {
		for range cfg.RawGoroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					p, err := conn.Create(parent+"/qn-", data, zk.FlagSequence, acl)
					if err != nil {
						errs.Add(1)
						if zkutil.IsUnavailable(err) {
							time.Sleep(10 * time.Millisecond)
						}
						continue
					}
					if err := conn.Delete(p, -1); err != nil {
						errs.Add(1)
						continue
					}
					pairs.Add(1)
				}
			}()
		}
	}
	tctx, stopTicker := context.WithCancel(ctx)
	tickerDone := baselineTicker(tctx, progress, "raw", start, &pairs, "pairs")
	stopAfter(ctx, cfg.BaselineDuration, &stop, nil)
	elapsed := time.Since(start)
	res.Messages = pairs.Load()
	cpu1, cpu1OK := topo.cpu()
	stopTicker()
	<-tickerDone
	joinWorkers(&wg, conns)

	res.finish(elapsed, cpu0, cpu1, cpuOK && cpu1OK)
	res.Errors = errs.Load()
	return res, ctx.Err()
}
