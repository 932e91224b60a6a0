package main

import (
	"context"
	"io"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/go-zookeeper/zk"
)

// baselineCreate is the latency floor of a durable publish: --producers
// goroutines, each with its own session, create one sequential node at a
// time (the message's create alone, as a publish of one message ends in),
// in closed loop. Its latency percentiles stand beside qbroker's publish
// call latency.
const baselineCreate = "create"

// runCreate measures bare creates of payload-sized nodes (see
// baselineCreate) for cfg.BaselineDuration; the nodes are removed after.
func runCreate(ctx context.Context, cfg *Config, topo *Topology, progress io.Writer) (BaselineResult, error) {
	res := BaselineResult{Name: baselineCreate, Sessions: cfg.Producers, Goroutines: cfg.Producers}
	var hists []*hdrhistogram.Histogram
	op := func(conn *zk.Conn, parent string, data []byte) error {
		_, err := conn.Create(parent+"/qn-", data, zk.FlagSequence, worldACL)
		return err
	}
	res, err := runZKOps(ctx, cfg, topo, progress, zkOps{res: res, perSession: 1, unit: "creates", hists: &hists, op: op})
	lat := summarize(mergeHists(hists))
	res.Latency = &lat
	return res, err
}
