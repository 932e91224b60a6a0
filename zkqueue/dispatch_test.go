package zkqueue_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// countGets returns an Observer counting successful read requests of
// message data (getData, and multiRead of claims reading ahead).
func countGets(n *atomic.Int64) zkqueue.Observer {
	return func(op string, _ time.Duration, err error) {
		if (op == "get" || op == "multiread") && err == nil {
			n.Add(1)
		}
	}
}

// A process claims the messages it published without reading them, and
// gets exactly what a read would have returned; messages published by
// another process, or requeued, are read as usual.
func TestClaimsOfOwnMessagesSkipTheRead(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	var getsA, getsB atomic.Int64
	a, err := zkqueue.New(zktest.Conn(t), root+"/items", zkqueue.WithObserver(countGets(&getsA)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := zkqueue.New(zktest.Conn(t), root+"/items", zkqueue.WithObserver(countGets(&getsB)))
	if err != nil {
		t.Fatal(err)
	}
	// A consumes the queue (here: found it empty just now), so it
	// remembers what it publishes.
	if _, err := a.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("A on the empty queue: %v", err)
	}
	before := time.Now()
	published := publishSinglesAndBatch(ctx, t, a)

	// B takes the first 20 (reading each); A then takes the other 30 and
	// must not read any, nor try the 20 that B took.
	for i := range 20 {
		m, err := b.TryDequeue(ctx)
		if err != nil || m.ID != published[i] {
			t.Fatalf("B's claim %d: %v %v, want %s", i, m.ID, err, published[i])
		}
	}
	for i := 20; i < 50; i++ {
		m, err := a.TryDequeue(ctx)
		if err != nil {
			t.Fatalf("A's claim %d: %v", i, err)
		}
		want := fmt.Appendf(nil, "batch %d", i-10)
		if m.ID != published[i] || !bytes.Equal(m.Payload, want) || m.Deliveries != 1 || m.Published.Before(before.Add(-time.Second)) || m.Published.After(time.Now()) {
			t.Fatalf("A's claim %d = %+v, want %s %q delivered once", i, m, published[i], want)
		}
	}
	if _, err := a.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("A after draining: %v, want ErrEmpty", err)
	}
	if n := getsA.Load(); n != 0 {
		t.Errorf("A read %d messages it had published", n)
	}
	// B reads them one by one, or several at once ahead of its claims.
	if n := getsB.Load(); n < 2 || n > 20 {
		t.Errorf("B made %d read requests for 20 messages, want 2..20", n)
	}

	checkLeasedOwnMessage(ctx, t, a, root, &getsA)
}

// publishSinglesAndBatch publishes "single 0".."single 9" one by one, then
// "batch 0".."batch 39" in one batch, and returns the 50 ids in order.
func publishSinglesAndBatch(ctx context.Context, t *testing.T, q *zkqueue.Queue) []string {
	t.Helper()
	var published []string
	for i := range 10 {
		id, err := q.Publish(ctx, fmt.Appendf(nil, "single %d", i))
		if err != nil {
			t.Fatal(err)
		}
		published = append(published, id)
	}
	var payloads [][]byte
	for i := range 40 {
		payloads = append(payloads, fmt.Appendf(nil, "batch %d", i))
	}
	ids, err := q.PublishBatch(ctx, payloads)
	if err != nil {
		t.Fatal(err)
	}
	return append(published, ids...)
}

// checkLeasedOwnMessage publishes on a and leases the message twice: the
// first claim is read-free, the requeued incarnation is read and carries
// its delivery count. gets counts a's reads.
func checkLeasedOwnMessage(ctx context.Context, t *testing.T, a *zkqueue.Queue, root string, gets *atomic.Int64) {
	t.Helper()
	leases, err := zkqueue.NewLeases(a, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Publish(ctx, []byte("leased")); err != nil {
		t.Fatal(err)
	}
	gets.Store(0)
	l, err := leases.Take(ctx, 1, zkqueue.Room{}, time.Minute, false)
	if err != nil || string(l[0].Payload) != "leased" || l[0].Deliveries != 1 {
		t.Fatalf("first lease: %+v %v", l, err)
	}
	if n := gets.Load(); n != 0 {
		t.Errorf("first lease read %d times", n)
	}
	if _, _, err := leases.Nack(ctx, l[0].Token, 0, zkqueue.Policy{}); err != nil {
		t.Fatal(err)
	}
	l, err = leases.Take(ctx, 1, zkqueue.Room{}, time.Minute, false)
	if err != nil || string(l[0].Payload) != "leased" || l[0].Deliveries != 2 {
		t.Fatalf("second lease: %+v %v", l, err)
	}
	if _, err := leases.Ack(ctx, l[0].Token); err != nil {
		t.Fatal(err)
	}
}

// Processes that both publish and consume race for the same head: every
// message is delivered exactly once whether its claim read it or used the
// publisher's copy.
func TestPublishersRacingForTheHead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := zktest.Root(t)
	const stores, perStore, consumersPerStore = 4, 500, 4
	var gets atomic.Int64
	var all []*zkqueue.Queue
	for range stores {
		conn := zktest.Conn(t)
		batcher := zkqueue.NewCommitter([]*zk.Conn{conn}, zkqueue.CommitterConfig{Workers: 2, MaxOps: 32, MaxBytes: 512 << 10})
		t.Cleanup(batcher.Close)
		s, err := zkqueue.New(conn, root, zkqueue.WithObserver(countGets(&gets)), zkqueue.WithCommitter(batcher))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, s)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var delivered atomic.Int64
	var wg sync.WaitGroup
	for i, s := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < perStore; j += 10 {
				payloads := make([][]byte, 10)
				for k := range payloads {
					payloads[k] = fmt.Appendf(nil, "%d/%d", i, j+k)
				}
				if _, err := s.PublishBatch(ctx, payloads); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		for range consumersPerStore {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for delivered.Load() < stores*perStore {
					cctx, ccancel := context.WithTimeout(ctx, 200*time.Millisecond)
					ms, err := s.Take(cctx, 8, zkqueue.Room{}, true)
					ccancel()
					if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					for _, m := range ms {
						seen[string(m.Payload)]++
					}
					mu.Unlock()
					delivered.Add(int64(len(ms)))
				}
			}()
		}
	}
	wg.Wait()
	if len(seen) != stores*perStore {
		t.Errorf("%d distinct messages delivered, want %d", len(seen), stores*perStore)
	}
	for p, n := range seen {
		if n != 1 {
			t.Errorf("%s delivered %d times", p, n)
		}
	}
	t.Logf("%d of %d claims read the message", gets.Load(), stores*perStore)
}

// The consumers of one process never race each other: while messages
// stream in and the children are listed again and again, candidates
// being claimed, or claimed while a listing was under way, are not handed
// out twice, so not one claim is lost.
func TestOneProcessNeverRacesItself(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	batcher := zkqueue.NewCommitter([]*zk.Conn{conn}, zkqueue.CommitterConfig{Workers: 4, MaxOps: 32, MaxBytes: 512 << 10})
	t.Cleanup(batcher.Close)
	var conflicts atomic.Int64
	s, err := zkqueue.New(conn, root, zkqueue.WithCommitter(batcher), zkqueue.WithReaders(zktest.Conn(t)),
		zkqueue.WithConflictHook(func() { conflicts.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := zkqueue.New(zktest.Conn(t), root)
	if err != nil {
		t.Fatal(err)
	}
	const total = 3000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < total; i += 5 {
			payloads := [][]byte{{1}, {2}, {3}, {4}, {5}}
			if _, err := pub.PublishBatch(ctx, payloads); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var delivered atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for delivered.Load() < total && ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
				ms, err := s.Take(cctx, 4, zkqueue.Room{}, true)
				ccancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Error(err)
					return
				}
				delivered.Add(int64(len(ms)))
			}
		}()
	}
	wg.Wait()
	if n := delivered.Load(); n != total {
		t.Errorf("delivered %d, want %d", n, total)
	}
	if n := conflicts.Load(); n != 0 {
		t.Errorf("%d claims lost to this process's own consumers", n)
	}
}
