package qbroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Two permits taken at once: another Acquire waits (its ctx bounds the
// wait); RevokePermits reaches the holder; under a raised limit the
// third permit is granted; ReleasePermit from another client ends the holder's lease with
// ErrLost; a limit other than the semaphore's and bad counts are refused
// with the matching sentinels.
func TestSemaphoreClient(t *testing.T) {
	tb, a := setup(t)
	b := dial(t, tb.addr)
	ctx := testCtx(t)
	p, err := a.Acquire(ctx, "pool", 2, qbroker.Permits(2), qbroker.PermitValue([]byte("a")))
	if err != nil {
		t.Fatal(err)
	}
	if p.Permits() != 2 || p.Token() == 0 || p.Key() == "" {
		t.Fatalf("permit %s: %d permits, token %d", p.Key(), p.Permits(), p.Token())
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(short, "pool", 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with every permit held and a short ctx: got %v, want DeadlineExceeded", err)
	}
	if _, err := b.Acquire(ctx, "pool", 3); !errors.Is(err, qbroker.ErrFailedPrecondition) {
		t.Fatalf("Acquire with another limit: got %v, want ErrFailedPrecondition", err)
	}
	if _, err := b.Acquire(ctx, "pool", 2, qbroker.Permits(3)); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("Acquire of 3 permits of 2: got %v, want ErrInvalidArgument", err)
	}
	hs, err := b.RevokePermits(ctx, "pool", "")
	if err != nil || len(hs) != 1 || hs[0].Key != p.Key() || hs[0].Token != p.Token() || hs[0].Permits != 2 || string(hs[0].Value) != "a" {
		t.Fatalf("RevokePermits: got %+v, %v; want the holder %s", hs, err, p.Key())
	}
	if !closedWithin(p.Revoked(), 10*time.Second) {
		t.Fatal("Revoked did not close")
	}
	if err := a.SetSemaphoreLimit(ctx, "pool", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "pool", 2); !errors.Is(err, qbroker.ErrFailedPrecondition) {
		t.Fatalf("Acquire with the old limit after SetSemaphoreLimit: got %v, want ErrFailedPrecondition", err)
	}
	q, err := b.Acquire(ctx, "pool", 3)
	if err != nil || q.Token() <= p.Token() {
		t.Fatalf("Acquire under the raised limit: %v, %v", q, err)
	}
	if err := b.ReleasePermit(ctx, "pool", p.Key(), p.Token()); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(p.Lost(), 10*time.Second) || !errors.Is(p.Err(), qbroker.ErrLost) {
		t.Fatalf("after ReleasePermit: Err %v, want ErrLost", p.Err())
	}
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(q.Lost(), 0) || q.Err() != nil {
		t.Fatalf("after Release: Err %v, want nil", q.Err())
	}
	if err := a.SetSemaphoreLimit(ctx, "nothing", 3); !errors.Is(err, qbroker.ErrNotFound) {
		t.Fatalf("SetSemaphoreLimit of no semaphore: got %v, want ErrNotFound", err)
	}
}
