package zkqueue_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// messageNodes counts the nodes in the segments of the queue at path.
func messageNodes(t *testing.T, conn *zk.Conn, path string) int {
	t.Helper()
	segs, _, err := conn.Children(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range segs {
		children, _, err := conn.Children(path + "/" + s)
		if err != nil {
			t.Fatal(err)
		}
		n += len(children)
	}
	return n
}

func packed() zkqueue.Option { return zkqueue.WithPacking(zkqueue.PackLimits{}) }

// TestPackedPublishTakeInOrder: a batch becomes one node; concurrent
// single publishes share nodes; every message is taken once, in order per
// producer, across takes of any size (the rest of a pack waits in the
// buffer).
func TestPackedPublishTakeInOrder(t *testing.T) {
	ctx := context.Background()
	path := zktest.Root(t) + "/q"
	conn := zktest.Conn(t)
	q := newQueue(t, conn, path, packed())
	batch := make([][]byte, 100)
	for i := range batch {
		batch[i] = []byte(fmt.Sprintf("b-%03d", i))
	}
	ids, err := q.PublishBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 100 || !strings.HasSuffix(ids[0], "#1") || !strings.HasSuffix(ids[99], "#100") {
		t.Fatalf("ids %v ... %v", ids[0], ids[len(ids)-1])
	}
	if n := messageNodes(t, conn, path); n != 1 {
		t.Fatalf("%d message nodes after a batch of 100, want 1 pack", n)
	}
	const producers, each = 8, 50
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := q.Publish(ctx, []byte(fmt.Sprintf("p%d-%03d", p, i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	n, err := q.Len(ctx)
	if err != nil || n != 100+producers*each {
		t.Fatalf("Len = %d, %v; want %d", n, err, 100+producers*each)
	}
	nodes := messageNodes(t, conn, path)
	t.Logf("%d messages in %d nodes", 100+producers*each, nodes)
	if nodes >= 1+producers*each {
		t.Fatalf("%d nodes for %d concurrent single publishes: none shared a pack", nodes, producers*each)
	}
	seen := map[string]bool{}
	last := map[string]int{}
	for sizes := []int{1, 7, 64, 3}; len(seen) < 100+producers*each; sizes = append(sizes[1:], sizes[0]) {
		ms, err := q.Take(ctx, sizes[0], zkqueue.Room{}, false)
		if err != nil {
			t.Fatalf("after %d: %v", len(seen), err)
		}
		if len(ms) > sizes[0] {
			t.Fatalf("take %d returned %d", sizes[0], len(ms))
		}
		for _, m := range ms {
			if seen[m.ID] {
				t.Fatalf("%s delivered twice", m.ID)
			}
			seen[m.ID] = true
			var who string
			var i int
			p := string(m.Payload)
			fmt.Sscanf(strings.Replace(p, "-", " ", 1), "%s %d", &who, &i)
			if prev, ok := last[who]; ok && i <= prev {
				t.Fatalf("%s after %s-%03d", p, who, prev)
			}
			last[who] = i
			if m.Deliveries != 1 {
				t.Fatalf("%s: deliveries %d", m.ID, m.Deliveries)
			}
		}
	}
	if _, err := q.TryDequeue(ctx); err != zkqueue.ErrEmpty && !strings.Contains(fmt.Sprint(err), "empty") {
		t.Fatalf("after the drain: %v", err)
	}
}
