package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// dedupQueue opens the queue at root/items with its dedup records under
// root/dedup, on its own session (as another process would).
func dedupQueue(t *testing.T, root string, window time.Duration, opts ...zkqueue.Option) *zkqueue.Queue {
	t.Helper()
	return newQueue(t, zktest.Conn(t), root+"/items", append(opts, zkqueue.WithDedup(root+"/dedup", window))...)
}

func drain(t *testing.T, q *zkqueue.Queue) []zkqueue.Message {
	t.Helper()
	ms, err := q.Take(context.Background(), 1000, zkqueue.Room{}, false)
	if err != nil && !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatal(err)
	}
	return ms
}

// The same dedup id published through two processes is one message: the
// second publish is answered with the first one's id.
func TestDedupAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	a := dedupQueue(t, root, time.Minute)
	b := dedupQueue(t, root, time.Minute)
	first, err := a.PublishReceipts(ctx, []zkqueue.Draft{{Payload: []byte("x"), DedupID: "order-42"}})
	if err != nil {
		t.Fatal(err)
	}
	if first[0].Duplicate || first[0].ID == "" {
		t.Fatalf("first publish: %+v", first[0])
	}
	again, err := b.PublishReceipts(ctx, []zkqueue.Draft{{Payload: []byte("x"), DedupID: "order-42"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := (zkqueue.Receipt{ID: first[0].ID, Duplicate: true}); again[0] != want {
		t.Fatalf("repeat: got %+v, want %+v", again[0], want)
	}
	id, err := b.PublishDraft(ctx, zkqueue.Draft{Payload: []byte("x"), DedupID: "order-42"})
	if err != nil || id != first[0].ID {
		t.Fatalf("PublishDraft repeat: got %q, %v; want %q", id, err, first[0].ID)
	}
	ms := drain(t, b)
	if len(ms) != 1 || ms[0].ID != first[0].ID {
		t.Fatalf("queue holds %v, want the one message %s", ms, first[0].ID)
	}
	// Consumed, the id is still remembered.
	again, err = a.PublishReceipts(ctx, []zkqueue.Draft{{Payload: []byte("x"), DedupID: "order-42"}})
	if err != nil || !again[0].Duplicate || again[0].ID != first[0].ID {
		t.Fatalf("repeat after consumption: %+v, %v", again, err)
	}
}

// A batch with one repeat of an earlier publish and one id twice: the
// others are published, in order, the repeats answered with the first ids.
func TestDedupBatch(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	q := dedupQueue(t, root, time.Minute)
	old, err := q.PublishDraft(ctx, zkqueue.Draft{Payload: []byte("old"), DedupID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := q.PublishReceipts(ctx, []zkqueue.Draft{
		{Payload: []byte("1"), DedupID: "b"},
		{Payload: []byte("2"), DedupID: "a"},
		{Payload: []byte("3")},
		{Payload: []byte("4"), DedupID: "b"},
		{Payload: []byte("5"), DedupID: "c"},
	})
	if err != nil {
		t.Fatal(err)
	}
	dup := []bool{false, true, false, true, false}
	for i, r := range rs {
		if r.Duplicate != dup[i] || r.ID == "" {
			t.Errorf("message %d: %+v, want duplicate %v", i, r, dup[i])
		}
	}
	if rs[1].ID != old || rs[3].ID != rs[0].ID {
		t.Errorf("duplicates' ids %s, %s; want %s, %s", rs[1].ID, rs[3].ID, old, rs[0].ID)
	}
	var got []string
	for _, m := range drain(t, q) {
		got = append(got, string(m.Payload))
	}
	if fmt.Sprint(got) != "[old 1 3 5]" {
		t.Fatalf("queue holds %v, want [old 1 3 5]", got)
	}
}

// Concurrent publishes of one id through one Committer and through other
// sessions make one message; every caller gets its id.
func TestDedupConcurrent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	c := zkqueue.NewCommitter([]*zk.Conn{conn}, zkqueue.CommitterConfig{})
	defer c.Close()
	shared := newQueue(t, conn, root+"/items", zkqueue.WithCommitter(c), zkqueue.WithDedup(root+"/dedup", time.Minute))
	other := dedupQueue(t, root, time.Minute)
	const n = 16
	rs := make([]zkqueue.Receipt, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		q := shared
		if i%4 == 0 {
			q = other
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each goroutine also publishes a message of its own in
			// the same batch: one duplicate must not fail it.
			var r []zkqueue.Receipt
			r, errs[i] = q.PublishReceipts(ctx, []zkqueue.Draft{{Payload: []byte("same"), DedupID: "same"}})
			if errs[i] == nil {
				rs[i] = r[0]
			}
			if _, err := q.PublishDraft(ctx, zkqueue.Draft{Payload: []byte("own"), DedupID: fmt.Sprintf("own-%d", i)}); err != nil {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	firsts := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("publish %d: %v", i, errs[i])
		}
		if !rs[i].Duplicate {
			firsts++
		}
		if rs[i].ID != rs[0].ID || rs[i].ID == "" {
			t.Errorf("publish %d: id %q, publish 0: %q", i, rs[i].ID, rs[0].ID)
		}
	}
	if firsts != 1 {
		t.Errorf("%d publishes were not duplicates, want 1", firsts)
	}
	if ms := drain(t, shared); len(ms) != n+1 {
		t.Errorf("queue holds %d messages, want %d", len(ms), n+1)
	}
}

// After the window an id is accepted again (within twice the window),
// and ExpireDedup deletes the buckets no publish needs any more.
func TestDedupWindowExpires(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	const window = time.Second
	q := dedupQueue(t, root, window)
	start := time.Now() // before the first publish: its window starts later
	first, err := q.PublishDraft(ctx, zkqueue.Draft{Payload: []byte("x"), DedupID: "k"})
	if err != nil {
		t.Fatal(err)
	}
	var second string
	zktest.WaitFor(t, 30*time.Second, "the id accepted again", func() bool {
		rs, err := q.PublishReceipts(ctx, []zkqueue.Draft{{Payload: []byte("x"), DedupID: "k"}})
		if err != nil {
			t.Fatal(err)
		}
		if rs[0].Duplicate {
			if rs[0].ID != first {
				t.Fatalf("repeat within the window answered %q, want %q", rs[0].ID, first)
			}
			return false
		}
		second = rs[0].ID
		return true
	})
	if time.Since(start) < window {
		t.Fatalf("id accepted again after %v, within the window %v", time.Since(start), window)
	}
	if second == first {
		t.Fatalf("accepted again with the old id %s", first)
	}
	conn := zktest.Conn(t)
	deleted := 0
	zktest.WaitFor(t, 30*time.Second, "old buckets deleted", func() bool {
		n, _, _, err := zkqueue.ExpireDedup(ctx, conn, root+"/dedup", window, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		deleted += n
		children, _, err := conn.Children(root + "/dedup")
		if err != nil {
			t.Fatal(err)
		}
		return deleted >= 2 && len(children) <= 2
	})
	if ms := drain(t, q); len(ms) != 2 {
		t.Fatalf("queue holds %d messages, want 2", len(ms))
	}
	// Nothing to expire: the next due time is ahead, the watch armed.
	_, next, w, err := zkqueue.ExpireDedup(ctx, conn, root+"/dedup", window, time.Now())
	if err != nil || w == nil || (!next.IsZero() && !next.After(time.Now())) {
		t.Fatalf("ExpireDedup: next %v, watch %v, %v", next, w != nil, err)
	}
}

// Bad ids, and an id for a queue without WithDedup, are refused and
// change nothing.
func TestDedupBadID(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	q := dedupQueue(t, root, time.Minute)
	long := string(make([]byte, zkqueue.MaxDedupID+1))
	for _, id := range []string{"a/b", ".", "..", "x y", long} {
		if _, err := q.PublishDraft(ctx, zkqueue.Draft{Payload: []byte("x"), DedupID: id}); !errors.Is(err, zkqueue.ErrBadDedupID) {
			t.Errorf("id %.20q: %v, want ErrBadDedupID", id, err)
		}
	}
	plain := newQueue(t, zktest.Conn(t), root+"/items")
	if _, err := plain.PublishAll(ctx, []zkqueue.Draft{{Payload: []byte("x"), DedupID: "ok"}}); !errors.Is(err, zkqueue.ErrBadDedupID) {
		t.Errorf("id without WithDedup: %v, want ErrBadDedupID", err)
	}
	if ms := drain(t, q); len(ms) != 0 {
		t.Fatalf("queue holds %d messages", len(ms))
	}
	if _, err := zkqueue.New(zktest.Conn(t), root+"/x", zkqueue.WithDedup(root+"/d", time.Millisecond)); err == nil {
		t.Error("a 1ms window was accepted")
	}
}

// BenchmarkPublishDedup is BenchmarkPublish with a dedup id per message:
// two record creates in the message's transaction, one record write
// after it.
func BenchmarkPublishDedup(b *testing.B) {
	root := zktest.Root(b)
	q, err := zkqueue.New(zktest.Conn(b), root+"/q", zkqueue.WithDedup(root+"/dedup", time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(payload100)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := q.PublishDraft(ctx, zkqueue.Draft{Payload: payload100, DedupID: fmt.Sprintf("id-%d", i)}); err != nil {
			b.Fatal(err)
		}
	}
}

// A record not filled in yet (its publisher committed the message but has
// not written the id, or died in between) still refuses the repeat: the
// repeat waits for the id, and without one is answered as a duplicate
// without an id.
func TestDedupPendingRecord(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	const window = time.Minute
	q := dedupQueue(t, root, window)
	conn := zktest.Conn(t)
	if _, err := q.PublishDraft(ctx, zkqueue.Draft{Payload: []byte("warm"), DedupID: "warm"}); err != nil {
		t.Fatal(err) // creates the dedup parent and the current buckets
	}
	// Empty records in every bucket a publish now may use, as a
	// publisher leaves them between its two transactions.
	b := time.Now().UnixNano() / int64(window)
	var records []string
	for k := b - 1; k <= b+2; k++ {
		bucket := fmt.Sprintf("%s/dedup/%019d", root, k)
		if _, err := conn.Create(bucket, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
		for _, id := range []string{"filled", "never"} {
			if _, err := conn.Create(bucket+"/"+id, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
				t.Fatal(err)
			}
			if id == "filled" {
				records = append(records, bucket+"/"+id)
			}
		}
	}
	done := make(chan zkqueue.Receipt, 1)
	errc := make(chan error, 1)
	go func() {
		rs, err := q.PublishReceipts(ctx, []zkqueue.Draft{{Payload: []byte("x"), DedupID: "filled"}})
		if err != nil {
			errc <- err
			return
		}
		done <- rs[0]
	}()
	for _, p := range records {
		if _, err := conn.Set(p, []byte("qn-1-0000000007"), -1); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case r := <-done:
		if want := (zkqueue.Receipt{ID: "qn-1-0000000007", Duplicate: true}); r != want {
			t.Fatalf("repeat of a record filled later: %+v, want %+v", r, want)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("repeat of a record filled later: no answer in 30s")
	}
	rs, err := q.PublishReceipts(ctx, []zkqueue.Draft{{Payload: []byte("x"), DedupID: "never"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := (zkqueue.Receipt{Duplicate: true}); rs[0] != want {
		t.Fatalf("repeat of a record never filled: %+v, want %+v", rs[0], want)
	}
	if ms := drain(t, q); len(ms) != 1 {
		t.Fatalf("queue holds %d messages, want only the first", len(ms))
	}
}

// A single message of the largest payload may carry a dedup id even when
// the batch byte limit equals the payload limit: like PublishDraft, it is
// bounded by the payload limit alone.
func TestDedupLargestPayload(t *testing.T) {
	root := zktest.Root(t)
	const limit = 64 << 10
	q := dedupQueue(t, root, time.Minute, zkqueue.WithLimits(zkqueue.Limits{MaxPayload: limit, MaxBatchBytes: limit}))
	rs, err := q.PublishReceipts(context.Background(), []zkqueue.Draft{{Payload: make([]byte, limit), DedupID: "big"}})
	if err != nil || rs[0].ID == "" {
		t.Fatalf("PublishReceipts: %v, %v", rs, err)
	}
}
