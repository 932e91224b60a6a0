package priority_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/priority"
	"github.com/qbroker/qbroker/zkqueue"
)

func newQueue(t *testing.T, conn *zk.Conn, path string, opts ...priority.Option) *priority.Queue {
	t.Helper()
	q, err := priority.New(conn, path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func parse(t *testing.T, id string) zkqueue.Name {
	t.Helper()
	n, ok := zkqueue.ParseName(id)
	if !ok {
		t.Fatalf("message id %q does not parse", id)
	}
	return n
}

// delivery is one successful Dequeue: when the call started and returned.
type delivery struct {
	consumer   int
	id         string
	name       zkqueue.Name
	start, end time.Time
}

// publishRandom publishes perProducer messages at random priorities from
// each of producers sessions, mixing single publishes and atomic batches of
// 5. It returns, per message id, when its Publish returned.
func publishRandom(ctx context.Context, t *testing.T, path string, producers, perProducer int, seed uint64) (map[string]time.Time, error) {
	t.Helper()
	var mu sync.Mutex
	pub := make(map[string]time.Time, producers*perProducer)
	var wg sync.WaitGroup
	errc := make(chan error, producers)
	for p := 0; p < producers; p++ {
		q := newQueue(t, zktest.Conn(t), path)
		rng := rand.New(rand.NewPCG(seed, uint64(p)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perProducer; {
				if i%20 == 0 && i+5 <= perProducer {
					items := make([]priority.Item, 5)
					for j := range items {
						items[j] = priority.Item{Priority: rng.IntN(priority.MaxPriority + 1), Payload: []byte(fmt.Sprintf("%d:%d", p, i+j))}
					}
					ids, err := q.PublishBatch(ctx, items)
					if err != nil {
						errc <- err
						return
					}
					now := time.Now()
					mu.Lock()
					for _, id := range ids {
						pub[id] = now
					}
					mu.Unlock()
					i += 5
					continue
				}
				id, err := q.Publish(ctx, rng.IntN(priority.MaxPriority+1), []byte(fmt.Sprintf("%d:%d", p, i)))
				if err != nil {
					errc <- err
					return
				}
				now := time.Now()
				mu.Lock()
				pub[id] = now
				mu.Unlock()
				i++
			}
		}()
	}
	wg.Wait()
	close(errc)
	return pub, <-errc
}

// consumerQueues opens n queues at path, each on its own session.
func consumerQueues(t *testing.T, path string, n int) []*priority.Queue {
	t.Helper()
	qs := make([]*priority.Queue, n)
	for i := range qs {
		qs[i] = newQueue(t, zktest.Conn(t), path)
	}
	return qs
}

// drain runs one consumer per queue until total messages were delivered,
// and returns every consumer's deliveries in its order.
func drain(ctx context.Context, qs []*priority.Queue, total int) ([][]delivery, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([][]delivery, len(qs))
	var mu sync.Mutex
	received := 0
	var wg sync.WaitGroup
	errc := make(chan error, len(qs))
	for c, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				start := time.Now()
				m, err := q.Dequeue(ctx)
				end := time.Now()
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						errc <- err
					}
					return
				}
				n, ok := zkqueue.ParseName(m.ID)
				if !ok || n.Priority != m.Priority {
					errc <- fmt.Errorf("message %s: priority %d does not match its name", m.ID, m.Priority)
					return
				}
				out[c] = append(out[c], delivery{consumer: c, id: m.ID, name: n, start: start, end: end})
				mu.Lock()
				received++
				if received == total {
					cancel()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errc)
	return out, <-errc
}

// checkExactlyOnce checks that the deliveries are exactly the published
// messages, each once, and returns, per id, when the Dequeue that delivered
// it started.
func checkExactlyOnce(t *testing.T, pub map[string]time.Time, out [][]delivery) map[string]time.Time {
	t.Helper()
	taken := make(map[string]time.Time, len(pub))
	for _, ds := range out {
		for _, d := range ds {
			if _, dup := taken[d.id]; dup {
				t.Errorf("%s delivered twice", d.id)
			}
			if _, ok := pub[d.id]; !ok {
				t.Errorf("%s delivered but never published", d.id)
			}
			taken[d.id] = d.start
		}
	}
	if len(taken) != len(pub) {
		t.Errorf("delivered %d distinct messages, want %d", len(taken), len(pub))
	}
	return taken
}

// Everything is published first, then four consumers with their own
// sessions drain the queue: each consumer's deliveries are strictly
// increasing in (priority, sequence). Anything else would be a consumer
// skipping a more urgent message that was in the queue all along.
func TestDrainAfterPublishIsOrdered(t *testing.T) {
	const producers, consumers, perProducer = 4, 4, 250
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	path := zktest.Root(t) + "/q"
	newQueue(t, zktest.Conn(t), path)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	pub, err := publishRandom(ctx, t, path, producers, perProducer, seed)
	if err != nil {
		t.Fatal(err)
	}
	out, err := drain(ctx, consumerQueues(t, path, consumers), len(pub))
	if err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, pub, out)
	for c, ds := range out {
		t.Logf("consumer %d delivered %d", c, len(ds))
		for k := 1; k < len(ds); k++ {
			if zkqueue.Compare(ds[k-1].name, ds[k].name) >= 0 {
				t.Errorf("consumer %d: delivered %s after %s", c, ds[k].id, ds[k-1].id)
			}
		}
	}
}

// Four producers publish while four consumers drain, each with its own
// session. A consumer may deliver a message less urgent than one published
// a moment before (the in-flight window), but never one less urgent than a
// message that was published before its previous Dequeue started and was
// still queued when this one returned: that would be a stale snapshot.
func TestConcurrentPublishDrainOrder(t *testing.T) {
	const producers, consumers, perProducer = 4, 4, 250
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	path := zktest.Root(t) + "/q"
	newQueue(t, zktest.Conn(t), path)
	// A bound against a hang, not a speed target: the drain takes about
	// 20 s under -race on 2 idle cores and over 45 s beside a full test run.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	type result struct {
		out [][]delivery
		err error
	}
	drained := make(chan result, 1)
	qs := consumerQueues(t, path, consumers)
	go func() {
		out, err := drain(ctx, qs, producers*perProducer)
		drained <- result{out, err}
	}()
	pub, err := publishRandom(ctx, t, path, producers, perProducer, seed)
	if err != nil {
		cancel()
		<-drained
		t.Fatal(err)
	}
	r := <-drained
	if r.err != nil {
		t.Fatal(r.err)
	}
	taken := checkExactlyOnce(t, pub, r.out)
	names := make(map[string]zkqueue.Name, len(pub))
	for id := range pub {
		names[id] = parse(t, id)
	}

	violations, window, decreases := 0, 0, 0
	for c, ds := range r.out {
		for k := 1; k < len(ds); k++ {
			b := ds[k]
			if zkqueue.Compare(ds[k-1].name, b.name) > 0 {
				decreases++
			}
			for id, at := range pub {
				if zkqueue.Compare(names[id], b.name) >= 0 || !taken[id].After(b.end) {
					continue
				}
				// id is more urgent than b and was still queued when b
				// was delivered.
				if at.Before(ds[k-1].start) {
					violations++
					if violations <= 10 {
						t.Errorf("consumer %d delivered %s while %s, published before its previous Dequeue started, was still queued", c, b.id, id)
					}
				} else if at.Before(b.start) {
					window++
				}
			}
		}
	}
	t.Logf("%d deliveries less urgent than the consumer's previous one; %d (delivery, queued more urgent message) pairs inside the in-flight window; %d violations",
		decreases, window, violations)
}

// A backlog of 200 messages at priority 100: one published at priority 0
// is delivered next by a single consumer, and within the in-flight window
// (at most one delivery per consumer) when four consumers share a Queue.
func TestUrgentOvertakesBacklog(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Run("one consumer", func(t *testing.T) { urgentNextForOneConsumer(ctx, t) })
	t.Run("four local consumers", func(t *testing.T) { urgentWithinWindowForFourConsumers(ctx, t) })
}

// publishBacklog publishes 200 messages at priority 100 in one batch.
func publishBacklog(ctx context.Context, t *testing.T, q *priority.Queue) {
	t.Helper()
	items := make([]priority.Item, 200)
	for i := range items {
		items[i] = priority.Item{Priority: 100, Payload: []byte(strconv.Itoa(i))}
	}
	if _, err := q.PublishBatch(ctx, items); err != nil {
		t.Fatal(err)
	}
}

// urgentNextForOneConsumer: five times, after five backlog messages, an
// urgent one is published and is the next one delivered.
func urgentNextForOneConsumer(ctx context.Context, t *testing.T) {
	path := zktest.Root(t) + "/q"
	producer := newQueue(t, zktest.Conn(t), path)
	consumer := newQueue(t, zktest.Conn(t), path)
	publishBacklog(ctx, t, producer)
	for round := 0; round < 5; round++ {
		for i := 0; i < 5; i++ {
			m, err := consumer.Dequeue(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if m.Priority != 100 {
				t.Fatalf("round %d: got priority %d, want 100", round, m.Priority)
			}
		}
		id, err := producer.Publish(ctx, 0, []byte("urgent"))
		if err != nil {
			t.Fatal(err)
		}
		m, err := consumer.Dequeue(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.ID != id {
			t.Fatalf("round %d: delivered %s (priority %d) after the urgent %s was published", round, m.ID, m.Priority, id)
		}
	}
}

// deliveryLog records the deliveries of consumers sharing one Queue and
// signals each on delivered.
type deliveryLog struct {
	mu        sync.Mutex
	all       []delivery
	delivered chan struct{}
	wg        sync.WaitGroup
}

// consume dequeues as consumer c until ctx is done.
func (l *deliveryLog) consume(ctx context.Context, q *priority.Queue, c int) {
	defer l.wg.Done()
	for {
		start := time.Now()
		m, err := q.Dequeue(ctx)
		end := time.Now()
		if err != nil {
			return
		}
		l.mu.Lock()
		l.all = append(l.all, delivery{consumer: c, id: m.ID, start: start, end: end})
		l.mu.Unlock()
		l.delivered <- struct{}{}
	}
}

// find returns the delivery of message id, or nil.
func (l *deliveryLog) find(id string) *delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	var u *delivery
	for i := range l.all {
		if l.all[i].id == id {
			d := l.all[i]
			u = &d
		}
	}
	return u
}

// urgentWithinWindowForFourConsumers: with four consumers sharing a Queue,
// each delivers at most one less urgent message between the urgent one's
// publication and the start of the Dequeue that took it.
func urgentWithinWindowForFourConsumers(ctx context.Context, t *testing.T) {
	const consumers = 4
	path := zktest.Root(t) + "/q"
	producer := newQueue(t, zktest.Conn(t), path)
	shared := newQueue(t, zktest.Conn(t), path)
	publishBacklog(ctx, t, producer)

	cctx, stop := context.WithCancel(ctx)
	defer stop()
	rec := &deliveryLog{delivered: make(chan struct{}, 1000)}
	for c := 0; c < consumers; c++ {
		rec.wg.Add(1)
		go rec.consume(cctx, shared, c)
	}
	for i := 0; i < 20; i++ {
		<-rec.delivered
	}
	urgent, err := producer.Publish(ctx, 0, []byte("urgent"))
	published := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	var u *delivery
	for u == nil {
		select {
		case <-rec.delivered:
		case <-ctx.Done():
			t.Fatal("urgent message never delivered")
		}
		u = rec.find(urgent)
	}
	stop()
	rec.wg.Wait()
	checkOvertakenAtMostOnce(t, rec.all, consumers, urgent, published, u.start)
}

// checkOvertakenAtMostOnce counts, per consumer, the deliveries other than
// urgent that started after it was published and were over before the
// Dequeue that took it had started (at taken): at most one each.
func checkOvertakenAtMostOnce(t *testing.T, all []delivery, consumers int, urgent string, published, taken time.Time) {
	t.Helper()
	before := make([]int, consumers)
	total := 0
	for _, d := range all {
		if d.id != urgent && d.start.After(published) && d.end.Before(taken) {
			before[d.consumer]++
			total++
		}
	}
	t.Logf("%d deliveries in all; %d less urgent ones clearly overtook the urgent message (per consumer %v)", len(all), total, before)
	for c, n := range before {
		if n > 1 {
			t.Errorf("consumer %d delivered %d less urgent messages after the urgent one was published, want at most 1", c, n)
		}
	}
	if len(all) >= 200 {
		t.Error("the backlog was drained: the test did not exercise overtaking")
	}
}

func TestBadPriorityWritesNothing(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	path := zktest.Root(t) + "/q"
	q := newQueue(t, conn, path, priority.WithMaxPayload(1024))

	for _, p := range []int{-1, priority.MaxPriority + 1, 1000} {
		if _, err := q.Publish(ctx, p, []byte("x")); !errors.Is(err, priority.ErrBadPriority) || !errors.Is(err, zkqueue.ErrBadPriority) {
			t.Errorf("Publish at priority %d: got %v, want ErrBadPriority", p, err)
		}
	}
	bad := []priority.Item{{Priority: 1, Payload: []byte("ok")}, {Priority: 256, Payload: []byte("bad")}}
	if _, err := q.PublishBatch(ctx, bad); !errors.Is(err, priority.ErrBadPriority) {
		t.Errorf("batch with priority 256: got %v, want ErrBadPriority", err)
	}
	big := []priority.Item{{Priority: 1, Payload: []byte("ok")}, {Priority: 2, Payload: make([]byte, 1025)}}
	if _, err := q.PublishBatch(ctx, big); !errors.Is(err, priority.ErrTooLarge) {
		t.Errorf("batch with an oversized payload: got %v, want ErrTooLarge", err)
	}
	if _, err := q.PublishBatch(ctx, nil); !errors.Is(err, priority.ErrEmptyBatch) {
		t.Errorf("empty batch: got %v, want ErrEmptyBatch", err)
	}
	children, _, err := conn.Children(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(children) != 0 {
		t.Fatalf("rejected publishes wrote %v", children)
	}
	// The bounds themselves are valid.
	for _, p := range []int{priority.MinPriority, priority.MaxPriority} {
		if _, err := q.Publish(ctx, p, nil); err != nil {
			t.Errorf("Publish at priority %d: %v", p, err)
		}
	}
}

// Within one priority, messages come out in publish order, interleaved
// with other priorities in any pattern; Peek, Len and Purge agree.
func TestFIFOWithinPriority(t *testing.T) {
	ctx := context.Background()
	q := newQueue(t, zktest.Conn(t), zktest.Root(t)+"/q")
	if _, err := q.TryDequeue(ctx); !errors.Is(err, priority.ErrEmpty) || !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("TryDequeue on empty queue: got %v, want ErrEmpty", err)
	}
	if _, err := q.Peek(ctx); !errors.Is(err, priority.ErrEmpty) {
		t.Fatalf("Peek on empty queue: got %v, want ErrEmpty", err)
	}
	prios := []int{7, 3, 7, 200, 3, 3, 0, 7, 200, 0, 3, 7}
	counter := map[int]int{}
	var want []string
	for i, p := range prios {
		payload := fmt.Sprintf("%d/%d", p, counter[p])
		counter[p]++
		if i%4 == 0 {
			if _, err := q.PublishBatch(ctx, []priority.Item{{Priority: p, Payload: []byte(payload)}}); err != nil {
				t.Fatal(err)
			}
		} else if _, err := q.Publish(ctx, p, []byte(payload)); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []int{0, 3, 7, 200} {
		for i := 0; i < counter[p]; i++ {
			want = append(want, fmt.Sprintf("%d/%d", p, i))
		}
	}
	if n, err := q.Len(ctx); err != nil || n != len(prios) {
		t.Fatalf("Len = %d, %v; want %d", n, err, len(prios))
	}
	if m, err := q.Peek(ctx); err != nil || string(m.Payload) != "0/0" || m.Priority != 0 {
		t.Fatalf("Peek = %+v, %v; want 0/0", m, err)
	}
	for i := 0; i < 8; i++ {
		m, err := q.TryDequeue(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(m.Payload); got != want[i] {
			t.Fatalf("delivery %d: got %q, want %q", i, got, want[i])
		}
		if m.Deliveries != 1 || time.Since(m.Published) > time.Minute {
			t.Errorf("message %s: deliveries %d, published %v", m.ID, m.Deliveries, m.Published)
		}
	}
	if n, err := q.Purge(ctx); err != nil || n != len(prios)-8 {
		t.Fatalf("Purge = %d, %v; want %d", n, err, len(prios)-8)
	}
	if n, err := q.Len(ctx); err != nil || n != 0 {
		t.Fatalf("Len after purge = %d, %v; want 0", n, err)
	}
}

func TestDequeueWaitsAndCancels(t *testing.T) {
	path := zktest.Root(t) + "/q"
	consumer, producer := newQueue(t, zktest.Conn(t), path), newQueue(t, zktest.Conn(t), path)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A Dequeue waiting on an empty priority queue wakes for a publish of
	// any priority and returns it with that priority.
	type result struct {
		m   priority.Message
		err error
	}
	res := make(chan result, 1)
	go func() {
		m, err := consumer.Dequeue(ctx)
		res <- result{m, err}
	}()
	time.Sleep(100 * time.Millisecond) // let it block on the watch; correct either way
	if _, err := producer.Publish(ctx, 42, []byte("wake")); err != nil {
		t.Fatal(err)
	}
	if r := <-res; r.err != nil || string(r.m.Payload) != "wake" || r.m.Priority != 42 {
		t.Fatalf("woken Dequeue = %q at %d, %v; want wake at 42", r.m.Payload, r.m.Priority, r.err)
	}

	ignore := goleak.IgnoreCurrent()
	for i := 0; i < 10; i++ {
		cctx, ccancel := context.WithCancel(ctx)
		go func() {
			time.Sleep(5 * time.Millisecond)
			ccancel()
		}()
		if _, err := consumer.Dequeue(cctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Dequeue returned %v, want context.Canceled", err)
		}
	}
	goleak.VerifyNone(t, ignore)
}
