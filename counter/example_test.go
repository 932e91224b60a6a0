package counter_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/counter"
)

// Two processes count page views in one counter; one resets it only if
// nobody counted since it looked. Set QBROKER_ZK to ZooKeeper servers
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
	const path = "/qbroker-example/views"

	connA, connB := dial(), dial()
	defer connA.Close()
	defer connB.Close()
	a, err := counter.New(connA, path)
	if err != nil {
		fmt.Println(err)
		return
	}
	b, _ := counter.New(connB, path)
	if _, err := a.Set(ctx, 0); err != nil {
		fmt.Println(err)
		return
	}
	a.Add(ctx, 3)
	v, _ := b.Add(ctx, 2)
	fmt.Println("after both:", v)
	swapped, _ := a.CompareAndSet(ctx, 4, 0)
	fmt.Println("reset from 4:", swapped)
	swapped, _ = a.CompareAndSet(ctx, 5, 0)
	fmt.Println("reset from 5:", swapped)
	v, _ = b.Get(ctx)
	fmt.Println("now:", v)
	// Output:
	// after both: 5
	// reset from 4: false
	// reset from 5: true
	// now: 0
}
