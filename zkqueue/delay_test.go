package zkqueue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// Two schedulers on two sessions move the same due messages at once:
// every message lands in the queue exactly once, in due order.
func TestMoveDueRaceExactlyOnce(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	const n = 300
	var scheds []*zkqueue.Scheduled
	var queues []*zkqueue.Queue
	for range 2 {
		q := newQueue(t, zktest.Conn(t), root+"/items", zkqueue.WithSegmentSize(50))
		d, err := zkqueue.NewScheduled(q, root+"/delayed", 0)
		if err != nil {
			t.Fatal(err)
		}
		scheds, queues = append(scheds, d), append(queues, q)
	}
	due := time.Now().Add(3 * time.Second)
	for i := 0; i < n; i += 100 {
		drafts := make([]zkqueue.Draft, 100)
		dues := make([]time.Time, 100)
		for j := range drafts {
			// Later publishes are due earlier: order follows due time.
			drafts[j].Payload = []byte(fmt.Sprintf("m%03d", i+j))
			dues[j] = due.Add(time.Duration(n-i-j) * time.Millisecond)
		}
		ids, err := scheds[0].PublishAll(ctx, drafts, dues)
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(due) {
			t.Skip("the machine is too slow to publish before the messages are due")
		}
		if !zkqueue.IsDelayedID(ids[0]) {
			t.Fatalf("id %q does not name a delayed message", ids[0])
		}
	}
	if l, err := scheds[1].Len(ctx); err != nil || l != n {
		t.Fatalf("delayed Len %d, %v; want %d", l, err, n)
	}
	if l, err := queues[1].Len(ctx); err != nil || l != 0 {
		t.Fatalf("ready Len %d, %v before due; want 0", l, err)
	}
	for time.Now().Before(due.Add(n * time.Millisecond)) {
		time.Sleep(10 * time.Millisecond)
	}
	var wg sync.WaitGroup
	moved := make([]int, 2)
	errs := make([]error, 2)
	for i := range scheds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			moved[i], _, _, errs[i] = scheds[i].MoveDue(ctx)
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || moved[0]+moved[1] != n {
		t.Fatalf("moved %v (errors %v), want %d in all", moved, errs, n)
	}
	var got []string
	for {
		m, err := queues[0].TryDequeue(ctx)
		if err != nil {
			break
		}
		if m.Ready.IsZero() {
			t.Fatalf("%s has no Ready time", m.ID)
		}
		got = append(got, string(m.Payload))
	}
	if len(got) != n {
		t.Fatalf("dequeued %d, want %d", len(got), n)
	}
	for i, p := range got {
		if want := fmt.Sprintf("m%03d", n-1-i); p != want {
			t.Fatalf("message %d is %s, want %s (due order)", i, p, want)
		}
	}
	if l, err := scheds[0].Len(ctx); err != nil || l != 0 {
		t.Fatalf("delayed Len %d, %v after the moves; want 0", l, err)
	}
}
