package broker_test

import (
	"context"
	"flag"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zktest"
)

var floodHeap = flag.Int("flood-heap", 128, "TestLargeMessageFloodLeavesZooKeeperUp: ZooKeeper's heap in MiB")

var floodUnguarded = flag.Bool("flood-unguarded", false,
	"TestLargeMessageFloodLeavesZooKeeperUp without the data budget: measures where the flood kills ZooKeeper (the test then expects it to)")

// The attack that once killed ZooKeeper: large messages published as fast
// as a few producers can, against a ZooKeeper with a small heap. The data
// budget refuses them, naming it, before ZooKeeper runs out of heap;
// ZooKeeper stays up, the other queue keeps its messages and serves them,
// and publishing resumes once the flood is purged. Without the budget the
// 400 messages allowed here (200 MB) are seven times what kills this
// ZooKeeper (measured: it ran out of heap after 57 accepted messages;
// go test ./broker -run TestLargeMessageFlood -v -flood-unguarded).
func TestLargeMessageFloodLeavesZooKeeperUp(t *testing.T) {
	zktest.Server(t) // skips without a ZooKeeper installation
	heapMB := *floodHeap
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	zks, err := zkserver.Start(ctx, zkserver.Config{HeapMB: heapMB})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zks.Close() })
	budget := zkserver.DataBudget(heapMB)
	if *floodUnguarded {
		budget = -1
	}
	b := startBroker(t, []string{zks.Addr()}, zktest.Root(t), func(c *broker.Config) { c.ZKDataBudget = budget })
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "other"})
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "flood"})
	publishN(t, b.client, "other", 100)

	producers, maxAttempts := 4, 400*heapMB/128
	payload := make([]byte, 500<<10)
	var (
		mu       sync.Mutex
		attempts int
		accepted int
		ends     []error
		wg       sync.WaitGroup
	)
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if attempts == maxAttempts {
					mu.Unlock()
					return
				}
				attempts++
				mu.Unlock()
				err := publishOne(b.client, "flood", payload)
				mu.Lock()
				if err != nil {
					ends = append(ends, err)
					mu.Unlock()
					return
				}
				accepted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if *floodUnguarded {
		select {
		case <-zks.Exited():
		case <-time.After(30 * time.Second):
			t.Fatalf("without a budget ZooKeeper held %d messages of 500 KiB; the producers ended with %v", accepted, ends)
		}
		t.Logf("without a budget ZooKeeper (heap %d MiB) died after %d accepted messages of 500 KiB (%d MiB): %v",
			heapMB, accepted, accepted/2, zks.ExitError())
		return
	}
	t.Logf("%d of %d publishes of 500 KiB accepted (%d MiB) before the budget of %d MiB refused them",
		accepted, attempts, accepted/2, budget>>20)
	if len(ends) != producers {
		t.Fatalf("%d of %d producers were refused in %d attempts", len(ends), producers, attempts)
	}
	for _, err := range ends {
		refused(t, "the flood", err, "ZooKeeper data budget")
	}
	if !zks.Running() {
		t.Fatalf("ZooKeeper exited: %v", zks.ExitError())
	}
	if log, err := os.ReadFile(zks.LogPath()); err != nil || strings.Contains(string(log), "OutOfMemoryError") {
		t.Fatalf("ZooKeeper's log: %v, or it ran out of heap", err)
	}

	got := receive(t, b.client, &pb.ReceiveRequest{Queue: "other", MaxMessages: 100})
	if len(got) != 100 {
		t.Fatalf("the other queue gave %d messages, want 100", len(got))
	}
	if _, err := b.client.Purge(context.Background(), &pb.PurgeRequest{Name: "flood"}); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "publishing to resume after the purge", func() bool {
		err := publishOne(b.client, "flood", payload)
		if err != nil && status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("publish after the purge: %v", err)
		}
		return err == nil
	})
	if err := publishOne(b.client, "other", []byte("after")); err != nil {
		t.Fatalf("the other queue after the purge: %v", err)
	}
	if !zks.Running() {
		t.Fatalf("ZooKeeper exited: %v", zks.ExitError())
	}
}
