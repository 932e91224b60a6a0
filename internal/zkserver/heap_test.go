package zkserver_test

import (
	"context"
	"flag"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// The measurements behind the brokers' data budget (docs/operations.md, Limits). They
// take minutes and need jcmd (a JDK), so they run only when asked:
//
//	go test ./internal/zkserver -run 'TestHeap' -v -zk-heap -zk-heap-messages 1000000
var (
	measureHeap   = flag.Bool("zk-heap", false, "run TestHeapPerMessage and TestHeapFlood: what ZooKeeper's heap holds")
	heapMessages  = flag.Int("zk-heap-messages", 1_000_000, "TestHeapPerMessage: messages of 100 B")
	heapFloodSize = flag.Int("zk-heap-flood-size", 512<<10, "TestHeapFlood: message size")
	heapQuota     = flag.Bool("zk-heap-quota", false, "TestHeapPerMessage: with quota statistics on the parent (what a max_bytes costs)")
)

// liveHeap returns the heap a server uses after a full collection: its
// generations' used sizes (zkserver.LiveHeap).
func liveHeap(t *testing.T, pid int) int64 {
	t.Helper()
	h, err := zkserver.LiveHeap(context.Background(), pid)
	if err != nil {
		t.Fatal(err)
	}
	return h.Used()
}

func heapServer(t *testing.T, heapMB int) (*zkserver.Server, *zk.Conn) {
	t.Helper()
	if !*measureHeap {
		t.Skip("a measurement: run with -zk-heap")
	}
	requireZK(t)
	if _, err := exec.LookPath("jcmd"); err != nil {
		t.Skip("jcmd (a JDK) is needed to read the heap")
	}
	return startConnected(t, zkserver.Config{HeapMB: heapMB})
}

// startConnected starts a server of cfg, stopped when t ends, and
// returns it with a connected session.
func startConnected(t *testing.T, cfg zkserver.Config) (*zkserver.Server, *zk.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := zkserver.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	conn, err := zkutil.Connect([]string{s.Addr()}, 10*time.Second, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := zkutil.WaitConnected(conn, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return s, conn
}

func mntr(t *testing.T, addr string) zkutil.DataSize {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ds, err := zkutil.Mntr(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// TestHeapPerMessage: the live heap of N messages of 100 B in one parent
// (PERSISTENT_SEQUENTIAL, qn-NNNNNNNNNN, 100 to a multi), against mntr's
// approximate data size and node count.
func TestHeapPerMessage(t *testing.T) {
	s, conn := heapServer(t, 2048)
	acl := zk.WorldACL(zk.PermAll)
	if err := zkutil.EnsurePath(conn, "/q/items", nil); err != nil {
		t.Fatal(err)
	}
	if *heapQuota {
		if err := zkutil.EnsureQuota(conn, "/q/items", nil); err != nil {
			t.Fatal(err)
		}
	}
	before, base := mntr(t, s.Addr()), liveHeap(t, s.Pid())
	payload := make([]byte, 100)
	start := time.Now()
	n := *heapMessages
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	errs := make(chan error, 1)
	for i := 0; i < n; i += 100 {
		ops := make([]any, min(100, n-i))
		for j := range ops {
			ops[j] = &zk.CreateRequest{Path: "/q/items/qn-", Data: payload, Acl: acl, Flags: zk.FlagSequence}
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := conn.Multi(ops...); err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if *heapQuota {
		count, bytes, err := zkutil.QuotaStats(conn, "/q/items")
		if err != nil || count != int64(n)+1 || bytes != int64(n)*100 {
			t.Fatalf("quota statistics: count %d, bytes %d, %v; want %d, %d", count, bytes, err, n+1, n*100)
		}
	}
	t.Logf("%d creates in %v (quota statistics: %v)", n, elapsed.Round(time.Millisecond), *heapQuota)
	after, heap := mntr(t, s.Addr()), liveHeap(t, s.Pid())
	dBytes, dNodes, dHeap := after.Bytes-before.Bytes, after.Znodes-before.Znodes, heap-base
	// Bytes per message are MB per million messages.
	t.Logf("%d messages of 100 B: approximate data size +%d B (%.0f per node), live heap +%d B (%.0f MB per million messages); heap beyond the data size %.0f B per node",
		n, dBytes, float64(dBytes)/float64(dNodes), dHeap, float64(dHeap)/float64(n), float64(dHeap-dBytes)/float64(dNodes))
}

// TestHeapFlood: what a server of a small heap holds of large messages
// before it runs out (published directly, 4 at a time, as a flood through
// brokers would).
func TestHeapFlood(t *testing.T) {
	for _, heapMB := range []int{128, 256} {
		t.Run(fmt.Sprintf("heap-%dMiB", heapMB), func(t *testing.T) {
			s, conn := heapServer(t, heapMB)
			if err := zkutil.EnsurePath(conn, "/q", nil); err != nil {
				t.Fatal(err)
			}
			payload := make([]byte, *heapFloodSize)
			sem := make(chan struct{}, 4)
			var wg sync.WaitGroup
			var mu sync.Mutex
			done := 0
			last := zkutil.DataSize{}
			for i := 0; i < 8*heapMB<<20 / *heapFloodSize; i++ {
				select {
				case <-s.Exited():
					wg.Wait()
					t.Logf("heap %d MiB: out of heap after %d messages of %d B; the last data size read was %d B (%.0f%% of the heap)",
						heapMB, done, *heapFloodSize, last.Bytes, float64(last.Bytes)*100/float64(heapMB<<20))
					return
				default:
				}
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					if _, err := conn.Create("/q/m-", payload, zk.FlagSequence, zk.WorldACL(zk.PermAll)); err == nil {
						mu.Lock()
						done++
						mu.Unlock()
					}
				}()
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if ds, err := zkutil.Mntr(ctx, s.Addr()); err == nil {
					last = ds
				}
				cancel()
			}
			wg.Wait()
			t.Fatalf("heap %d MiB held %d messages of %d B", heapMB, done, *heapFloodSize)
		})
	}
}

var (
	heapPayload = flag.Int("zk-heap-payload", 100, "TestHeapPerQueuedMessage: payload bytes")
	heapBatch   = flag.Int("zk-heap-batch", 100, "TestHeapPerQueuedMessage: messages per publish")
)

// TestHeapPerQueuedMessage: the live heap per message of a deep queue
// written through zkqueue in batches of 100, one node per message and
// packed (zkqueue.WithPacking: a batch is one node), each on a fresh
// server:
//
//	go test ./internal/zkserver -run TestHeapPerQueuedMessage -v -zk-heap -zk-heap-messages 1000000 [-zk-heap-payload 1024]
func TestHeapPerQueuedMessage(t *testing.T) {
	for _, mode := range []string{"one-per-node", "packed"} {
		t.Run(mode, func(t *testing.T) {
			s, conn := heapServer(t, 2048)
			opts := []zkqueue.Option{zkqueue.WithMaxBatchBytes(zkqueue.HardMaxPayload)}
			if mode == "packed" {
				opts = append(opts, zkqueue.WithPacking(zkqueue.PackLimits{}))
			}
			q, err := zkqueue.New(conn, "/q/items", opts...)
			if err != nil {
				t.Fatal(err)
			}
			before, base := mntr(t, s.Addr()), liveHeap(t, s.Pid())
			payload := make([]byte, *heapPayload)
			n := *heapMessages
			start := time.Now()
			var wg sync.WaitGroup
			sem := make(chan struct{}, 16)
			errs := make(chan error, 1)
			for i := 0; i < n; i += *heapBatch {
				batch := make([][]byte, min(*heapBatch, n-i))
				for j := range batch {
					batch[j] = payload
				}
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					if _, err := q.PublishBatch(context.Background(), batch); err != nil {
						select {
						case errs <- err:
						default:
						}
					}
				}()
			}
			wg.Wait()
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
			elapsed := time.Since(start)
			after, heap := mntr(t, s.Addr()), liveHeap(t, s.Pid())
			dNodes, dHeap := after.Znodes-before.Znodes, heap-base
			t.Logf("%s: %d messages of %d B in %v: %d nodes, live heap +%d B: %.0f B per message",
				mode, n, *heapPayload, elapsed.Round(time.Millisecond), dNodes, dHeap, float64(dHeap)/float64(n))
		})
	}
}
