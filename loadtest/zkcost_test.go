package main

import (
	"strings"
	"testing"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// backlogCost divides what ZooKeeper gained while a backlog was published
// by its messages; runCost divides a run's transactions and requests by
// the messages delivered; a figure not read stays 0, with the heap's
// reason.
func TestZKCost(t *testing.T) {
	const epoch = int64(2) << 32
	r0 := zkReading{Zxid: epoch + 10, Data: zkutil.DataSize{Bytes: 1000, Znodes: 20}, Requests: 50, Heap: 10 << 20,
		zxidOK: true, dataOK: true, requestsOK: true, heapOK: true}
	r1 := zkReading{Zxid: epoch + 10 + 200, Data: zkutil.DataSize{Bytes: 1000 + 150_000, Znodes: 20 + 100}, Requests: 50 + 300, Heap: 10<<20 + 400_000,
		zxidOK: true, dataOK: true, requestsOK: true, heapOK: true}
	c := backlogCost(r0, r1, 1000)
	want := ZKCost{Per: "published", Messages: 1000, Transactions: 0.2, Requests: 0.3, Znodes: 100, ZnodesPerMessage: 0.1,
		MessagesPerZnode: 10, DataBytesPerMessage: 150, HeapBytesPerMessage: 400}
	if *c != want {
		t.Errorf("backlogCost: got %+v, want %+v", *c, want)
	}
	var sum strings.Builder
	writeZKCost(&sum, c)
	for _, s := range []string{"per message published", "0.200 transactions", "0.300 requests", "0.1000 znodes (10.0 messages per znode)", "150 B of data", "400 B of live heap"} {
		if !strings.Contains(sum.String(), s) {
			t.Errorf("summary lacks %q: %s", s, sum.String())
		}
	}

	// An election in between, no scrape, no heap.
	r1.Zxid = epoch + 1<<32 + 5
	r0.requestsOK, r0.heapOK, r0.heapNote = false, false, "jcmd (a JDK) not found"
	c = backlogCost(r0, r1, 1000)
	if c.Transactions != 0 || c.Requests != 0 || c.HeapBytesPerMessage != 0 || c.HeapNote != "jcmd (a JDK) not found" || c.Znodes != 100 {
		t.Errorf("backlogCost with parts missing: %+v", c)
	}
	sum.Reset()
	writeZKCost(&sum, c)
	if !strings.Contains(sum.String(), "live heap not measured: jcmd (a JDK) not found") {
		t.Errorf("summary lacks the heap's note: %s", sum.String())
	}

	rc := runCost(&ZKTxnStats{Transactions: 8000}, &brokerCounters{ZKRequests: map[string]float64{"create/ok": 3000, "delete/ok": 3000, "multi/ok": 6000}}, 2000)
	if rc == nil || rc.Per != "delivered" || rc.Messages != 2000 || rc.Transactions != 4 || rc.Requests != 6 {
		t.Errorf("runCost: got %+v, want 4 transactions and 6 requests per message delivered", rc)
	}
	if rc := runCost(nil, nil, 2000); rc != nil {
		t.Errorf("runCost without figures: got %+v, want nil", rc)
	}
}
