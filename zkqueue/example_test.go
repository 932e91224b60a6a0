package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

func Example() {
	conn, root, cleanup := zktest.ExampleSession("zkqueue")
	defer cleanup()
	ctx := context.Background()

	q, err := zkqueue.New(conn, root+"/orders")
	if err != nil {
		fmt.Println(err)
		return
	}
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
		fmt.Println(m.ID, string(m.Payload))
	}
	if _, err := q.TryDequeue(ctx); errors.Is(err, zkqueue.ErrEmpty) {
		fmt.Println("empty")
	}
	// Output:
	// queued: 4
	// qn-0000000000 order-1
	// qn-0000000001 order-2
	// qn-0000000002 order-3
	// qn-0000000003 order-4
	// empty
}
