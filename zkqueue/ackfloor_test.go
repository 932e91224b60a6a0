package zkqueue_test

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

var measureAckFloor = flag.Bool("ack-floor", false, "run TestConfirmedAckFloor: the rate of deletes each waited for through one Committer")

// TestConfirmedAckFloor is the floor under confirmed acks: W workers,
// each deleting a node through one Committer on two sessions (a broker's
// writers) and waiting for the commit before the next delete, as a
// consumer waiting for each ack does. The Committer puts the deletes
// under way at once into one Multi. No broker, no gRPC, no claims: the
// group commit and ZooKeeper alone, synced and with forceSync=no, each
// worker count twice (the first rounds meet a server still compiling).
//
//	go test ./zkqueue -run TestConfirmedAckFloor -v -ack-floor
func TestConfirmedAckFloor(t *testing.T) {
	if !*measureAckFloor {
		t.Skip("a measurement: run with -ack-floor")
	}
	for _, noSync := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		s, err := zkserver.Start(ctx, zkserver.Config{NoSync: noSync})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var conns []*zk.Conn
		for range 2 {
			c, err := zkutil.Connect([]string{s.Addr()}, 10*time.Second, nil, nil)
			if err == nil {
				err = zkutil.WaitConnected(c, 10*time.Second)
			}
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		cm := zkqueue.NewCommitter(conns, zkqueue.CommitterConfig{})
		for _, workers := range []int{16, 64, 16, 64} {
			rate, each := ackRound(t, cm, conns[0], workers, 400)
			t.Logf("forceSync=no %v, %2d workers: %6.0f deletes/s, %.2f ms each", noSync, workers, rate, each)
		}
		cm.Close()
		for _, c := range conns {
			c.Close()
		}
		_ = s.Close()
	}
}

// ackRound makes workers*n nodes, then has each worker delete its n one at
// a time through cm, and returns the deletes per second and the time of one.
func ackRound(t *testing.T, cm *zkqueue.Committer, conn *zk.Conn, workers, n int) (rate float64, ms float64) {
	ctx := context.Background()
	root := fmt.Sprintf("/ackfloor-%d-%d", workers, time.Now().UnixNano())
	if err := zkutil.EnsurePath(conn, root, nil); err != nil {
		t.Fatal(err)
	}
	paths := make([][]string, workers)
	for w := range workers {
		for i := range n {
			p := fmt.Sprintf("%s/w%d-%d", root, w, i)
			if _, err := cm.Do(ctx, &zk.CreateRequest{Path: p, Acl: zk.WorldACL(zk.PermAll)}); err != nil {
				t.Fatal(err)
			}
			paths[w] = append(paths[w], p)
		}
	}
	var wg sync.WaitGroup
	start := time.Now()
	for _, ps := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, p := range ps {
				if _, err := cm.Do(ctx, &zk.DeleteRequest{Path: p, Version: -1}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	return float64(workers*n) / el.Seconds(), el.Seconds() * 1000 / float64(n)
}
