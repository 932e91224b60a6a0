package zkqueue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// WaitUnheld returns only once no lease can be acked: not while one is
// live, at once when it is acked or settled by a delayed nack, and by
// itself once a lease's deadline passed.
func TestWaitUnheld(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	items, err := zkqueue.New(conn, root+"/items")
	if err != nil {
		t.Fatal(err)
	}
	leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	if err := leases.WaitUnheld(ctx, zkqueue.Policy{}, nil); err != nil {
		t.Fatalf("WaitUnheld without leases: %v", err)
	}
	for range 3 {
		if _, err := items.Publish(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := leases.Take(ctx, 2, zkqueue.Room{}, time.Minute, false)
	if err != nil || len(ls) != 2 {
		t.Fatalf("Take: %v, %v", ls, err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := leases.WaitUnheld(short, zkqueue.Policy{}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitUnheld with live leases: %v, want the context's deadline", err)
	}

	done := make(chan error, 1)
	go func() { done <- leases.WaitUnheld(ctx, zkqueue.Policy{}, nil) }()
	if _, err := leases.Ack(ctx, ls[0].Token); err != nil {
		t.Fatal(err)
	}
	if _, _, err := leases.Nack(ctx, ls[1].Token, time.Hour, zkqueue.Policy{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitUnheld: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("WaitUnheld did not return once the leases were acked and nacked")
	}

	// A lease nobody settles: WaitUnheld returns after its deadline, the
	// message back in the queue.
	ls, err = leases.Take(ctx, 1, zkqueue.Room{}, time.Second, false)
	if err != nil || len(ls) != 1 {
		t.Fatalf("Take: %v, %v", ls, err)
	}
	var back []string
	if err := leases.WaitUnheld(ctx, zkqueue.Policy{}, func(m zkqueue.Message, out zkqueue.Outcome) {
		if out == zkqueue.Requeued {
			back = append(back, m.ID)
		}
	}); err != nil {
		t.Fatalf("WaitUnheld: %v", err)
	}
	if len(back) != 1 || back[0] != ls[0].ID {
		t.Fatalf("requeued %v, want %s", back, ls[0].ID)
	}
	if now := time.Now(); now.Before(ls[0].Deadline) {
		t.Fatalf("WaitUnheld returned at %v, before the lease's deadline %v", now, ls[0].Deadline)
	}
	if _, err := leases.Ack(ctx, ls[0].Token); !errors.Is(err, zkqueue.ErrUnknownLease) {
		t.Fatalf("Ack after WaitUnheld: %v, want ErrUnknownLease", err)
	}
	again, err := leases.Take(ctx, 1, zkqueue.Room{}, time.Minute, false)
	if err != nil || len(again) != 1 || again[0].ID != ls[0].ID || again[0].Deliveries != 2 {
		t.Fatalf("Take after WaitUnheld: %+v, %v; want %s delivered a second time", again, err, ls[0].ID)
	}
}

// The option is stored in the spec, refused on sync queues, and gives
// the queue its election's node.
func TestSingleActiveSpec(t *testing.T) {
	s := zkqueue.Spec{Kind: zkqueue.KindFIFO, SingleActive: true}
	data, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := zkqueue.DecodeSpec(data)
	if err != nil || !got.SingleActive {
		t.Fatalf("decoded %+v, %v; want SingleActive", got, err)
	}
	if err := (zkqueue.Spec{Kind: zkqueue.KindSync, SyncMembers: 2, SingleActive: true}).Validate(); !errors.Is(err, zkqueue.ErrBadSpec) {
		t.Fatalf("single active sync queue: %v, want ErrBadSpec", err)
	}
	ctx := context.Background()
	conn := zktest.Conn(t)
	c, err := zkqueue.NewCatalog(conn, zktest.Root(t), zkqueue.CatalogConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, "one", s); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, "plain", zkqueue.Spec{Kind: zkqueue.KindFIFO}); err != nil {
		t.Fatal(err)
	}
	h, err := c.Open("one", zkqueue.OpenConfig{ProcessID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if ok, _, err := conn.Exists(h.Active); h.Active == "" || !ok || err != nil {
		t.Fatalf("Active %q: exists %v, %v", h.Active, ok, err)
	}
	p, err := c.Open("plain", zkqueue.OpenConfig{ProcessID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Active != "" {
		t.Fatalf("a plain queue's Active is %q, want none", p.Active)
	}
	if err := c.Delete(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := conn.Exists(h.Path); ok {
		t.Fatalf("%s left after Delete", h.Path)
	}
}
