package qbroker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

func closedWithin(c <-chan struct{}, d time.Duration) bool {
	select {
	case <-c:
		return true
	default:
	}
	select {
	case <-c:
		return true
	case <-time.After(d):
		return false
	}
}

// A held lock: a second Lock waits (its ctx bounds the wait), Revoke
// reaches the holder, Unlock hands the lock over with a greater token,
// and UnlockKey from another client makes the holder's Lost close with
// ErrLost.
func TestLockClient(t *testing.T) {
	tb, a := setup(t)
	b := dial(t, tb.addr)
	ctx := testCtx(t)
	l, err := a.Lock(ctx, "db", qbroker.LockValue([]byte("a")))
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := b.Lock(short, "db"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock of a held lock with a short ctx: got %v, want DeadlineExceeded", err)
	}
	h, err := b.Revoke(ctx, "db")
	if err != nil || h.Key != l.Key() || h.Token != l.Token() || string(h.Value) != "a" {
		t.Fatalf("Revoke: got %+v, %v; want the holder %s", h, err, l.Key())
	}
	if !closedWithin(l.Revoked(), 10*time.Second) {
		t.Fatal("Revoked did not close")
	}
	var next *qbroker.Lock
	var nextErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); next, nextErr = b.Lock(ctx, "db") }()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(l.Lost(), 0) || l.Err() != nil {
		t.Fatalf("after Unlock: Lost closed %v, Err %v; want closed, nil", closedWithin(l.Lost(), 0), l.Err())
	}
	wg.Wait()
	if nextErr != nil || next.Token() <= l.Token() {
		t.Fatalf("waiter: got %v, %v; want a grant with a token above %d", next, nextErr, l.Token())
	}
	if err := a.UnlockKey(ctx, "db", next.Key(), next.Token()); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(next.Lost(), 10*time.Second) || !errors.Is(next.Err(), qbroker.ErrLost) {
		t.Fatalf("after UnlockKey: Err %v, want ErrLost", next.Err())
	}
	if err := next.Unlock(ctx); !errors.Is(err, qbroker.ErrLost) {
		t.Fatalf("Unlock of a lost lock: got %v, want ErrLost", err)
	}
	if err := a.UnlockKey(ctx, "db", next.Key(), next.Token()); !errors.Is(err, qbroker.ErrFailedPrecondition) {
		t.Fatalf("UnlockKey again: got %v, want ErrFailedPrecondition", err)
	}
	if _, err := a.Lock(ctx, "no/such"); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("Lock of a bad name: got %v, want ErrInvalidArgument", err)
	}
}

// Campaign, Leader, Proclaim and Observe through the client; Resign hands
// the leadership over; Resign by key from another client ends a
// leadership with ErrLost.
func TestElectionClient(t *testing.T) {
	tb, a := setup(t)
	b := dial(t, tb.addr)
	ctx := testCtx(t)
	seen := make(chan qbroker.Leader, 16)
	octx, stopObserving := context.WithCancel(ctx)
	observed := make(chan error, 1)
	go func() {
		observed <- b.Observe(octx, "sched", func(l qbroker.Leader) error {
			select {
			case seen <- l:
			case <-octx.Done():
			}
			return nil
		})
	}()
	first, err := a.Campaign(ctx, "sched", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if l, err := b.Leader(ctx, "sched"); err != nil || l.Key != first.Key() || l.Token != first.Token() {
		t.Fatalf("Leader: got %+v, %v; want %s", l, err, first.Key())
	}
	if err := first.Proclaim(ctx, []byte("a2")); err != nil {
		t.Fatal(err)
	}
	waitLeader(t, seen, first.Key(), "a2")
	var second *qbroker.Leadership
	var secondErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); second, secondErr = b.Campaign(ctx, "sched", []byte("b")) }()
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if secondErr != nil || second.Token() <= first.Token() {
		t.Fatalf("second campaign: got %v, %v", second, secondErr)
	}
	waitLeader(t, seen, second.Key(), "b")
	if err := a.Resign(ctx, "sched", second.Key()); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(second.Done(), 10*time.Second) || !errors.Is(second.Err(), qbroker.ErrLost) {
		t.Fatalf("after Resign by key: Err %v, want ErrLost", second.Err())
	}
	if _, err := a.Leader(ctx, "sched"); !errors.Is(err, qbroker.ErrNotFound) {
		t.Fatalf("Leader without candidates: got %v, want ErrNotFound", err)
	}
	stopObserving()
	if err := <-observed; !errors.Is(err, context.Canceled) {
		t.Fatalf("Observe after its ctx ended: got %v, want Canceled", err)
	}
}

// waitLeader reads observed leaders until key with value arrives.
func waitLeader(t *testing.T, seen <-chan qbroker.Leader, key, value string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case l := <-seen:
			if l.Key == key && string(l.Value) == value {
				return
			}
		case <-timeout:
			t.Fatalf("Observe never showed %s with %s", key, value)
		}
	}
}
