package qbroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// A set barrier holds WaitBarrier until RemoveBarrier; bad names are
// ErrInvalidArgument.
func TestBarrierClient(t *testing.T) {
	tb, a := setup(t)
	b := dial(t, tb.addr)
	ctx := testCtx(t)
	if err := a.SetBarrier(ctx, "release"); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := b.WaitBarrier(short, "release"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitBarrier on a set barrier with a short ctx: got %v, want DeadlineExceeded", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- b.WaitBarrier(ctx, "release") }()
	if err := a.RemoveBarrier(ctx, "release"); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("WaitBarrier after RemoveBarrier: %v", err)
	}
	for _, err := range []error{a.SetBarrier(ctx, "no/such"), a.RemoveBarrier(ctx, ""), a.WaitBarrier(ctx, "..")} {
		if !errors.Is(err, qbroker.ErrInvalidArgument) {
			t.Fatalf("bad name: got %v, want ErrInvalidArgument", err)
		}
	}
}

// Three participants over two clients enter together and leave together;
// one that enters alone gives up at its ctx; a bad count is
// ErrInvalidArgument; Close leaves at once.
func TestDoubleBarrierClient(t *testing.T) {
	tb, a := setup(t)
	b := dial(t, tb.addr)
	ctx := testCtx(t)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := a.EnterBarrier(short, "round", 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("EnterBarrier alone with a short ctx: got %v, want DeadlineExceeded", err)
	}
	for _, n := range []int{0, -1, 1001, 1 << 40} {
		if _, err := a.EnterBarrier(ctx, "round", n); !errors.Is(err, qbroker.ErrInvalidArgument) {
			t.Fatalf("EnterBarrier with count %d: got %v, want ErrInvalidArgument", n, err)
		}
	}
	const n = 3
	type entered struct {
		p   *qbroker.Participant
		err error
	}
	ch := make(chan entered, n)
	for i := range n {
		c := []*qbroker.Client{a, b}[i%2]
		go func() {
			p, err := c.EnterBarrier(ctx, "round", n)
			ch <- entered{p, err}
		}()
	}
	var ps []*qbroker.Participant
	for range n {
		e := <-ch
		if e.err != nil {
			t.Fatal(e.err)
		}
		ps = append(ps, e.p)
	}
	errc := make(chan error, n)
	for _, p := range ps {
		go func() { errc <- p.Leave(ctx) }()
	}
	for range n {
		if err := <-errc; err != nil {
			t.Fatalf("Leave: %v", err)
		}
	}
	for _, p := range ps {
		if !closedWithin(p.Done(), 0) || p.Err() != nil {
			t.Fatalf("after Leave: Done closed %v, Err %v", closedWithin(p.Done(), 0), p.Err())
		}
	}
	p, err := a.EnterBarrier(ctx, "one", 1)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if p.Err() != nil {
		t.Fatalf("after Close: Err %v, want nil", p.Err())
	}
}
