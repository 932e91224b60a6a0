package priority_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/priority"
)

func Example() {
	// A session to the ZooKeeper server named by $QBROKER_ZK (host:port;
	// the package's tests set it to their own server).
	conn, _, err := zk.Connect([]string{os.Getenv("QBROKER_ZK")}, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	root := fmt.Sprintf("/examples/%d", time.Now().UnixNano())
	ctx := context.Background()

	q, err := priority.New(conn, root+"/jobs")
	if err != nil {
		fmt.Println(err)
		return
	}
	// A backlog of routine work, then an atomic batch with an urgent job.
	for _, name := range []string{"reindex", "thumbnails"} {
		if _, err := q.Publish(ctx, 100, []byte(name)); err != nil {
			fmt.Println(err)
			return
		}
	}
	if _, err := q.PublishBatch(ctx, []priority.Item{
		{Priority: 50, Payload: []byte("send-invoices")},
		{Priority: 0, Payload: []byte("page-oncall")},
	}); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := q.Publish(ctx, 300, []byte("someday")); errors.Is(err, priority.ErrBadPriority) {
		fmt.Println("priority 300 rejected")
	}
	for {
		m, err := q.TryDequeue(ctx)
		if errors.Is(err, priority.ErrEmpty) {
			fmt.Println("empty")
			break
		} else if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%3d %s\n", m.Priority, m.Payload)
	}
	// Output:
	// priority 300 rejected
	//   0 page-oncall
	//  50 send-invoices
	// 100 reindex
	// 100 thumbnails
	// empty
}
