package lock_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/lock"
)

// Two workers share a lock; the second asks the first to let go, waits,
// and holds it next with a greater fencing token. Set QBROKER_ZK to
// ZooKeeper servers (host:port[,host:port...]) to run it; without it, it
// does nothing.
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
	const path = "/qbroker-example/lock"

	// One session per worker, as in separate processes.
	connA, connB := dial(), dial()
	defer connA.Close()
	defer connB.Close()
	a, err := lock.NewMutex(connA, path, lock.WithValue([]byte("worker-a")))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	b, err := lock.NewMutex(connB, path, lock.WithValue([]byte("worker-b")))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	ga, err := a.Lock(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := b.TryLock(ctx); err != nil {
		fmt.Println("worker-b:", err)
	}
	next := make(chan *lock.Grant, 1)
	go func() {
		g, err := b.Lock(ctx) // waits for worker-a
		if err != nil {
			fmt.Println(err)
		}
		next <- g
	}()
	h, err := lock.Revoke(ctx, connB, path)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("asked to release:", string(h.Value))

	// The holder works until it is asked to release or loses the lock,
	// passing its token to what it writes.
	select {
	case <-ga.Revoked():
		fmt.Println("worker-a: revoked, unlocking")
		_ = ga.Unlock(ctx)
	case <-ga.Lost():
		fmt.Println("worker-a: lost", ga.Err())
	}
	gb := <-next
	if gb == nil {
		return
	}
	fmt.Println("worker-b holds, greater token:", gb.Token() > ga.Token())
	_ = gb.Unlock(ctx)
	// Output:
	// worker-b: lock: trylock /qbroker-example/lock: locked by another holder
	// asked to release: worker-a
	// worker-a: revoked, unlocking
	// worker-b holds, greater token: true
}

// TestExample runs Example against the package's server.
func TestExample(t *testing.T) {
	t.Setenv("QBROKER_ZK", zktest.Addr(t))
	Example()
}
