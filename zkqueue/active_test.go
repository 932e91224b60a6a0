package zkqueue_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// Revoke makes every live delivery impossible to settle at once, long
// before its deadline: plain leases and a pack lease's unsettled
// messages go back to their places in the queue, a delayed nack stays
// until its delay, and the revoked tokens' acks are refused.
func TestRevoke(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts []zkqueue.Option
	}{{"plain", nil}, {"packed", []zkqueue.Option{packed()}}} {
		t.Run(tc.name, func(t *testing.T) {
			root := zktest.Root(t)
			conn := zktest.Conn(t)
			items := newQueue(t, conn, root+"/items", tc.opts...)
			leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
			if err != nil {
				t.Fatal(err)
			}
			if err := leases.Revoke(ctx, zkqueue.Policy{}, nil); err != nil {
				t.Fatalf("Revoke without leases: %v", err)
			}
			if _, err := items.PublishBatch(ctx, [][]byte{[]byte("m0"), []byte("m1"), []byte("m2"), []byte("m3")}); err != nil {
				t.Fatal(err)
			}
			ls, err := leases.Take(ctx, 4, zkqueue.Room{}, time.Hour, false)
			if err != nil || len(ls) != 4 {
				t.Fatalf("Take: %v, %v", ls, err)
			}
			if _, err := leases.Ack(ctx, ls[0].Token); err != nil {
				t.Fatal(err)
			}
			if _, _, err := leases.Nack(ctx, ls[3].Token, time.Hour, zkqueue.Policy{}); err != nil {
				t.Fatal(err)
			}
			var back []string
			if err := leases.Revoke(ctx, zkqueue.Policy{}, func(m zkqueue.Message, out zkqueue.Outcome) {
				if out == zkqueue.Requeued {
					back = append(back, m.ID)
				}
			}); err != nil {
				t.Fatalf("Revoke: %v", err)
			}
			slices.Sort(back) // leases are listed in no order; their places in the queue are checked below
			if want := []string{ls[1].ID, ls[2].ID}; !slices.Equal(back, want) {
				t.Fatalf("requeued %v, want %v", back, want)
			}
			for _, l := range ls[1:3] {
				if _, err := leases.Ack(ctx, l.Token); !errors.Is(err, zkqueue.ErrUnknownLease) {
					t.Fatalf("Ack of %s after Revoke: %v, want ErrUnknownLease", l.ID, err)
				}
			}
			again, err := leases.Take(ctx, 4, zkqueue.Room{}, time.Hour, false)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range again {
				if l.Deliveries != 2 {
					t.Errorf("%s redelivered with count %d, want 2", l.ID, l.Deliveries)
				}
				got = append(got, string(l.Payload))
			}
			if !slices.Equal(got, []string{"m1", "m2"}) {
				t.Fatalf("after Revoke took %q, want m1 and m2 (m0 acked, m3 nacked for an hour)", got)
			}
		})
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
