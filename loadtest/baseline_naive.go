package main

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// runNaive is the seeds' queue (the ZooKeeper recipe's
// DistributedQueue.remove): cfg.Consumers consumers, each with its own
// session, each taking a message by listing the children, sorting them
// and walking the list: getData, then delete, moving to the next child
// when either finds the node gone (a lost race). A take that reaches the
// end of its list lists again; after a success, the next take lists
// again too, so all consumers race for the same head.
//
// The queue is filled with cfg.NaivePrefill messages first; the run ends
// after cfg.BaselineDuration or when the queue is empty.
func runNaive(ctx context.Context, cfg *Config, topo *Topology, progress io.Writer) (BaselineResult, error) {
	res := BaselineResult{Name: baselineNaive, Sessions: cfg.Consumers, Goroutines: cfg.Consumers, Prefill: cfg.NaivePrefill}
	parent := baselineRoot(cfg.Queue) + "/naive"
	conns, err := openSessions(topo.ZooKeeper, cfg.Consumers)
	if err != nil {
		return res, err
	}
	defer closeSessions(conns)
	if err := zkutil.EnsurePath(conns[0], parent, nil); err != nil {
		return res, err
	}
	defer func() { _ = removeTree(context.WithoutCancel(ctx), conns[0], parent) }()
	if err := prefill(conns[0], parent, baselineData(cfg), cfg.NaivePrefill); err != nil {
		return res, err
	}

	var stop atomic.Bool
	var delivered, onGet, onDelete, errs atomic.Int64
	var wg sync.WaitGroup
	cpu0, cpuOK := topo.cpu()
	start := time.Now()
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				switch naiveTake(conn, parent, &stop, &onGet, &onDelete) {
				case takeOK:
					delivered.Add(1)
				case takeEmpty:
					return
				case takeError:
					errs.Add(1)
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	allDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(allDone)
	}()
	tctx, stopTicker := context.WithCancel(ctx)
	tickerDone := baselineTicker(tctx, progress, "naive", start, &delivered, "delivered")
	stopAfter(ctx, cfg.BaselineDuration, &stop, allDone)
	elapsed := time.Since(start)
	res.Messages = delivered.Load()
	cpu1, cpu1OK := topo.cpu()
	stopTicker()
	<-tickerDone
	select {
	case <-allDone:
		res.Drained = true
	default:
	}
	joinWorkers(&wg, conns)
	<-allDone

	res.finish(elapsed, cpu0, cpu1, cpuOK && cpu1OK)
	res.Errors = errs.Load()
	res.ConflictsOnGet, res.ConflictsOnDelete = onGet.Load(), onDelete.Load()
	res.Conflicts = res.ConflictsOnGet + res.ConflictsOnDelete
	if res.Messages > 0 {
		res.ConflictsPerDelivered = float64(res.Conflicts) / float64(res.Messages)
	}
	return res, ctx.Err()
}

type takeResult int

const (
	takeOK takeResult = iota
	takeEmpty
	takeError
	takeStopped
)

// naiveTake is one remove() of the seed recipe.
func naiveTake(conn *zk.Conn, parent string, stop *atomic.Bool, onGet, onDelete *atomic.Int64) takeResult {
	for !stop.Load() {
		children, _, err := conn.Children(parent)
		if err != nil {
			return takeError
		}
		names, _ := zkqueue.SortNames(children)
		if len(names) == 0 {
			return takeEmpty
		}
		for _, n := range names {
			if stop.Load() {
				return takeStopped
			}
			p := parent + "/" + n.Raw
			if _, _, err := conn.Get(p); errors.Is(err, zk.ErrNoNode) {
				onGet.Add(1)
				continue
			} else if err != nil {
				return takeError
			}
			if err := conn.Delete(p, -1); errors.Is(err, zk.ErrNoNode) {
				onDelete.Add(1)
				continue
			} else if err != nil {
				return takeError
			}
			return takeOK
		}
	}
	return takeStopped
}

// prefill creates n messages under parent, up to 500 (and 512 KiB) to a
// Multi.
func prefill(conn *zk.Conn, parent string, data []byte, n int) error {
	acl := zk.WorldACL(zk.PermAll)
	per := max(1, min(500, (512<<10)/(len(data)+len(parent)+64)))
	for n > 0 {
		k := min(n, per)
		ops := make([]any, k)
		for i := range ops {
			ops[i] = &zk.CreateRequest{Path: parent + "/" + zkqueue.FIFOPrefix, Data: data, Acl: acl, Flags: zk.FlagSequence}
		}
		if _, err := conn.Multi(ops...); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
