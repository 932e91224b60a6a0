package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// A message published through another Queue (another broker) is not
// known to the consuming one without a listing: a fair dispatcher lists
// the head again after a change within a bounded delay, so a quiet key's
// message published elsewhere behind another key's backlog is delivered
// long before that backlog is used up, not after it as from a snapshot
// walked to its end.
func TestFairSeesOtherPublisher(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := zktest.Root(t) + "/items"
	fair := zkqueue.WithFairness(zkqueue.Fairness{Key: zkqueue.FairnessHeader + "tenant"})
	cons, err := zkqueue.New(zktest.Conn(t), path, fair, zkqueue.WithPublisher("consumer"))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := zkqueue.New(zktest.Conn(t), path, fair, zkqueue.WithPublisher("publisher"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cons.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("consuming the empty queue: %v", err)
	}
	publish := func(tn string, k int) {
		t.Helper()
		for i := 0; i < k; {
			var ds []zkqueue.Draft
			for ; i < k && len(ds) < 100; i++ {
				ds = append(ds, zkqueue.Draft{Payload: []byte(fmt.Sprint(tn, i)),
					Attributes: zkqueue.Attributes{Headers: map[string]string{"tenant": tn}}})
			}
			if _, err := pub.PublishAll(ctx, ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	const backlog = 2000
	publish("a", backlog)
	// Takes of a's messages alone: the listings after their deletes find
	// nothing new, and the dispatcher lists less and less often.
	const first = 200
	for i := range first {
		if m, err := cons.TryDequeue(ctx); err != nil || m.Headers["tenant"] != "a" {
			t.Fatalf("take %d: %v, %v; want one of a", i+1, m.Headers, err)
		}
	}
	publish("b", 1)
	start := time.Now()
	for taken := first; ; taken++ {
		m, err := cons.TryDequeue(ctx)
		if err != nil {
			t.Fatalf("take %d: %v", taken+1, err)
		}
		if m.Headers["tenant"] == "b" {
			t.Logf("b's message delivered %v after its publish, after %d more deliveries of a", time.Since(start), taken-first)
			if taken >= backlog {
				t.Fatalf("b's message delivered after a's whole backlog of %d, want before", backlog)
			}
			return
		}
	}
}
