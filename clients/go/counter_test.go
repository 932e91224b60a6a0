package qbroker_test

import (
	"errors"
	"math"
	"sync"
	"testing"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// The Counter calls through two clients: concurrent Adds sum, Get reads
// the sum, CompareAndSet swaps only from the current value, Set returns
// the value it replaced, and bad input is ErrInvalidArgument, changing
// nothing.
func TestCounterClient(t *testing.T) {
	tb, a := setup(t)
	b := dial(t, tb.addr)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		cl := a
		if i%2 == 1 {
			cl = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				if _, err := cl.Counter("visits").Add(ctx, 2); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := b.Counter("visits")
	if v, err := n.Get(ctx); err != nil || v != 200 {
		t.Fatalf("Get: got %d, %v; want 200", v, err)
	}
	if ok, err := n.CompareAndSet(ctx, 199, 0); err != nil || ok {
		t.Fatalf("CompareAndSet(199, 0) on 200: got %v, %v; want false", ok, err)
	}
	if ok, err := n.CompareAndSet(ctx, 200, 7); err != nil || !ok {
		t.Fatalf("CompareAndSet(200, 7) on 200: got %v, %v; want true", ok, err)
	}
	if old, err := n.Set(ctx, math.MaxInt64); err != nil || old != 7 {
		t.Fatalf("Set: got old %d, %v; want 7", old, err)
	}
	if _, err := n.Add(ctx, 1); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("Add past MaxInt64: got %v, want ErrInvalidArgument", err)
	}
	if v, err := a.Counter("visits").Get(ctx); err != nil || v != math.MaxInt64 {
		t.Fatalf("after the refused Add: got %d, %v; want MaxInt64", v, err)
	}
	if _, err := a.Counter("no/such").Add(ctx, 1); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("Add to a bad name: got %v, want ErrInvalidArgument", err)
	}
}
