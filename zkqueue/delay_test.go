package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
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

// scheduledQueue opens the queue under root with dedup records (window)
// and groups, and its delayed messages, on its own session.
func scheduledQueue(t *testing.T, root string, window time.Duration) (*zkqueue.Queue, *zkqueue.Scheduled) {
	t.Helper()
	q := newQueue(t, zktest.Conn(t), root+"/items", zkqueue.WithDedup(root+"/dedup", window), zkqueue.WithGroups(root+"/groups"))
	d, err := zkqueue.NewScheduled(q, root+"/delayed", 0)
	if err != nil {
		t.Fatal(err)
	}
	return q, d
}

// Delayed messages with dedup ids stay delayed; their records are created
// with them and span the buckets up to one past their due time's. Repeats
// through another process are answered with the delayed ids, before and
// after the move, and publish nothing.
func TestScheduledDedup(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	const window = time.Second
	qa, a := scheduledQueue(t, root, window)
	qb, b := scheduledQueue(t, root, window)
	now := time.Now()
	due := []time.Time{now.Add(3 * time.Second), {}, now.Add(3 * time.Second)}
	drafts := []zkqueue.Draft{
		{Payload: []byte("delayed"), DedupID: "d1"},
		{Payload: []byte("ready"), DedupID: "r1"},
		{Payload: []byte("plain delayed")},
	}
	rs, err := a.PublishReceipts(ctx, drafts, due)
	if err != nil {
		t.Fatal(err)
	}
	if !zkqueue.IsDelayedID(rs[0].ID) || zkqueue.IsDelayedID(rs[1].ID) || !zkqueue.IsDelayedID(rs[2].ID) || rs[0].Duplicate || rs[1].Duplicate {
		t.Fatalf("receipts %+v: want delayed, ready, delayed ids, no duplicates", rs)
	}
	// d1's records: from the publish's bucket to one past its due time's.
	conn := zktest.Conn(t)
	last := due[0].UnixNano()/int64(window) + 1
	buckets, _, err := conn.Children(root + "/dedup")
	if err != nil {
		t.Fatal(err)
	}
	var with []int64
	for _, c := range buckets {
		if ok, _, _ := conn.Exists(root + "/dedup/" + c + "/d1"); ok {
			k, _ := strconv.ParseInt(c, 10, 64)
			with = append(with, k)
		}
	}
	slices.Sort(with)
	if len(with) < 4 || with[len(with)-1] != last || with[0] > now.UnixNano()/int64(window)+1 {
		t.Fatalf("d1 recorded in buckets %v, want through %d", with, last)
	}
	check := func(when string) {
		t.Helper()
		again, err := b.PublishReceipts(ctx, []zkqueue.Draft{{Payload: []byte("again"), DedupID: "d1"},
			{Payload: []byte("again")}}, []time.Time{time.Now().Add(2 * time.Second), {}})
		if err != nil {
			t.Fatal(err)
		}
		if again[0] != (zkqueue.Receipt{ID: rs[0].ID, Duplicate: true}) || again[1].Duplicate {
			t.Fatalf("repeat %s: %+v, want %s a duplicate, then a new message", when, again, rs[0].ID)
		}
	}
	check("before due")
	if n, err := b.Len(ctx); err != nil || n != 2 {
		t.Fatalf("delayed Len %d, %v; want 2", n, err)
	}
	zktest.WaitFor(t, 30*time.Second, "the delayed messages moved", func() bool {
		if _, err := qb.TryDequeue(ctx); err == nil {
			return false // the ready ones, then the moved ones
		}
		n, _, _, err := a.MoveDue(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l, err := a.Len(ctx)
		return err == nil && n == 0 && l == 0
	})
	if time.Since(now) >= 3*time.Second+window {
		t.Skip("the machine is too slow to repeat the publish before the records may expire")
	}
	check("after the move")
	if got := drain(t, qa); len(got) != 1 || string(got[0].Payload) != "again" {
		t.Fatalf("queue holds %v after the repeat, want only the second repeat's new message", got)
	}
}

// A delayed message's records span at most MaxDedupBuckets buckets; a
// grouped message cannot be delayed, but one ready at once in a batch
// with a delayed message keeps its group.
func TestScheduledBounds(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	const window = time.Second
	q, d := scheduledQueue(t, root, window)
	now := time.Now()
	if _, err := d.PublishAll(ctx, []zkqueue.Draft{{Payload: []byte("far"), DedupID: "far"}}, []time.Time{now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	conn := zktest.Conn(t)
	buckets, _, err := conn.Children(root + "/dedup")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range buckets {
		if ok, _, _ := conn.Exists(root + "/dedup/" + c + "/far"); ok {
			n++
		}
	}
	if n != zkqueue.MaxDedupBuckets {
		t.Fatalf("recorded in %d buckets, want %d", n, zkqueue.MaxDedupBuckets)
	}
	grouped := zkqueue.Draft{Payload: []byte("g")}
	grouped.Group = "g"
	_, err = d.PublishAll(ctx, []zkqueue.Draft{grouped}, []time.Time{now.Add(time.Minute)})
	if !errors.Is(err, zkqueue.ErrBadGroup) {
		t.Fatalf("delayed grouped message: got %v, want ErrBadGroup", err)
	}
	if _, err := d.PublishAll(ctx, []zkqueue.Draft{grouped, {Payload: []byte("later")}}, []time.Time{{}, now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	entries, _, err := conn.Children(root + "/groups/g")
	if err != nil || len(entries) != 1 {
		t.Fatalf("group g holds %v, %v; want the grouped message's entry", entries, err)
	}
	if m, err := q.TryDequeue(ctx); err != nil || m.Group != "g" {
		t.Fatalf("TryDequeue: %+v, %v; want the grouped message", m, err)
	}
}
