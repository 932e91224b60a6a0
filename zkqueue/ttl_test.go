package zkqueue_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// A claim that reads an expired message removes it (dead-lettered and
// counted) instead of delivering it, and moves on to the next message;
// nothing else runs (no RunExpiry).
func TestExpiredAtClaim(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	const ttl = 300 * time.Millisecond
	items := newQueue(t, conn, root+"/items", zkqueue.WithExpiry(zkqueue.Expiry{TTL: ttl, Dead: root + "/dead", Counter: root + "/expired"}))
	leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Create(root+"/expired", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	old, err := items.Publish(ctx, []byte("old"))
	if err != nil {
		t.Fatal(err)
	}
	published := time.Now()
	for time.Since(published) <= ttl {
		time.Sleep(10 * time.Millisecond) // let the first message outlive its TTL
	}
	if _, err := items.Publish(ctx, []byte("fresh")); err != nil {
		t.Fatal(err)
	}
	freshAt := time.Now()
	ls, err := leases.Take(ctx, 1, zkqueue.Room{}, time.Minute, false)
	if time.Since(freshAt) >= ttl {
		t.Skip("the machine is too slow to claim within the TTL")
	}
	if err != nil || len(ls) != 1 || string(ls[0].Payload) != "fresh" {
		t.Fatalf("Take: %v, %v; want the fresh message", ls, err)
	}
	dead, err := leases.DeadLetters(ctx, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != old || string(dead[0].Payload) != "old" {
		t.Fatalf("dead letters: %v, %v; want the expired message", dead, err)
	}
	_, stat, err := conn.Get(root + "/expired")
	if err != nil || stat.Version != 1 {
		t.Fatalf("expired counter: version %v, %v; want 1", stat, err)
	}
	// At most once, too: an expired head is not delivered.
	if _, err := items.Publish(ctx, []byte("later")); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); time.Since(start) <= ttl; {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := items.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Fatalf("TryDequeue of an expired message: %v, want ErrEmpty", err)
	}
	// A redriven message's TTL starts again.
	if n, err := leases.Redrive(ctx, nil); err != nil || n != 2 {
		t.Fatalf("Redrive: %d, %v; want 2", n, err)
	}
	m, err := items.TryDequeue(ctx)
	if err != nil || m.Ready.IsZero() {
		t.Fatalf("after redrive: %v, %v; want a message with its Ready time", m, err)
	}
}

// ExpireHeads removes expired heads of every level and reports when the
// next one expires.
func TestExpireHeadsPriorityLevels(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	const ttl = time.Second
	var expired int
	items := newQueue(t, conn, root+"/items", zkqueue.WithPriorities(),
		zkqueue.WithExpiry(zkqueue.Expiry{TTL: ttl, Hook: func(n int) { expired += n }}))
	for _, p := range []int{0, 5, 9} {
		if _, err := items.PublishPriority(ctx, p, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for time.Since(start) <= ttl {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := items.PublishPriority(ctx, 5, []byte("fresh")); err != nil {
		t.Fatal(err)
	}
	freshAt := time.Now()
	n, next, err := items.ExpireHeads(ctx)
	if time.Since(freshAt) >= ttl {
		t.Skip("the machine is too slow to check within the TTL")
	}
	if err != nil || n != 3 || expired != 3 {
		t.Fatalf("ExpireHeads: %d (hook %d), %v; want 3", n, expired, err)
	}
	if next.IsZero() {
		t.Fatal("no next expiry with a fresh message left")
	}
	if l, err := items.Len(ctx); err != nil || l != 1 {
		t.Fatalf("Len %d, %v; want 1", l, err)
	}
}

// Ready is stored as a tagged field: with attributes or without, round
// trip; a message without it stays version 1.
func TestReadyEncoding(t *testing.T) {
	pub := time.Unix(100, 5)
	ready := time.Unix(200, 7)
	for _, m := range []zkqueue.Message{
		{Payload: []byte("p"), Published: pub, Ready: ready},
		{Payload: []byte("p"), Published: pub, Ready: ready, Attributes: zkqueue.Attributes{ContentType: "text/plain", Headers: map[string]string{"k": "v"}}},
	} {
		got, err := zkqueue.DecodeData(zkqueue.EncodeData(m))
		if err != nil {
			t.Fatal(err)
		}
		if !got.Ready.Equal(ready) || !got.Published.Equal(pub) || string(got.Payload) != "p" || got.ContentType != m.ContentType || got.Headers["k"] != m.Headers["k"] {
			t.Fatalf("got %+v, want %+v", got, m)
		}
	}
	if d := zkqueue.EncodeData(zkqueue.Message{Payload: []byte("p"), Published: pub}); d[2] != 1 {
		t.Fatalf("a plain message is version %d, want 1", d[2])
	}
	if at := zkqueue.ExpiresAt(zkqueue.Message{Published: pub, Ready: ready}, time.Second); !at.Equal(ready.Add(time.Second)) {
		t.Fatalf("ExpiresAt %v, want from Ready", at)
	}
}

// A spec's TTL is bounded and stored.
func TestSpecMessageTTL(t *testing.T) {
	for _, tc := range []struct {
		ttl    time.Duration
		toDead bool
		ok     bool
	}{
		{0, false, true}, {time.Second, true, true}, {zkqueue.MaxMessageTTL, false, true},
		{time.Millisecond, false, false}, {zkqueue.MaxMessageTTL + time.Second, false, false},
		{-time.Second, false, false}, {0, true, false},
	} {
		s := zkqueue.Spec{Kind: zkqueue.KindFIFO, MessageTTL: tc.ttl, ExpireToDeadLetter: tc.toDead}
		if err := s.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(ttl %v, to dead %v): %v, want ok %v", tc.ttl, tc.toDead, err, tc.ok)
		}
		if !tc.ok {
			continue
		}
		data, err := s.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := zkqueue.DecodeSpec(data)
		if !reflect.DeepEqual(err, nil) || !reflect.DeepEqual(got, s) {
			t.Errorf("round trip: %+v, %v; want %+v", got, err, s)
		}
	}
}

// A queue opened with its catalog's expiry settings counts and
// dead-letters its expired messages where the catalog laid them out, and
// ExpiredCount reads the count any process sees; a queue without a TTL
// gets none and counts 0.
func TestCatalogExpiry(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	c := newCatalog(t, conn, zkqueue.CatalogConfig{})
	const ttl = time.Second
	s := fifo(time.Minute)
	s.MessageTTL, s.ExpireToDeadLetter = ttl, true
	mustCreate(t, c, "ttl", s)
	if e := c.Expiry("plain", fifo(time.Minute)); e.TTL != 0 || e.Counter != "" || e.Dead != "" {
		t.Fatalf("Expiry without a TTL: %+v, want none", e)
	}
	e := c.Expiry("ttl", s)
	if e.TTL != ttl || e.Counter == "" || e.Dead == "" {
		t.Fatalf("Expiry: %+v, want the TTL, a counter and a dead letters' parent", e)
	}
	p := c.Path("ttl")
	items := newQueue(t, conn, p+"/items", zkqueue.WithoutCreate(), zkqueue.WithExpiry(e))
	other := newQueue(t, zktest.Conn(t), p+"/items", zkqueue.WithoutCreate(), zkqueue.WithExpiry(e))
	leases, err := zkqueue.NewLeases(items, p+"/leases", p+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	id, err := items.Publish(ctx, []byte("old"))
	if err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "the message to expire", func() bool {
		n, _, err := items.ExpireHeads(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	for _, q := range []*zkqueue.Queue{items, other} {
		if n, err := q.ExpiredCount(ctx); err != nil || n != 1 {
			t.Fatalf("ExpiredCount: %d, %v; want 1", n, err)
		}
	}
	dead, err := leases.DeadLetters(ctx, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != id {
		t.Fatalf("dead letters: %v, %v; want the expired message", dead, err)
	}
	plain := newQueue(t, conn, zktest.Root(t)+"/plain")
	if n, err := plain.ExpiredCount(ctx); err != nil || n != 0 {
		t.Fatalf("ExpiredCount without a TTL: %d, %v; want 0", n, err)
	}
}
