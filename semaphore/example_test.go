package semaphore_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/semaphore"
)

// Two workers share a semaphore of two permits: the first takes both,
// the second finds none free, asks the holder to give them back and gets
// one with a greater fencing token. Set QBROKER_ZK to ZooKeeper servers
// (host:port[,host:port...]) to run it; without it, it does nothing.
func Example() {
	addr := os.Getenv("QBROKER_ZK")
	if addr == "" {
		return
	}
	dial := func() *zk.Conn {
		conn, _, err := zk.Connect(strings.Split(addr, ","), 5*time.Second, zk.WithLogInfo(false))
		if err != nil {
			panic(err)
		}
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const path = "/qbroker-example/semaphore"

	// One session per worker, as in separate processes.
	connA, connB := dial(), dial()
	defer connA.Close()
	defer connB.Close()
	a, err := semaphore.New(connA, path, 2, semaphore.WithValue([]byte("worker-a")))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	b, err := semaphore.New(connB, path, 2, semaphore.WithValue([]byte("worker-b")))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	la, err := a.Acquire(ctx, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := b.TryAcquire(ctx, 1); err != nil {
		fmt.Println("worker-b:", err)
	}
	next := make(chan *semaphore.Lease, 1)
	go func() {
		l, err := b.Acquire(ctx, 1) // waits for worker-a
		if err != nil {
			fmt.Println(err)
		}
		next <- l
	}()
	hs, err := semaphore.Revoke(ctx, connB, path)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("asked to release: %s (%d permits)\n", hs[0].Value, hs[0].Permits)

	select {
	case <-la.Revoked():
		fmt.Println("worker-a: revoked, releasing")
		_ = la.Release(ctx)
	case <-la.Lost():
		fmt.Println("worker-a: lost", la.Err())
	}
	lb := <-next
	if lb == nil {
		return
	}
	fmt.Println("worker-b holds, greater token:", lb.Token() > la.Token())
	_ = lb.Release(ctx)
	// Output:
	// worker-b: semaphore: tryacquire 1 of /qbroker-example/semaphore: 2 of 2 in use: no permit available
	// asked to release: worker-a (2 permits)
	// worker-a: revoked, releasing
	// worker-b holds, greater token: true
}

// TestExample runs Example against the package's server.
func TestExample(t *testing.T) {
	t.Setenv("QBROKER_ZK", zktest.Addr(t))
	Example()
}
