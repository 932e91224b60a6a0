package qbroker_test

import (
	"errors"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// LockDelay and CampaignDelay: a holder or leader whose client goes away
// without Unlock or Resign keeps the name for the delay; Unlock and
// Resign free it at once; a bad delay is ErrInvalidArgument.
func TestCoordinationDelayClient(t *testing.T) {
	const delay = 1500 * time.Millisecond
	tb, a := setup(t)
	b := dial(t, tb.addr)
	ctx := testCtx(t)

	l, err := a.Lock(ctx, "db", qbroker.LockDelay(delay))
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan *qbroker.Lock, 1)
	go func() {
		next, err := b.Lock(ctx, "db", qbroker.LockDelay(time.Minute))
		if err != nil {
			t.Error(err)
		}
		held <- next
	}()
	gone := time.Now()
	_ = a.Close() // a's process "dies": no Unlock
	next := <-held
	if next == nil {
		return
	}
	if waited := time.Since(gone); waited < delay {
		t.Fatalf("b held %v after a went, want at least the delay %v", waited, delay)
	}
	if next.Token() <= l.Token() {
		t.Fatalf("token %d after %d: want greater", next.Token(), l.Token())
	}
	c := dial(t, tb.addr)
	go func() {
		if err := next.Unlock(ctx); err != nil {
			t.Error(err)
		}
	}()
	// b's delay is a minute, longer than ctx: only an Unlock that frees
	// the lock at once lets c have it.
	last, err := c.Lock(ctx, "db")
	if err != nil {
		t.Fatal(err)
	}
	if err := last.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	ld, err := b.Campaign(ctx, "sched", []byte("b"), qbroker.CampaignDelay(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	won := make(chan error, 1)
	go func() {
		l, err := c.Campaign(ctx, "sched", []byte("c"))
		if err == nil {
			err = l.Resign(ctx)
		}
		won <- err
	}()
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatalf("c's campaign after b's Resign: %v", err)
	}

	if _, err := c.Lock(ctx, "db", qbroker.LockDelay(-time.Second)); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("Lock with a negative delay: got %v, want ErrInvalidArgument", err)
	}
	if _, err := c.Campaign(ctx, "sched", nil, qbroker.CampaignDelay(2*time.Minute)); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("Campaign with a delay over a minute: got %v, want ErrInvalidArgument", err)
	}
}

// PermitDelay: the holder of the last permit whose client goes away
// without Release keeps that permit for the delay; Release frees a permit
// with a delay at once; a bad delay is ErrInvalidArgument.
func TestPermitDelayClient(t *testing.T) {
	const delay = 1500 * time.Millisecond
	tb, a := setup(t)
	b := dial(t, tb.addr)
	ctx := testCtx(t)

	p, err := a.Acquire(ctx, "render", 1, qbroker.PermitDelay(delay))
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan *qbroker.Permit, 1)
	go func() {
		next, err := b.Acquire(ctx, "render", 1, qbroker.PermitDelay(time.Minute))
		if err != nil {
			t.Error(err)
		}
		held <- next
	}()
	gone := time.Now()
	_ = a.Close() // a's process "dies": no Release
	next := <-held
	if next == nil {
		return
	}
	if waited := time.Since(gone); waited < delay {
		t.Fatalf("b held %v after a went, want at least the delay %v", waited, delay)
	}
	if next.Token() <= p.Token() {
		t.Fatalf("token %d after %d: want greater", next.Token(), p.Token())
	}
	c := dial(t, tb.addr)
	go func() {
		if err := next.Release(ctx); err != nil {
			t.Error(err)
		}
	}()
	// b's delay is a minute, longer than ctx: only a Release that frees
	// the permit at once lets c have it.
	last, err := c.Acquire(ctx, "render", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := last.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "render", 1, qbroker.PermitDelay(2*time.Minute)); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("Acquire with a delay over the maximum: got %v, want ErrInvalidArgument", err)
	}
}
