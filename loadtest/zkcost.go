package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// ZKCost is what a message cost ZooKeeper in a run, packed (--packed) or
// not: what packed storage saves. Without a backlog the figures are over
// the whole run, per message delivered (acked); with a backlog they are
// over its publishing, per message published, and add what the backlog
// holds in ZooKeeper: nodes, data and live heap.
type ZKCost struct {
	// Per: "delivered" or "published".
	Per      string `json:"per"`
	Messages int64  `json:"messages"`
	// Transactions: ZooKeeper's (its zxid's advance) per message; 0 when
	// unknown.
	Transactions float64 `json:"transactions_per_message,omitempty"`
	// Requests: the brokers' ZooKeeper requests, every op, per message;
	// 0 when the brokers were not scraped.
	Requests float64 `json:"requests_per_message,omitempty"`

	// With a backlog, from ZooKeeper's mntr (zk_znode_count and
	// zk_approximate_data_size) before and after it was published: the
	// nodes added, per message and its inverse (the mean messages a node
	// holds: the pack size), and the data added per message.
	Znodes              int64   `json:"znodes,omitempty"`
	ZnodesPerMessage    float64 `json:"znodes_per_message,omitempty"`
	MessagesPerZnode    float64 `json:"messages_per_znode,omitempty"`
	DataBytesPerMessage float64 `json:"data_bytes_per_message,omitempty"`
	// HeapBytesPerMessage: with a backlog on a spawned ZooKeeper, its
	// live heap (its old generation after a full collection, read with
	// jcmd) added per message; HeapNote says why it is missing. It
	// includes a bounded part, ZooKeeper's copy of its last 500
	// transactions, that a small backlog does not amortize.
	HeapBytesPerMessage float64 `json:"heap_bytes_per_message,omitempty"`
	HeapNote            string  `json:"heap_note,omitempty"`
}

// zkReading is ZooKeeper at one moment of a backlog run: before its
// publishing and once it is published. A part not read is marked so.
type zkReading struct {
	Zxid                               int64
	Data                               zkutil.DataSize
	Requests                           float64 // the brokers' ZooKeeper requests so far, every op
	Heap                               int64   // live heap after a full collection
	zxidOK, dataOK, requestsOK, heapOK bool
	heapNote                           string // why Heap was not read
}

// readZK takes a reading of topo's ZooKeeper (the first server of a
// list) and of the brokers' request counters. It returns the failures of
// the parts that should have answered: those of a spawned ZooKeeper, and
// the scrape of brokers whose /metrics are known. An external ZooKeeper
// may not allow srvr or mntr: its figure is left out.
func readZK(ctx context.Context, cfg *Config, topo *Topology, token string) (zkReading, []string) {
	var r zkReading
	var failures []string
	fail := func(what string, err error) {
		if topo.Spawned {
			failures = append(failures, fmt.Sprintf("ZooKeeper %s: %v", what, err))
		}
	}
	if topo.ZooKeeper != "" {
		var err error
		if r.Zxid, err = readZxid(topo.ZooKeeper); err != nil {
			fail("transactions", err)
		} else {
			r.zxidOK = true
		}
		addr, _, _ := strings.Cut(topo.ZooKeeper, ",")
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r.Data, err = zkutil.Mntr(mctx, addr)
		cancel()
		if err != nil {
			fail("znodes", err)
		} else {
			r.dataOK = true
		}
	}
	if len(topo.Metrics) > 0 {
		c, err := scrapeAll(ctx, topo.Metrics, cfg.Queue, token)
		if err != nil {
			failures = append(failures, err.Error())
		} else {
			r.Requests, r.requestsOK = sumRequests(c), true
		}
	}
	switch {
	case topo.zk == nil:
		r.heapNote = "ZooKeeper was not spawned by the load test"
	default:
		hctx, cancel := context.WithTimeout(ctx, time.Minute)
		heap, err := zkserver.LiveHeap(hctx, topo.zk.Pid())
		cancel()
		switch {
		case errors.Is(err, zkserver.ErrNoJcmd):
			r.heapNote = "jcmd (a JDK) not found"
		case err != nil:
			r.heapNote = err.Error()
		default:
			r.Heap, r.heapOK = heap.Old, true
		}
	}
	return r, failures
}

// sumRequests is the brokers' ZooKeeper requests of every op and result.
func sumRequests(c brokerCounters) float64 {
	total := 0.0
	for _, n := range c.ZKRequests {
		total += n
	}
	return total
}

// backlogCost relates the readings before and after a backlog's
// publishing to the messages published.
func backlogCost(r0, r1 zkReading, published int64) *ZKCost {
	c := &ZKCost{Per: "published", Messages: published}
	if published <= 0 {
		return c
	}
	n := float64(published)
	if r0.zxidOK && r1.zxidOK && r0.Zxid>>32 == r1.Zxid>>32 && r1.Zxid >= r0.Zxid {
		c.Transactions = float64(r1.Zxid-r0.Zxid) / n
	}
	if r0.requestsOK && r1.requestsOK {
		c.Requests = (r1.Requests - r0.Requests) / n
	}
	if r0.dataOK && r1.dataOK {
		c.Znodes = r1.Data.Znodes - r0.Data.Znodes
		c.ZnodesPerMessage = float64(c.Znodes) / n
		if c.Znodes > 0 {
			c.MessagesPerZnode = n / float64(c.Znodes)
		}
		c.DataBytesPerMessage = float64(r1.Data.Bytes-r0.Data.Bytes) / n
	}
	switch {
	case r0.heapOK && r1.heapOK:
		c.HeapBytesPerMessage = float64(r1.Heap-r0.Heap) / n
	case r0.heapNote != "":
		c.HeapNote = r0.heapNote
	default:
		c.HeapNote = r1.heapNote
	}
	return c
}

// runCost is the cost per message delivered over a whole run, from the
// transactions and the brokers' counters; nil when neither is known.
func runCost(txns *ZKTxnStats, counters *brokerCounters, delivered int64) *ZKCost {
	if delivered <= 0 || txns == nil && counters == nil {
		return nil
	}
	c := &ZKCost{Per: "delivered", Messages: delivered}
	if txns != nil {
		c.Transactions = float64(txns.Transactions) / float64(delivered)
	}
	if counters != nil {
		c.Requests = sumRequests(*counters) / float64(delivered)
	}
	return c
}

// writeZKCost prints the cost line of the summary.
func writeZKCost(b *strings.Builder, c *ZKCost) {
	if c.Per == "published" {
		fmt.Fprintf(b, "zk cost      per message published (the backlog's %d): %.3f transactions, %.3f requests", c.Messages, c.Transactions, c.Requests)
		fmt.Fprintf(b, ", %.4f znodes (%.1f messages per znode), %.0f B of data", c.ZnodesPerMessage, c.MessagesPerZnode, c.DataBytesPerMessage)
		if c.HeapNote != "" {
			fmt.Fprintf(b, "; live heap not measured: %s\n", c.HeapNote)
		} else {
			fmt.Fprintf(b, ", %.0f B of live heap\n", c.HeapBytesPerMessage)
		}
		return
	}
	fmt.Fprintf(b, "zk cost      per message delivered (the whole run's %d): %.3f transactions", c.Messages, c.Transactions)
	if c.Requests > 0 { // zero: the brokers' counters were not read
		fmt.Fprintf(b, ", %.3f requests", c.Requests)
	}
	b.WriteString("\n")
}
