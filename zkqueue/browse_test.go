package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// browseAll pages through q, limit at a time, and returns every message
// with the number of pages; check runs after each page.
func browseAll(t *testing.T, q *zkqueue.Queue, limit int, room zkqueue.Room, check func(page []zkqueue.Message)) []zkqueue.Message {
	t.Helper()
	var all []zkqueue.Message
	after := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("browse does not end")
		}
		ms, next, err := q.Browse(context.Background(), after, limit, room)
		if err != nil {
			t.Fatalf("Browse(%q): %v", after, err)
		}
		if limit > 0 && len(ms) > limit {
			t.Fatalf("page of %d > limit %d", len(ms), limit)
		}
		if check != nil {
			check(ms)
		}
		all = append(all, ms...)
		if next == "" {
			return all
		}
		if len(ms) == 0 || next != ms[len(ms)-1].ID {
			t.Fatalf("next %q after a page of %d ending %v", next, len(ms), ms)
		}
		after = next
	}
}

func ids(ms []zkqueue.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// Paging through a queue of many small segments returns every ready
// message once, in order, with its attributes, claims nothing, and lists
// only the segments a page reaches.
func TestBrowsePagesAcrossSegments(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	pub := newQueue(t, conn, root+"/items", zkqueue.WithSegmentSize(5))
	var want []string
	for i := range 43 {
		d := zkqueue.Draft{Payload: []byte(fmt.Sprintf("m%02d", i))}
		if i%3 == 0 {
			d.Attributes = zkqueue.Attributes{ContentType: "text/plain", Headers: map[string]string{"i": fmt.Sprint(i)}}
		}
		id, err := pub.PublishDraft(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	var listings atomic.Int64
	q := newQueue(t, conn, root+"/items", zkqueue.WithSegmentSize(5), zkqueue.WithObserver(func(op string, _ time.Duration, _ error) {
		if op == "children" {
			listings.Add(1)
		}
	}))
	for _, limit := range []int{1, 7, 10, 100, 0} {
		all := browseAll(t, q, limit, zkqueue.Room{}, func(page []zkqueue.Message) {
			// The parent, and the segments of the page: at most
			// ceil(limit/5)+1 of them.
			if n := listings.Swap(0); limit > 0 && n > int64(1+(limit+4)/5+1) {
				t.Errorf("limit %d: a page made %d listings", limit, n)
			}
		})
		if got := ids(all); !slices.Equal(got, want) {
			t.Fatalf("limit %d: got %v, want %v", limit, got, want)
		}
		for i, m := range all {
			if string(m.Payload) != fmt.Sprintf("m%02d", i) || m.Deliveries != 0 {
				t.Fatalf("message %d: %q with %d deliveries", i, m.Payload, m.Deliveries)
			}
			if i%3 == 0 && (m.ContentType != "text/plain" || m.Headers["i"] != fmt.Sprint(i)) {
				t.Fatalf("message %d: attributes %+v", i, m.Attributes)
			}
		}
	}
	if n, err := q.Len(context.Background()); err != nil || n != 43 {
		t.Fatalf("Len after browsing = %d, %v; want 43", n, err)
	}
	// The head is still there, never delivered.
	m, err := q.TryDequeue(context.Background())
	if err != nil || m.ID != want[0] || m.Deliveries != 1 {
		t.Fatalf("after browsing, TryDequeue = %v (%d deliveries), %v; want %s, first delivery", m.ID, m.Deliveries, err, want[0])
	}
}

// A priority queue is browsed in delivery order: priority, then publish
// order, across its levels' segments.
func TestBrowsePriorityOrder(t *testing.T) {
	root := zktest.Root(t)
	q := newQueue(t, zktest.Conn(t), root+"/items", zkqueue.WithPriorities(), zkqueue.WithSegmentSize(3))
	type pm struct {
		p  int
		id string
	}
	var published []pm
	for i := range 30 {
		p := []int{5, 0, 2}[i%3]
		if i%7 == 0 {
			p = 255
		}
		id, err := q.PublishPriority(context.Background(), p, []byte(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		published = append(published, pm{p, id})
	}
	slices.SortStableFunc(published, func(a, b pm) int { return a.p - b.p })
	var want []string
	for _, m := range published {
		want = append(want, m.id)
	}
	for _, limit := range []int{4, 0} {
		if got := ids(browseAll(t, q, limit, zkqueue.Room{}, nil)); !slices.Equal(got, want) {
			t.Fatalf("limit %d: got %v, want %v", limit, got, want)
		}
	}
	// Taking one at a time agrees.
	var taken []string
	for range want {
		m, err := q.TryDequeue(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		taken = append(taken, m.ID)
	}
	if !slices.Equal(taken, want) {
		t.Fatalf("taken %v; browsed %v", taken, want)
	}
}

// Leased messages are not ready: Browse leaves them out; put back, one
// shows at its place with its delivery count. A page bounded in bytes
// holds fewer; a malformed cursor is refused.
func TestBrowseLeasesRoomCursor(t *testing.T) {
	root := zktest.Root(t)
	pr := newSegProc(t, root, zkqueue.WithSegmentSize(4))
	ctx := context.Background()
	var want []string
	for range 10 {
		id, err := pr.q.Publish(ctx, make([]byte, 100))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	ls, err := pr.l.Take(ctx, 2, zkqueue.Room{}, time.Minute, false)
	if err != nil || len(ls) != 2 {
		t.Fatalf("Take: %d, %v", len(ls), err)
	}
	if got := ids(browseAll(t, pr.q, 3, zkqueue.Room{}, nil)); !slices.Equal(got, want[2:]) {
		t.Fatalf("with two leased: got %v, want %v", got, want[2:])
	}
	if _, _, err := pr.l.Nack(ctx, ls[0].Token, 0, zkqueue.Policy{}); err != nil {
		t.Fatal(err)
	}
	all := browseAll(t, pr.q, 0, zkqueue.Room{}, nil)
	if got := ids(all); !slices.Equal(got, append([]string{want[0]}, want[2:]...)) || all[0].Deliveries != 1 {
		t.Fatalf("after a nack: got %v (head %d deliveries), want %s first with 1", got, all[0].Deliveries, want[0])
	}

	// 250 bytes hold two messages of 100 bytes plus 20 of overhead.
	page := 0
	all = browseAll(t, pr.q, 0, zkqueue.Room{Bytes: 250, Overhead: 20}, func(ms []zkqueue.Message) {
		if page++; len(ms) > 2 {
			t.Errorf("page of %d messages over 250 bytes", len(ms))
		}
	})
	if len(all) != 9 || page < 5 {
		t.Fatalf("room-bounded browse: %d messages in %d pages, want 9 in at least 5", len(all), page)
	}

	for _, bad := range []string{"x", "qn-", "../qn-1-0000000001"} {
		if _, _, err := pr.q.Browse(ctx, bad, 1, zkqueue.Room{}); !errors.Is(err, zkqueue.ErrBadCursor) {
			t.Fatalf("Browse(%q): got %v, want ErrBadCursor", bad, err)
		}
	}
	// A cursor past the end: an empty last page.
	if ms, next, err := pr.q.Browse(ctx, "qn-99-0000000000", 5, zkqueue.Room{}); err != nil || len(ms) != 0 || next != "" {
		t.Fatalf("past the end: %v, %q, %v", ms, next, err)
	}
}
