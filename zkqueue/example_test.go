package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/zkqueue"
)

// The example connects to the ZooKeeper servers named by $QBROKER_ZK
// (host:port[,host:port...]); the package's tests set it to their own
// server.
func Example() {
	servers := strings.Split(os.Getenv("QBROKER_ZK"), ",")
	conn, _, err := zk.Connect(servers, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()

	q, err := zkqueue.New(conn, "/examples/orders")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Delete("/examples/orders", -1) // empty by the end
	if _, err := q.Publish(ctx, []byte("order-1")); err != nil {
		fmt.Println(err)
		return
	}
	// A batch is atomic: all three or none.
	if _, err := q.PublishBatch(ctx, [][]byte{[]byte("order-2"), []byte("order-3"), []byte("order-4")}); err != nil {
		fmt.Println(err)
		return
	}
	n, _ := q.Len(ctx)
	fmt.Println("queued:", n)

	// Dequeue waits (on a watch) until a message is there or ctx ends.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for i := 0; i < 4; i++ {
		m, err := q.Dequeue(wctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(string(m.Payload))
	}
	if _, err := q.TryDequeue(ctx); errors.Is(err, zkqueue.ErrEmpty) {
		fmt.Println("empty")
	}
	// Output:
	// queued: 4
	// order-1
	// order-2
	// order-3
	// order-4
	// empty
}
