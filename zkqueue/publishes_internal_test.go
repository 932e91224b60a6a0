package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
)

// settle waits for the publishes begun by its mark, not for those begun
// later, and not at all when none is under way.
func TestPublishesSettle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var p publishes
	if p.settle(ctx, p.mark()) {
		t.Fatal("settle waited with no publish under way")
	}
	first := p.begin()
	done := make(chan bool)
	go func() { done <- p.settle(ctx, p.mark()) }()
	zktest.WaitFor(t, 30*time.Second, "settle to wait", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.ended != nil })
	later := p.begin() // begun after settle: not waited for
	p.end(first)
	if waited := <-done; !waited {
		t.Error("settle reported no wait for a publish under way")
	}
	p.end(later)
	p.end(later) // again: nothing
	if p.openSince(p.mark()) {
		t.Error("a publish under way after every one ended")
	}

	// A publish that never ends holds a claim until ctx ends (the bound
	// is made too long to end it first).
	defer func(d time.Duration) { ownPublishWait = d }(ownPublishWait)
	ownPublishWait = time.Hour
	p.begin()
	claim, stop := context.WithCancel(ctx)
	go func() { done <- p.settle(claim, p.mark()) }()
	zktest.WaitFor(t, 30*time.Second, "settle to wait", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.ended != nil })
	stop()
	select {
	case waited := <-done:
		if !waited {
			t.Error("settle with a publish under way and an ended ctx: want true")
		}
	case <-ctx.Done():
		t.Fatal("settle went on waiting after its ctx ended")
	}
}

// A consumer's listing can show a message this process is publishing
// before the publish returns here (the children watch and the create's
// answer come on different sessions). Its claim waits for the publish and
// takes the data remembered then, without reading the message back.
func TestClaimWaitsForOwnPublish(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := zktest.Conn(t)
	var reads atomic.Int32
	countReads := func(op string, _ time.Duration, _ error) {
		if op == "get" || op == "multiread" {
			reads.Add(1)
		}
	}
	q, err := New(conn, zktest.Root(t)+"/items", WithPublisher("p"), WithObserver(countReads))
	if err != nil {
		t.Fatal(err)
	}
	// A process remembers what it publishes while it consumes.
	if _, err := q.TryDequeue(ctx); !errors.Is(err, ErrEmpty) {
		t.Fatalf("empty queue: got %v, want ErrEmpty", err)
	}
	// A publish whose create committed but whose answer has not come back.
	ticket := q.pubs.begin()
	k, err := q.prod.tail(0)
	if err != nil {
		t.Fatal(err)
	}
	sg := segment{0, k}
	data := EncodeData(Message{Payload: []byte("mine")})
	p, err := conn.Create(segmentPath(q.path, false, sg)+"/"+messagePrefix(false, sg, q.prod.publisherTag(), ""), data, zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		m   Message
		err error
	}
	got := make(chan result, 1)
	go func() {
		m, err := q.Dequeue(ctx)
		got <- result{m, err}
	}()
	zktest.WaitFor(t, 30*time.Second, "the claim to wait for the publish", func() bool {
		select {
		case r := <-got:
			t.Fatalf("claim returned (%q, %v) with %d reads before the publish was answered: want it to wait", r.m.Payload, r.err, reads.Load())
		default:
		}
		q.pubs.mu.Lock()
		defer q.pubs.mu.Unlock()
		return q.pubs.ended != nil
	})
	q.prod.remember([]string{p}, [][]byte{data})
	q.pubs.end(ticket)
	r := <-got
	if r.err != nil || string(r.m.Payload) != "mine" {
		t.Fatalf("claim: %q, %v; want mine", r.m.Payload, r.err)
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("claim read its own message back: %d read requests, want 0", n)
	}
}

// Reading ahead stops at a message of this process's own that it does not
// remember while a publish begun before the listing is under way (it may
// be that publish's), and goes on once that publish ended, however many
// publishes begun since are under way: the unremembered messages are then
// an earlier process's with the same tag, a backlog to read ahead.
func TestReadAheadOwnMessages(t *testing.T) {
	s := newReadGroup(&core{opt: options{publisher: PublisherTag("p")}}, newRecent(NewBudget(1<<20)), &publishes{})
	s.recent.taking(+1)
	own := func(seq int) Name {
		return mustName(t, fmt.Sprintf("qn-1-%s-%010d", PublisherTag("p"), seq))
	}
	other := mustName(t, fmt.Sprintf("qn-1-%s-%010d", PublisherTag("q"), 1))
	names := []Name{other, own(2), own(3)}

	before := s.pubs.begin() // under way when the listing was asked for
	listed := s.pubs.mark()
	if n := s.readAhead(names, listed); n != 1 {
		t.Fatalf("read ahead %d names with a publish from before the listing under way, want 1 (up to the own one)", n)
	}
	since := s.pubs.begin() // begun after the listing: cannot be in it
	s.pubs.end(before)
	if n := s.readAhead(names[1:], listed); n != 2 {
		t.Fatalf("read ahead %d of 2 own names not remembered, with only a later publish under way", n)
	}
	s.pubs.end(since)
	var queued []string
	for _, n := range s.ahead {
		queued = append(queued, n.Raw)
	}
	if want := []string{other.Raw, own(2).Raw, own(3).Raw}; !slices.Equal(queued, want) {
		t.Errorf("queued for reading ahead %v, want %v", queued, want)
	}
}

// A claim's read drops the candidates queued for reading ahead up to its
// own: claims take candidates in queue order, so a read ahead of those
// would find them claimed, or read what their claim reads anyway. The
// ones after it fill the claim's request, as before.
func TestClaimReadDropsReadsAheadBehindIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := New(zktest.Conn(t), zktest.Root(t)+"/items")
	if err != nil {
		t.Fatal(err)
	}
	var names []Name
	for i := range 5 {
		id, err := q.Publish(ctx, fmt.Appendf(nil, "m%d", i))
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, mustName(t, id))
	}
	q.recent.forget()   // published while nobody consumed here: not remembered
	q.recent.taking(+1) // a consumer now: what is read ahead is remembered
	if n := q.reads.readAhead(names, q.pubs.mark()); n != len(names) {
		t.Fatalf("queued %d of %d for reading ahead", n, len(names))
	}
	r := q.reads.read(itemPath(q.path, names[2]), names[2])
	if r.err != nil {
		t.Fatal(r.err)
	}
	if m, err := DecodeData(r.data); err != nil || string(m.Payload) != "m2" {
		t.Fatalf("read %s: %q, %v; want m2", names[2].Raw, m.Payload, err)
	}
	for i, n := range names {
		want := i > 2 // read ahead with the claim's read
		if got := q.recent.has(n.Raw); got != want {
			t.Errorf("%s (message %d) remembered %v after the claim read message 2, want %v", n.Raw, i, got, want)
		}
	}
	q.reads.mu.Lock()
	defer q.reads.mu.Unlock()
	if len(q.reads.ahead) != 0 || len(q.reads.aheadSet) != 0 {
		t.Errorf("still queued for reading ahead: %v (set %v)", q.reads.ahead, q.reads.aheadSet)
	}
}
