package zkqueue_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// Dead letters are kept in segments named as the items segments they died
// from: paging walks them in queue order across segments (flat letters of
// the former layout first), counting and redrive see all of them, and
// redrive removes the dead segments it empties.
func TestDeadLettersInSegments(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	q, err := zkqueue.New(conn, root+"/items", zkqueue.WithSegmentSize(5))
	if err != nil {
		t.Fatal(err)
	}
	leases, err := zkqueue.NewLeases(q, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	// A dead letter of the former flat layout, written directly.
	flat := zkqueue.EncodeData(zkqueue.Message{Payload: []byte("flat"), Published: time.Now()})
	if _, err := conn.Create(root+"/dead/qn-0000000007", flat, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	const n = 23
	for i := range n {
		if _, err := q.Publish(ctx, fmt.Appendf(nil, "m%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	kill := zkqueue.Policy{MaxDeliveries: 1, DeadLetter: true}
	for dead := 0; dead < n; {
		ls, err := leases.Take(ctx, 7, zkqueue.Room{}, time.Minute, false)
		if err != nil {
			t.Fatalf("take after %d: %v", dead, err)
		}
		for _, l := range ls {
			if _, out, err := leases.Nack(ctx, l.Token, 0, kill); err != nil || out != zkqueue.DeadLettered {
				t.Fatalf("nack %s: %v %v", l.ID, out, err)
			}
			dead++
		}
	}
	children, _, err := conn.Children(root + "/dead")
	if err != nil {
		t.Fatal(err)
	}
	if len(children) != 1+(n+4)/5 {
		t.Errorf("dead parent holds %v: want the flat letter and %d segments", children, (n+4)/5)
	}
	if c, err := leases.DeadCount(ctx); err != nil || c != n+1 {
		t.Fatalf("DeadCount = %d, %v; want %d", c, err, n+1)
	}

	// Pages of 4: the flat letter, then m00..m22 in order.
	var got []string
	for after := ""; ; {
		ms, next, err := leases.DeadLettersAfter(ctx, after, 4, zkqueue.Room{})
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) > 4 {
			t.Fatalf("page of %d > 4", len(ms))
		}
		for _, m := range ms {
			got = append(got, string(m.Payload))
		}
		if next == "" {
			break
		}
		after = next
	}
	want := []string{"flat"}
	for i := range n {
		want = append(want, fmt.Sprintf("m%02d", i))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages = %v\nwant %v", got, want)
	}

	// Redrive the first segment's letters by id, then all the rest.
	first, err := leases.DeadLetters(ctx, 6)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range first[1:] {
		ids = append(ids, m.ID)
	}
	if moved, err := leases.Redrive(ctx, ids); err != nil || moved != 5 {
		t.Fatalf("Redrive(%v) = %d, %v", ids, moved, err)
	}
	children, _, _ = conn.Children(root + "/dead")
	if len(children) != (n+4)/5 || slices.ContainsFunc(children, func(c string) bool { return strings.HasSuffix(c, "0000001") }) {
		t.Errorf("after redriving segment 1, dead holds %v", children)
	}
	if moved, err := leases.Redrive(ctx, nil); err != nil || moved != n+1-5 {
		t.Fatalf("Redrive(all) = %d, %v; want %d", moved, err, n+1-5)
	}
	if children, _, _ = conn.Children(root + "/dead"); len(children) != 0 {
		t.Errorf("after redriving all, dead holds %v", children)
	}
	if c, err := leases.DeadCount(ctx); err != nil || c != 0 {
		t.Errorf("DeadCount = %d, %v; want 0", c, err)
	}
	// Every message is back, delivered again.
	seen := map[string]bool{}
	for len(seen) < n+1 {
		ms, err := q.Take(ctx, 10, zkqueue.Room{}, false)
		if err != nil {
			t.Fatalf("take after %d: %v", len(seen), err)
		}
		for _, m := range ms {
			if seen[string(m.Payload)] {
				t.Fatalf("%s delivered twice", m.Payload)
			}
			seen[string(m.Payload)] = true
		}
	}
}
