package zkqueue_test

import (
	"context"
	"fmt"
	"path"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// A consumer that did not publish a backlog reads it in multiRead
// requests (group read), and never a getData per message; a
// message claimed elsewhere between the read and the claim is a lost race,
// delivered once, by the other claimer.
func TestClaimRoundsReadInMultiRead(t *testing.T) {
	for _, leased := range []bool{false, true} {
		t.Run(fmt.Sprintf("leased=%v", leased), func(t *testing.T) {
			testClaimRounds(t, leased, true)
		})
	}
}

// Over a client without multiRead (the released go-zookeeper), the same
// claim rounds read a getData per message and deliver the same: each
// message once, a message claimed elsewhere by the other claimer only.
func TestClaimRoundsWithoutMultiRead(t *testing.T) {
	for _, leased := range []bool{false, true} {
		t.Run(fmt.Sprintf("leased=%v", leased), func(t *testing.T) {
			testClaimRounds(t, leased, false)
		})
	}
}

func testClaimRounds(t *testing.T, leased, multiRead bool) {
	ctx := context.Background()
	root := zktest.Root(t)
	const n, segment = 200, 60
	producer, err := zkqueue.New(zktest.Conn(t), root+"/items", zkqueue.WithSegmentSize(segment))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 50 {
		payloads := make([][]byte, 50)
		for j := range payloads {
			payloads[j] = fmt.Appendf(nil, "m%03d", i+j)
		}
		if _, err := producer.PublishBatch(ctx, payloads); err != nil {
			t.Fatal(err)
		}
	}

	// The first multiRead (without multiRead: the first getData) is
	// answered; before the round's claims run, another session takes one
	// of the messages read.
	other := zktest.Conn(t)
	var gets, multiReads atomic.Int64
	var stolen atomic.Value
	var once sync.Once
	observe := func(op string, _ time.Duration, err error) {
		switch {
		case op == "get" && err == nil:
			gets.Add(1)
			if !multiRead {
				once.Do(func() { stolen.Store(stealOne(t, other, root+"/items")) })
			}
		case op == "multiread" && err == nil:
			multiReads.Add(1)
			once.Do(func() { stolen.Store(stealOne(t, other, root+"/items")) })
		}
	}
	consumer, err := zkqueue.New(zktest.Conn(t), root+"/items", zkqueue.WithSegmentSize(segment), zkqueue.WithObserver(observe))
	if err != nil {
		t.Fatal(err)
	}
	if !multiRead {
		zkqueue.WithoutMultiRead(consumer)
	}
	take := func() ([]zkqueue.Message, error) {
		return consumer.Take(ctx, 40, zkqueue.Room{}, false)
	}
	if leased {
		leases, err := zkqueue.NewLeases(consumer, root+"/leases", root+"/dead")
		if err != nil {
			t.Fatal(err)
		}
		take = func() ([]zkqueue.Message, error) {
			ls, err := leases.Take(ctx, 40, zkqueue.Room{}, time.Minute, false)
			ms := make([]zkqueue.Message, len(ls))
			for i, l := range ls {
				if _, err := leases.AckUnread(ctx, l.Token); err != nil {
					t.Fatal(err)
				}
				ms[i] = l.Message
			}
			return ms, err
		}
	}
	got := map[string]int{}
	for {
		ms, err := take()
		if err != nil {
			break
		}
		for _, m := range ms {
			got[string(m.Payload)]++
		}
	}
	steal, _ := stolen.Load().(string)
	if steal == "" {
		t.Fatal("no read was made")
	}
	for i := range n {
		want := 1
		if fmt.Sprintf("m%03d", i) == steal {
			want = 0
		}
		if c := got[fmt.Sprintf("m%03d", i)]; c != want {
			t.Errorf("m%03d delivered %d times, want %d", i, c, want)
		}
	}
	if !multiRead {
		if mr := multiReads.Load(); mr != 0 {
			t.Errorf("%d multiRead requests without multiRead", mr)
		}
		t.Logf("%d messages: %d getData requests", n, gets.Load())
		return
	}
	// Rounds of at most 40 candidates over segments of 60 (a round never
	// spans segments): 7 rounds. In each, the first reads find a request
	// slot free and go alone (at most maxReadsInFlight, 2, at a time), the
	// others queue and share multiRead requests of at most 16 paths: some
	// 30 requests, however the claims' goroutines are scheduled, where
	// reads one by one make 200.
	if g, mr := gets.Load(), multiReads.Load(); g+mr > n/4 {
		t.Errorf("%d getData and %d multiRead requests for %d messages", g, mr, n)
	}
	t.Logf("%d messages: %d multiRead, %d getData requests", n, multiReads.Load(), gets.Load())
}

// stealOne claims the head message of the first segment under items from
// another session (read, then delete at its version) and returns its
// payload.
func stealOne(t *testing.T, conn *zk.Conn, items string) string {
	segs, _, err := conn.Children(items)
	if err != nil || len(segs) == 0 {
		t.Errorf("list %s: %v %v", items, segs, err)
		return ""
	}
	seg := path.Join(items, minString(segs))
	names, _, err := conn.Children(seg)
	if err != nil || len(names) == 0 {
		t.Errorf("list %s: %v %v", seg, names, err)
		return ""
	}
	p := path.Join(seg, minString(names))
	data, stat, err := conn.Get(p)
	if err != nil {
		t.Error(err)
		return ""
	}
	if err := conn.Delete(p, stat.Version); err != nil {
		t.Error(err)
		return ""
	}
	m, err := zkqueue.DecodeData(data)
	if err != nil {
		t.Error(err)
	}
	return string(m.Payload)
}

func minString(ss []string) string {
	m := ss[0]
	for _, s := range ss[1:] {
		m = min(m, s)
	}
	return m
}

// A claim round of the largest messages is read in multiRead answers the
// session accepts: the connection survives, every message is delivered.
func TestClaimRoundOfLargestMessages(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	opts := []zkqueue.Option{zkqueue.WithMaxPayload(zkqueue.HardMaxPayload), zkqueue.WithMaxBatchBytes(zkqueue.HardMaxPayload)}
	producer, err := zkqueue.New(zktest.Conn(t), root+"/items", opts...)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		payload := make([]byte, zkqueue.HardMaxPayload)
		payload[0] = byte(i)
		if _, err := producer.Publish(ctx, payload); err != nil {
			t.Fatal(err)
		}
	}
	var multiReads atomic.Int64
	consumer, err := zkqueue.New(zktest.Conn(t), root+"/items", append(opts, zkqueue.WithObserver(func(op string, _ time.Duration, err error) {
		if op == "multiread" {
			if err != nil {
				t.Errorf("multiRead: %v", err)
			}
			multiReads.Add(1)
		}
	}))...)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := consumer.Take(ctx, n, zkqueue.Room{}, false)
	if err != nil || len(ms) != n {
		t.Fatalf("Take = %d messages, %v; want %d", len(ms), err, n)
	}
	for i, m := range ms {
		if len(m.Payload) != zkqueue.HardMaxPayload || m.Payload[0] != byte(i) {
			t.Fatalf("message %d: %d bytes, first %d", i, len(m.Payload), m.Payload[0])
		}
	}
	if multiReads.Load() < 1 {
		t.Errorf("%d multiRead requests for %d messages of %d bytes", multiReads.Load(), n, zkqueue.HardMaxPayload)
	}
}

// Consumers taking one message at a time from one Queue share read
// requests too: their concurrent reads queue behind the requests in
// flight and go together.
func TestSingleTakesShareReads(t *testing.T) { testSingleTakes(t, true) }

// Without multiRead, consumers taking one message at a time read a
// getData each, and each message is delivered once.
func TestSingleTakesWithoutMultiRead(t *testing.T) { testSingleTakes(t, false) }

func testSingleTakes(t *testing.T, multiRead bool) {
	ctx := context.Background()
	root := zktest.Root(t)
	producer, err := zkqueue.New(zktest.Conn(t), root+"/items")
	if err != nil {
		t.Fatal(err)
	}
	const n, consumers = 2000, 16
	for i := 0; i < n; i += 100 {
		payloads := make([][]byte, 100)
		for j := range payloads {
			payloads[j] = fmt.Appendf(nil, "m%04d", i+j)
		}
		if _, err := producer.PublishBatch(ctx, payloads); err != nil {
			t.Fatal(err)
		}
	}
	var requests, multiReads atomic.Int64
	consumer, err := zkqueue.New(zktest.Conn(t), root+"/items", zkqueue.WithObserver(func(op string, _ time.Duration, err error) {
		if op == "get" || op == "multiread" {
			requests.Add(1)
		}
		if op == "multiread" {
			multiReads.Add(1)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !multiRead {
		zkqueue.WithoutMultiRead(consumer)
	}
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	for range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				m, err := consumer.TryDequeue(ctx)
				if err != nil {
					return
				}
				mu.Lock()
				got[string(m.Payload)]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for i := range n {
		if c := got[fmt.Sprintf("m%04d", i)]; c != 1 {
			t.Fatalf("m%04d delivered %d times", i, c)
		}
	}
	if !multiRead {
		if mr := multiReads.Load(); mr != 0 {
			t.Errorf("%d multiRead requests without multiRead", mr)
		}
		t.Logf("%d getData requests for %d messages", requests.Load(), n)
		return
	}
	if r := requests.Load(); r > n*3/4 {
		t.Errorf("%d read requests for %d messages taken one at a time by %d consumers", r, n, consumers)
	}
	t.Logf("%d read requests for %d messages", requests.Load(), n)
}
