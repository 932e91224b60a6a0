package lockdelay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/lockdelay"
)

// How a recipe adopts lock-delay, shown on the simplest one: a lease
// held by whoever creates the ephemeral node <dir>/holder. Wait before
// taking it, Mark once it holds, Release to let go; a Sweeper in one
// process ends the delays nobody contends for. Set QBROKER_ZK to
// ZooKeeper servers (host:port[,host:port...]) to run it; without it, it
// does nothing.
func Example() {
	addr := os.Getenv("QBROKER_ZK")
	if addr == "" {
		return
	}
	conn, _, err := zk.Connect(strings.Split(addr, ","), 5*time.Second, zk.WithLogInfo(false))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const dir = "/qbroker-example-lease"
	if _, err := conn.Create(dir, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		fmt.Println(err)
		return
	}

	// Take the lease: first wait out a lost holder's delay, then hold,
	// then record our own delay before acting as holder.
	if _, err := lockdelay.Wait(ctx, conn, dir, nil); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := conn.Create(dir+"/holder", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		fmt.Println(err) // zk.ErrNodeExists: someone else holds it
		return
	}
	if err := lockdelay.Mark(conn, dir, "holder", 10*time.Second, nil); err != nil {
		fmt.Println(err)
		return
	}
	// ... act as the holder ...

	// An explicit release: the lease is free at once. Had this process
	// died instead, the lease would stay unavailable for 10 s after its
	// session ended.
	if err := lockdelay.Release(conn, dir, "holder"); err != nil {
		fmt.Println(err)
	}
	// Output:
}

// TestExample runs Example against the package's server.
func TestExample(t *testing.T) {
	t.Setenv("QBROKER_ZK", zktest.Addr(t))
	Example()
}
