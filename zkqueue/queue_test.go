package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

func newQueue(t *testing.T, conn *zk.Conn, path string, opts ...zkqueue.Option) *zkqueue.Queue {
	t.Helper()
	q, err := zkqueue.New(conn, path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// Eight producers and eight consumers, each with its own session (as if
// in separate processes), exchange 20,000 messages: each is delivered
// exactly once, none is lost, and every producer's order holds at each
// consumer.
func TestConcurrentProducersConsumers(t *testing.T) {
	const producers, consumers, perProducer = 8, 8, 2500
	const total = producers * perProducer
	path := zktest.Root(t) + "/q"
	newQueue(t, zktest.Conn(t), path)

	// About 20 s with -race on a quiet 2-core machine; the bound only
	// stops a hung run, well inside go test's -timeout, and leaves room
	// for a machine busy with other work.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	var wg sync.WaitGroup
	errc := make(chan error, producers+consumers)
	for p := 0; p < producers; p++ {
		q := newQueue(t, zktest.Conn(t), path)
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			if err := produce(ctx, q, p, perProducer); err != nil {
				errc <- err
			}
		}(p)
	}

	tl := &tally{seen: make(map[string]string, total), total: total, done: make(chan struct{}), cancel: cancel}
	for c := 0; c < consumers; c++ {
		q := newQueue(t, zktest.Conn(t), path)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := consume(ctx, q, producers, tl); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	seen := tl.seen
	if len(seen) != total {
		t.Fatalf("received %d distinct messages, want %d", len(seen), total)
	}
	for p := 0; p < producers; p++ {
		for i := 0; i < perProducer; i++ {
			if _, ok := seen[fmt.Sprintf("%d:%d", p, i)]; !ok {
				t.Fatalf("message %d:%d lost", p, i)
			}
		}
	}
	if n, err := newQueue(t, zktest.Conn(t), path).Len(context.Background()); err != nil || n != 0 {
		t.Errorf("Len after drain = %d, %v; want 0", n, err)
	}
}

// produce publishes "p:0" .. "p:n-1" in order, mixing single publishes and
// small atomic batches.
func produce(ctx context.Context, q *zkqueue.Queue, p, n int) error {
	for i := 0; i < n; {
		if i%10 == 0 && i+5 <= n {
			batch := make([][]byte, 5)
			for j := range batch {
				batch[j] = []byte(fmt.Sprintf("%d:%d", p, i+j))
			}
			if _, err := q.PublishBatch(ctx, batch); err != nil {
				return err
			}
			i += 5
			continue
		}
		if _, err := q.Publish(ctx, []byte(fmt.Sprintf("%d:%d", p, i))); err != nil {
			return err
		}
		i++
	}
	return nil
}

// tally records the messages all consumers received; once total have
// arrived it closes done and cancels the consumers' context.
type tally struct {
	mu       sync.Mutex
	seen     map[string]string // payload -> message id
	received int
	total    int
	done     chan struct{}
	cancel   context.CancelFunc
}

// record fails if m was delivered before.
func (tl *tally) record(m zkqueue.Message) error {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if prev, dup := tl.seen[string(m.Payload)]; dup {
		return fmt.Errorf("%q delivered twice (%s, %s)", m.Payload, prev, m.ID)
	}
	tl.seen[string(m.Payload)] = m.ID
	tl.received++
	if tl.received == tl.total {
		close(tl.done)
		tl.cancel() // wakes the other consumers
	}
	return nil
}

// consume dequeues "p:i" payloads until tl is complete, checking that each
// producer's messages arrive here in order.
func consume(ctx context.Context, q *zkqueue.Queue, producers int, tl *tally) error {
	last := make([]int, producers) // per producer, last index seen here
	for i := range last {
		last[i] = -1
	}
	for {
		m, err := q.Dequeue(ctx)
		if err != nil {
			select {
			case <-tl.done:
				return nil
			default:
			}
			return err
		}
		ps, is, _ := strings.Cut(string(m.Payload), ":")
		p, _ := strconv.Atoi(ps)
		i, _ := strconv.Atoi(is)
		if i <= last[p] {
			return fmt.Errorf("producer %d: got %d after %d", p, i, last[p])
		}
		last[p] = i
		if err := tl.record(m); err != nil {
			return err
		}
	}
}

func TestFIFOOrderAndPeek(t *testing.T) {
	ctx := context.Background()
	q := newQueue(t, zktest.Conn(t), zktest.Root(t)+"/a/b/q")
	if _, err := q.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("TryDequeue on empty queue: got %v, want ErrEmpty", err)
	} else if n := strings.Count(err.Error(), "zkqueue:"); n != 1 || !strings.Contains(err.Error(), "dequeue") {
		t.Fatalf("TryDequeue on empty queue: got %q, want the operation named and the package prefix once", err)
	}
	if _, err := q.Peek(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("Peek on empty queue: got %v, want ErrEmpty", err)
	}
	ids, err := q.PublishBatch(ctx, [][]byte{[]byte("0"), []byte("1"), []byte("2")})
	if err != nil {
		t.Fatal(err)
	}
	for i := 3; i < 12; i++ {
		if _, err := q.Publish(ctx, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := q.Len(ctx); err != nil || n != 12 {
		t.Fatalf("Len = %d, %v; want 12", n, err)
	}
	m, err := q.Peek(ctx)
	if err != nil || m.ID != ids[0] || string(m.Payload) != "0" {
		t.Fatalf("Peek = %+v, %v; want %s with payload 0", m, err, ids[0])
	}
	for i := 0; i < 6; i++ {
		m, err := q.TryDequeue(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := string(m.Payload), strconv.Itoa(i); got != want {
			t.Fatalf("dequeued %q, want %q", got, want)
		}
		if m.Deliveries != 1 || time.Since(m.Published) > time.Minute {
			t.Errorf("message %s: deliveries %d, published %v", m.ID, m.Deliveries, m.Published)
		}
	}
	n, err := q.Purge(ctx)
	if err != nil || n != 6 {
		t.Fatalf("Purge = %d, %v; want 6", n, err)
	}
	if n, err := q.Len(ctx); err != nil || n != 0 {
		t.Fatalf("Len after purge = %d, %v; want 0", n, err)
	}
}

func TestDequeueWakesOnPublish(t *testing.T) {
	path := zktest.Root(t) + "/q"
	consumer := newQueue(t, zktest.Conn(t), path)
	producer := newQueue(t, zktest.Conn(t), path)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	got := make(chan zkqueue.Message, 1)
	errc := make(chan error, 1)
	go func() {
		m, err := consumer.Dequeue(ctx)
		if err != nil {
			errc <- err
			return
		}
		got <- m
	}()
	// Give the consumer time to block on its watch; the test is correct
	// either way, this only makes it exercise the wake-up path.
	time.Sleep(200 * time.Millisecond)
	if _, err := producer.Publish(ctx, []byte("wake")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if string(m.Payload) != "wake" {
			t.Fatalf("got %q, want wake", m.Payload)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-ctx.Done():
		t.Fatal("blocked Dequeue did not wake on publish")
	}
}

func TestDequeueCancelLeavesNoGoroutine(t *testing.T) {
	q := newQueue(t, zktest.Conn(t), zktest.Root(t)+"/q")
	ignore := goleak.IgnoreCurrent()
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := q.Dequeue(ctx)
			errc <- err
		}()
		time.Sleep(5 * time.Millisecond)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Dequeue returned %v, want context.Canceled", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := q.Dequeue(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dequeue past deadline returned %v, want DeadlineExceeded", err)
	}
	goleak.VerifyNone(t, ignore)
}

func TestLimitsWriteNothing(t *testing.T) {
	ctx := context.Background()
	q := newQueue(t, zktest.Conn(t), zktest.Root(t)+"/q",
		zkqueue.WithMaxPayload(1024), zkqueue.WithMaxBatchCount(10), zkqueue.WithMaxBatchBytes(8<<10))

	if _, err := q.Publish(ctx, make([]byte, 1025)); !errors.Is(err, zkqueue.ErrTooLarge) {
		t.Errorf("oversized payload: got %v, want ErrTooLarge", err)
	}
	if _, err := q.Publish(ctx, make([]byte, 1024)); err != nil {
		t.Errorf("payload at the limit: %v", err)
	}
	tooMany := make([][]byte, 11)
	for i := range tooMany {
		tooMany[i] = []byte("x")
	}
	if _, err := q.PublishBatch(ctx, tooMany); !errors.Is(err, zkqueue.ErrBatchTooLarge) {
		t.Errorf("batch over count: got %v, want ErrBatchTooLarge", err)
	}
	tooBig := [][]byte{make([]byte, 1000), make([]byte, 1000), make([]byte, 1000), make([]byte, 1000),
		make([]byte, 1000), make([]byte, 1000), make([]byte, 1000), make([]byte, 1000)}
	if _, err := q.PublishBatch(ctx, tooBig); !errors.Is(err, zkqueue.ErrBatchTooLarge) {
		t.Errorf("batch over bytes: got %v, want ErrBatchTooLarge", err)
	}
	mixed := [][]byte{[]byte("ok"), make([]byte, 2000)}
	if _, err := q.PublishBatch(ctx, mixed); !errors.Is(err, zkqueue.ErrTooLarge) {
		t.Errorf("batch with one oversized payload: got %v, want ErrTooLarge", err)
	}
	if _, err := q.PublishBatch(ctx, nil); !errors.Is(err, zkqueue.ErrEmptyBatch) {
		t.Errorf("empty batch: got %v, want ErrEmptyBatch", err)
	}
	if n, err := q.Len(ctx); err != nil || n != 1 {
		t.Fatalf("Len = %d, %v; want 1 (only the payload at the limit)", n, err)
	}
	if _, err := zkqueue.New(zktest.Conn(t), zktest.Root(t), zkqueue.WithMaxPayload(2<<20)); err == nil {
		t.Error("New with a 2 MiB payload limit: got nil error")
	}
	if _, err := zkqueue.New(zktest.Conn(t), "relative/path"); err == nil {
		t.Error("New with a relative path: got nil error")
	}
}

// A batch that ZooKeeper rejects half way writes nothing: the Multi is
// atomic.
func TestBatchAtomicOnServerError(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	path := zktest.Root(t) + "/q"
	q := newQueue(t, conn, path)
	// Make the queue node ephemeral-free but remove it under the queue's
	// feet: every create of the batch fails with NoNode.
	if err := conn.Delete(path, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := q.PublishBatch(ctx, [][]byte{[]byte("a"), []byte("b")}); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("batch into a deleted queue: got %v, want ErrNoNode", err)
	}
	if ok, _, _ := conn.Exists(path); ok {
		t.Fatal("queue node reappeared")
	}
}

func TestForeignChildSkipped(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	path := zktest.Root(t) + "/q"
	q := newQueue(t, conn, path)
	for _, name := range []string{"zz-foreign", "qn-notanumber", "lock"} {
		if _, err := conn.Create(path+"/"+name, []byte("?"), 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Publish(ctx, []byte("real")); err != nil {
		t.Fatal(err)
	}
	m, err := q.TryDequeue(ctx)
	if err != nil || string(m.Payload) != "real" {
		t.Fatalf("TryDequeue = %q, %v; want real", m.Payload, err)
	}
	if _, err := q.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("second TryDequeue: got %v, want ErrEmpty", err)
	}
	if n, err := q.Purge(ctx); n != 3 || err != nil {
		t.Errorf("Purge = %d, %v; want the 3 foreign nodes deleted", n, err)
	}
}

// A node with a message's name whose data does not decode (no header, as
// `create .../qn-0000000001 garbage` from any client makes; a header of
// another version; a truncated header) is never delivered, at most or at
// least once, nor peeked: it is skipped, reported once, and left for
// Purge to delete.
func TestUndecodableNodeNeverDelivered(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	var mu sync.Mutex
	var reported []string
	q := newQueue(t, conn, root+"/items", zkqueue.WithBadDataHook(func(znode string) {
		mu.Lock()
		reported = append(reported, znode)
		mu.Unlock()
	}))
	leases, err := zkqueue.NewLeases(q, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	bad := [][]byte{[]byte("garbage"), {0xCB, 0x51, 9, 0, 0}, {0xCB, 0x51, 1, 0x80}, nil}
	for _, data := range bad {
		if _, err := conn.Create(root+"/items/qn-", data, zk.FlagSequence, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"one", "two"} {
		if _, err := q.Publish(ctx, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := q.Peek(ctx); err != nil || string(m.Payload) != "one" {
		t.Fatalf("Peek = %q, %v; want one", m.Payload, err)
	}
	ls, err := leases.Take(ctx, 1, zkqueue.Room{}, time.Minute, false)
	if err != nil || len(ls) != 1 || string(ls[0].Payload) != "one" {
		t.Fatalf("leased Take = %v, %v; want one", ls, err)
	}
	ms, err := q.Take(ctx, 10, zkqueue.Room{}, false)
	if err != nil || len(ms) != 1 || string(ms[0].Payload) != "two" {
		t.Fatalf("Take = %v, %v; want two", ms, err)
	}
	for range 2 {
		if _, err := q.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
			t.Fatalf("TryDequeue: got %v, want ErrEmpty", err)
		}
	}
	mu.Lock()
	n := len(reported)
	mu.Unlock()
	if n != len(bad) {
		t.Errorf("reported %d bad nodes (%v), want %d, once each", n, reported, len(bad))
	}
	if k, err := q.Purge(ctx); k != len(bad) || err != nil {
		t.Fatalf("Purge = %d, %v; want %d", k, err, len(bad))
	}
	if k, _ := q.Len(ctx); k != 0 {
		t.Fatalf("%d nodes left after Purge", k)
	}
}
