package syncqueue_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/qbroker/qbroker/syncqueue"
)

func Example() {
	conn, root := connect()
	defer conn.Close()
	ctx := context.Background()

	// A queue for a group of three workers. Each worker would use its own
	// session; one is enough for the example.
	q, err := syncqueue.New(conn, root+"/batch", 3)
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := q.Publish(ctx, []byte("job-1")); err != nil {
		fmt.Println(err)
		return
	}
	a, err := q.JoinAsync(ctx, "worker-a")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Leave(ctx)
	b, err := q.JoinAsync(ctx, "worker-b")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Leave(ctx)
	st, err := a.Progress(ctx, syncqueue.Status{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("joined %d of %d, open: %v\n", st.Joined, st.Members, st.Open)
	if _, err := q.TryDequeue(ctx); errors.Is(err, syncqueue.ErrNotOpen) {
		fmt.Println("dequeue: not open yet")
	}

	// The third member completes the group: Join returns at once.
	c, err := q.Join(ctx, "worker-c")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Leave(ctx)
	if err := a.Wait(ctx); err == nil {
		fmt.Println("worker-a: group open")
	}
	m, err := q.Dequeue(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("dequeued %s\n", m.Payload)
	if _, err := q.Join(ctx, "worker-d"); errors.Is(err, syncqueue.ErrGroupFull) {
		fmt.Println("worker-d: group full")
	}
	// Output:
	// joined 2 of 3, open: false
	// dequeue: not open yet
	// worker-a: group open
	// dequeued job-1
	// worker-d: group full
}

func ExampleBarrier() {
	conn, root := connect()
	defer conn.Close()
	ctx := context.Background()

	b, err := syncqueue.NewBarrier(conn, root+"/deploy")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := b.Set(ctx); err != nil {
		fmt.Println(err)
		return
	}
	released := make(chan error)
	go func() { released <- b.Wait(ctx) }()
	fmt.Println("barrier set; removing it")
	if err := b.Remove(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("waiter released:", <-released == nil)
	// Output:
	// barrier set; removing it
	// waiter released: true
}

func ExampleDoubleBarrier() {
	conn, root := connect()
	defer conn.Close()
	ctx := context.Background()

	const n = 3
	var wg sync.WaitGroup
	var mu sync.Mutex
	var entered, left int
	for i := 0; i < n; i++ {
		b, err := syncqueue.NewDoubleBarrier(conn, root+"/round-1", n, fmt.Sprintf("worker-%d", i))
		if err != nil {
			fmt.Println(err)
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Enter(ctx); err != nil {
				fmt.Println(err)
				return
			}
			mu.Lock()
			entered++
			mu.Unlock()
			// ... compute ...
			if err := b.Leave(ctx); err != nil {
				fmt.Println(err)
				return
			}
			mu.Lock()
			left++
			mu.Unlock()
		}()
	}
	wg.Wait()
	fmt.Printf("%d entered together, %d left together\n", entered, left)
	// Output:
	// 3 entered together, 3 left together
}

// connect opens a session to the ZooKeeper server named by $QBROKER_ZK
// (host:port; the package's tests set it to their own server) and returns
// a fresh root for one example's nodes.
func connect() (*zk.Conn, string) {
	conn, _, err := zk.Connect([]string{os.Getenv("QBROKER_ZK")}, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		panic(err)
	}
	return conn, fmt.Sprintf("/examples/%d", time.Now().UnixNano())
}
