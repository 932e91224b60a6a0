package zkqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// Every delivery of a message carries a fencing token greater than the
// previous one's, whichever way the message came back (nack, delayed
// nack, expiry swept by another process, a stream's release, unclaim,
// dead letter and redrive) and whichever process, on its own session,
// claimed it; the token is the lease node's creation zxid.
func TestFencingTokensIncreasePerMessage(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	open := func() (*zkqueue.Queue, *zkqueue.Leases) {
		conn := zktest.Conn(t)
		items, err := zkqueue.New(conn, root+"/items")
		if err != nil {
			t.Fatal(err)
		}
		leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
		if err != nil {
			t.Fatal(err)
		}
		return items, leases
	}
	items, a := open()
	_, b := open() // another process, on its own session
	conn := zktest.Conn(t)
	sweeper := zkqueue.NewLeaseSweeper(conn, root+"/items", root+"/leases", root+"/dead", zkqueue.SweeperConfig{})
	if _, err := items.Publish(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	var last uint64
	take := func(l *zkqueue.Leases, ttl time.Duration, how string) zkqueue.Lease {
		t.Helper()
		var ls []zkqueue.Lease
		zktest.WaitFor(t, 10*time.Second, "the message back after "+how, func() bool {
			var err error
			ls, err = l.Take(ctx, 1, zkqueue.Room{}, ttl, false)
			return err == nil && len(ls) == 1
		})
		got := ls[0].FencingToken
		if got <= last {
			t.Fatalf("after %s: token %d, want more than the previous delivery's %d", how, got, last)
		}
		_, st, err := conn.Exists(root + "/leases/" + ls[0].Token)
		if err != nil || uint64(st.Czxid) != got {
			t.Fatalf("after %s: token %d, lease node's czxid %v (%v)", how, got, st, err)
		}
		last = got
		return ls[0]
	}
	l := take(a, time.Minute, "the publish")
	if _, _, err := a.Nack(ctx, l.Token, 0, zkqueue.Policy{}); err != nil {
		t.Fatal(err)
	}
	l = take(b, time.Minute, "a nack")
	if _, _, err := b.Nack(ctx, l.Token, time.Millisecond, zkqueue.Policy{}); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 10*time.Second, "the delayed nack swept", func() bool {
		ex, err := sweeper.Sweep(ctx, time.Now(), zkqueue.Policy{})
		return err == nil && len(ex) == 1
	})
	l = take(a, 100*time.Millisecond, "a delayed nack")
	zktest.WaitFor(t, 10*time.Second, "the lease swept at its deadline", func() bool {
		ex, err := sweeper.Sweep(ctx, time.Now(), zkqueue.Policy{})
		return err == nil && len(ex) == 1
	})
	l = take(b, time.Minute, "an expiry")
	if _, _, ok, err := b.Release(ctx, l.Token, zkqueue.Policy{}); err != nil || !ok {
		t.Fatalf("Release: %v, %v", ok, err)
	}
	l = take(a, time.Minute, "a release")
	if err := a.Unclaim(ctx, l.Token); err != nil {
		t.Fatal(err)
	}
	l = take(a, time.Minute, "an unclaim")
	if _, out, err := a.Nack(ctx, l.Token, 0, zkqueue.Policy{MaxDeliveries: 1, DeadLetter: true}); err != nil || out != zkqueue.DeadLettered {
		t.Fatalf("Nack past max deliveries: %v, %v; want DeadLettered", out, err)
	}
	if n, err := b.Redrive(ctx, nil); err != nil || n != 1 {
		t.Fatalf("Redrive: %d, %v", n, err)
	}
	take(b, time.Minute, "a dead letter's redrive")
}
