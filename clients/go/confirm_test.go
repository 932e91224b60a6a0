package qbroker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/zktest"
)

// TestConsumeConfirm: with ConsumeOptions.Confirm, an Ack on the stream
// returns once the ack committed, so the queue shows it at once, with
// consumers racing for the head and the broker claiming ahead as
// `qbroker serve` does; an ack the broker refuses (its lease ran out)
// fails as the Ack call would.
func TestConsumeConfirm(t *testing.T) {
	tb, err := serveBroker(broker.Config{
		ZooKeeper:      []string{zktest.Addr(t)},
		Root:           zktest.Root(t),
		SweepInterval:  100 * time.Millisecond,
		SessionTimeout: 4 * time.Second,
		ClaimAhead:     true,
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tb.stop)
	c := dial(t, tb.addr)
	ctx := testCtx(t)
	if _, err := c.Consume(ctx, "q", qbroker.ConsumeOptions{Confirm: true}); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Errorf("Confirm at most once: %v, want ErrInvalidArgument", err)
	}

	const queue, n = "confirmed", 200
	createQueue(t, c, queue, qbroker.QueueOptions{})
	msgs := make([]qbroker.OutMessage, n)
	for i := range msgs {
		msgs[i].Payload = fmt.Appendf(nil, "m%03d", i)
	}
	if _, err := c.PublishBatch(ctx, queue, msgs); err != nil {
		t.Fatal(err)
	}
	acks := &ackTally{acked: map[string]int{}}
	var wg sync.WaitGroup
	var racers []*qbroker.Consumer
	for _, prefetch := range []int{1, 1, 4, 16} {
		k, err := c.Consume(ctx, queue, qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce, Prefetch: prefetch, Confirm: true})
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close() // (again)
		racers = append(racers, k)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for acks.count() < n && ctx.Err() == nil {
				nctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				m, err := k.Next(nctx)
				cancel()
				if err == nil {
					acks.ack(ctx, m)
				}
			}
		}()
	}
	wg.Wait()
	acks.checkOnce(t, n)
	for _, k := range racers {
		k.Close()
	}

	// Each Ack returns after its commit: the queue shows it at once
	// (an unconfirmed one is still on its way then, or held by the
	// broker to share a write).
	k, err := c.Consume(ctx, queue, qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce, Confirm: true})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	for i := range 20 {
		if _, err := c.Publish(ctx, queue, fmt.Appendf(nil, "one%02d", i)); err != nil {
			t.Fatal(err)
		}
		if err := next(t, k).Ack(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := c.Stats(ctx, queue)
		if err != nil {
			t.Fatal(err)
		}
		if st.Ready != 0 || st.InFlight != 0 {
			t.Fatalf("right after confirmed ack %d: %d ready, %d in flight, want 0 and 0", i, st.Ready, st.InFlight)
		}
	}

	// A refused ack.
	createQueue(t, c, "short", qbroker.QueueOptions{VisibilityTimeout: time.Second})
	if _, err := c.Publish(ctx, "short", []byte("late")); err != nil {
		t.Fatal(err)
	}
	short, err := c.Consume(ctx, "short", qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce, Confirm: true})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	m := next(t, short)
	time.Sleep(time.Until(m.LeaseDeadline) + 100*time.Millisecond) // until the lease ran out
	if err := m.Ack(ctx); !errors.Is(err, qbroker.ErrFailedPrecondition) {
		t.Errorf("ack after the lease ran out: %v, want ErrFailedPrecondition", err)
	}
}
