package zkqueue_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// bigPayload is message i of a test: size bytes, recognisable by i.
func bigPayload(i, size int) []byte {
	p := bytes.Repeat([]byte{byte('a' + i%26)}, size)
	copy(p, fmt.Sprintf("%04d", i))
	return p
}

// roomStore returns a Store of path with a Batcher, so that concurrent
// claims share a Multi, writing on another session than the Store's, as
// in the broker: the Store's children watch may then fire after a take
// returns.
func roomStore(t *testing.T, path string) *zkqueue.Queue {
	t.Helper()
	conn := zktest.Conn(t)
	batcher := zkqueue.NewCommitter([]*zk.Conn{zktest.Conn(t)}, zkqueue.CommitterConfig{Workers: 2, MaxOps: 64, MaxBytes: 900 << 10})
	t.Cleanup(batcher.Close)
	s, err := zkqueue.New(conn, path, zkqueue.WithCommitter(batcher))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TakeWithin stops at the first message that does not fit its Room: the
// messages taken are the head of the queue in order, and the others stay
// in the queue untouched and are the next ones taken, at once, whether the
// claims read the messages or remembered them from their publish.
func TestTakeWithinStopsAtRoom(t *testing.T) {
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprintf("own=%v", own), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			root := zktest.Root(t)
			other, err := zkqueue.New(zktest.Conn(t), root+"/items")
			if err != nil {
				t.Fatal(err)
			}
			cons := roomStore(t, root+"/items")
			pub := cons
			if !own {
				pub = roomStore(t, root+"/items")
			} else if _, err := cons.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
				t.Fatalf("consuming the empty queue: %v", err) // now it remembers what it publishes
			}
			const n, size = 10, 100 << 10
			for i := range n {
				if _, err := pub.Publish(ctx, bigPayload(i, size)); err != nil {
					t.Fatal(err)
				}
			}
			room := zkqueue.Room{Bytes: 3*size + 3*100, Overhead: 100}
			next := 0
			for round := 0; next < n; round++ {
				ms, err := cons.Take(ctx, n, room, false)
				if err != nil {
					t.Fatalf("round %d (next %d): %v", round, next, err)
				}
				if want := min(3, n-next); len(ms) != want {
					t.Fatalf("round %d: took %d messages, want %d", round, len(ms), want)
				}
				for _, m := range ms {
					if !bytes.Equal(m.Payload, bigPayload(next, size)) {
						t.Fatalf("round %d: got message %.4s, want %04d", round, m.Payload, next)
					}
					next++
				}
				// Counted on another session, so as not to order the
				// consumer's watch before its next take.
				if left, err := other.Len(ctx); err != nil || left != n-next {
					t.Fatalf("round %d: %d messages left (%v), want %d", round, left, err, n-next)
				}
			}
		})
	}
}

// The first message always fits, however small the Room.
func TestTakeWithinFirstAlwaysFits(t *testing.T) {
	ctx := context.Background()
	s := roomStore(t, zktest.Root(t)+"/items")
	for i := range 2 {
		if _, err := s.Publish(ctx, bigPayload(i, 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		ms, err := s.Take(ctx, 5, zkqueue.Room{Bytes: 1}, false)
		if err != nil || len(ms) != 1 || !bytes.Equal(ms[0].Payload, bigPayload(i, 64<<10)) {
			t.Fatalf("take %d: %d messages, %v; want message %d alone", i, len(ms), err, i)
		}
	}
}

// At least once, a message that does not fit is neither leased nor
// counted as delivered; Unclaim gives a lease back with its delivery count
// as it was before the claim.
func TestTakeLeasesWithinAndUnclaim(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := zktest.Root(t)
	items := roomStore(t, root+"/items")
	leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	const n, size = 6, 100 << 10
	for i := range n {
		if _, err := items.Publish(ctx, bigPayload(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	room := zkqueue.Room{Bytes: 2*size + 1000, Overhead: 100}
	first, err := leases.Take(ctx, n, room, time.Minute, false)
	if err != nil || len(first) != 2 {
		t.Fatalf("first take: %d leases, %v; want 2", len(first), err)
	}
	if inFlight, _ := leases.InFlight(ctx); inFlight != 2 {
		t.Fatalf("%d leases after the first take, want 2", inFlight)
	}
	// Give the first lease back unsent: it is the head again, first
	// delivery.
	if err := leases.Unclaim(ctx, first[0].Token); err != nil {
		t.Fatal(err)
	}
	if err := leases.Unclaim(ctx, first[0].Token); err != nil {
		t.Fatalf("second unclaim of the same lease: %v", err)
	}
	got := []zkqueue.Lease{first[1]}
	for len(got) < n {
		ls, err := leases.Take(ctx, n, room, time.Minute, false)
		if err != nil {
			t.Fatalf("after %d: %v", len(got), err)
		}
		got = append(got, ls...)
	}
	seen := map[string]bool{}
	for _, l := range got {
		if l.Deliveries != 1 {
			t.Errorf("message %.4s: delivery count %d, want 1", l.Payload, l.Deliveries)
		}
		if seen[l.ID] {
			t.Errorf("message %s leased twice", l.ID)
		}
		seen[l.ID] = true
		if _, err := leases.Ack(ctx, l.Token); err != nil {
			t.Errorf("ack %s: %v", l.ID, err)
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct messages, want %d", len(seen), n)
	}
}

// DeadLettersAfter pages through the dead letters in order, each page
// within its count and byte bounds, and ends with an empty next.
func TestDeadLettersPages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := zktest.Root(t)
	items := roomStore(t, root+"/items")
	leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	const n, size = 9, 100 << 10
	for i := range n {
		if _, err := items.Publish(ctx, bigPayload(i, size)); err != nil {
			t.Fatal(err)
		}
		ls, err := leases.Take(ctx, 1, zkqueue.Room{}, time.Minute, false)
		if err != nil {
			t.Fatal(err)
		}
		if _, out, err := leases.Nack(ctx, ls[0].Token, 0, zkqueue.Policy{MaxDeliveries: 1, DeadLetter: true}); err != nil || out != zkqueue.DeadLettered {
			t.Fatalf("nack %d: %v %v", i, out, err)
		}
	}
	for _, tc := range []struct {
		limit int
		room  zkqueue.Room
		page  int
	}{
		{limit: 4, page: 4},
		{limit: 100, room: zkqueue.Room{Bytes: 3*size + 300, Overhead: 100}, page: 3},
		{limit: 2, room: zkqueue.Room{Bytes: 3*size + 300, Overhead: 100}, page: 2},
		{limit: 100, room: zkqueue.Room{Bytes: 1}, page: 1},
	} {
		var got []zkqueue.Message
		after := ""
		for pages := 0; ; pages++ {
			if pages > n {
				t.Fatalf("limit %d room %+v: more than %d pages", tc.limit, tc.room, n)
			}
			ms, next, err := leases.DeadLettersAfter(ctx, after, tc.limit, tc.room)
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) > tc.page || (next != "" && len(ms) != tc.page) {
				t.Fatalf("limit %d room %+v: page of %d (next %q), want %d", tc.limit, tc.room, len(ms), next, tc.page)
			}
			got = append(got, ms...)
			if next == "" {
				break
			}
			after = next
		}
		if len(got) != n {
			t.Fatalf("limit %d room %+v: listed %d dead letters, want %d", tc.limit, tc.room, len(got), n)
		}
		for i, m := range got {
			if !bytes.Equal(m.Payload, bigPayload(i, size)) {
				t.Fatalf("limit %d room %+v: dead letter %d is %.4s", tc.limit, tc.room, i, m.Payload)
			}
		}
	}
}
