package election_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/internal/zktest"
)

// Two workers campaign; the first leads, the second takes over when the
// first resigns, and an observer sees both. Set QBROKER_ZK to a ZooKeeper
// server's host:port to run it; without it, it does nothing.
func Example() {
	addr := os.Getenv("QBROKER_ZK")
	if addr == "" {
		return
	}
	dial := func() *zk.Conn {
		conn, _, err := zk.Connect([]string{addr}, 5*time.Second, zk.WithLogInfo(false))
		if err != nil {
			panic(err)
		}
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const path = "/qbroker-example/election"

	// One session per worker, as in separate processes.
	var workers []*election.Election
	for range 2 {
		conn := dial()
		defer conn.Close()
		e, err := election.New(conn, path)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer e.Close()
		workers = append(workers, e)
	}
	leaders := workers[0].Observe(ctx)

	if err := workers[0].Campaign(ctx, []byte("worker-1")); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("observed:", string((<-leaders).Value))
	second := make(chan error, 1)
	go func() { second <- workers[1].Campaign(ctx, []byte("worker-2")) }()

	// The leader works while Done is open, passing its fencing token to
	// the resources it writes so they can refuse an older leader.
	select {
	case <-workers[0].Done():
		fmt.Println("leadership lost")
	default:
		fmt.Println("worker-1 leads, token > 0:", workers[0].Token() > 0)
	}
	if err := workers[0].Resign(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if err := <-second; err != nil {
		fmt.Println(err)
		return
	}
	l, err := workers[1].Leader(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("leader:", string(l.Value), "observed:", string((<-leaders).Value))
	_ = workers[1].Resign(ctx)
}

// TestExample runs Example against the package's server.
func TestExample(t *testing.T) {
	t.Setenv("QBROKER_ZK", zktest.Addr(t))
	Example()
}
