package zkserver_test

import (
	"flag"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkserver"
)

var measureCommit = flag.Bool("zk-commit", false, "run TestCommitFloor: the rate of writes each waited for")

// TestCommitFloor is the floor under confirmed acks: W workers on one
// session, each writing a small node and waiting for the answer before
// the next write, as a consumer waiting for each ack's commit does. No
// broker, no queue: ZooKeeper's commit (a write to its transaction log,
// synced) and the round trip alone.
//
//	go test ./internal/zkserver -run TestCommitFloor -v -zk-commit
func TestCommitFloor(t *testing.T) {
	if !*measureCommit {
		t.Skip("a measurement: run with -zk-commit")
	}
	requireZK(t)
	_, conn := startConnected(t, zkserver.Config{})
	for _, workers := range []int{1, 8, 64} {
		const n = 300
		paths := make([]string, workers)
		for w := range paths {
			var err error
			if paths[w], err = conn.Create("/ack-", nil, zk.FlagSequence, zk.WorldACL(zk.PermAll)); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		start := time.Now()
		for _, p := range paths {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n {
					if _, err := conn.Set(p, []byte("acked"), -1); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		t.Logf("%2d workers, %d writes each waited for: %.0f writes/s, %.2f ms each", workers, n, float64(workers*n)/el.Seconds(), el.Seconds()*1000/n)
	}
}
