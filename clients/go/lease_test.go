package qbroker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// An application that stops taking messages for longer than the lease
// (4s against 1s, prefetch 10, 60 KiB messages) while another consumer
// acks what is redelivered: the Consumer never hands out a message whose
// lease had run out, it drops and counts those, and the applications ack
// every message exactly once overall.
func TestConsumerDropsExpiredDeliveries(t *testing.T) {
	tb, c := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const queue, n, size = "paused", 20, 60 << 10
	createQueue(t, c, queue, qbroker.QueueOptions{VisibilityTimeout: time.Second})
	for i := range n {
		p := bytes.Repeat([]byte{'.'}, size)
		copy(p, fmt.Sprintf("m%04d", i))
		if _, err := c.Publish(ctx, queue, p); err != nil {
			t.Fatal(err)
		}
	}
	acks := &ackTally{acked: map[string]int{}}
	ackedAll := func() bool { return acks.count() == n }

	// The paused application and the other consumer each have a client.
	paused, err := c.Consume(ctx, queue, qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce, Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer paused.Close()
	if m := takeLive(t, ctx, paused, "the paused consumer"); m != nil {
		acks.ack(ctx, m)
	}
	other, err := dial(t, tb.addr).Consume(ctx, queue, qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !ackedAll() {
			if m := takeLive(t, ctx, other, "the other consumer"); m != nil {
				acks.ack(ctx, m)
			}
		}
	}()

	time.Sleep(4 * time.Second) // the pause under test (not waiting for a condition)
	// The paused application takes what it is given until every message
	// is acked and it is given nothing more.
	for ctx.Err() == nil {
		nctx, ncancel := context.WithTimeout(ctx, 100*time.Millisecond)
		m := takeLive(t, nctx, paused, "the paused consumer")
		ncancel()
		if m != nil {
			acks.ack(ctx, m)
		} else if ackedAll() {
			break
		}
	}
	cancel() // ends the other consumer's Next
	wg.Wait()
	acks.checkOnce(t, n)
	// Acks on a stream report no outcome: the queue tells whether they
	// all took effect.
	eventually(t, "queue empty", func() (bool, error) {
		st, err := c.Stats(context.Background(), queue)
		return st.Ready == 0 && st.InFlight == 0, err
	})
	t.Logf("the paused consumer dropped %d expired deliveries", paused.Expired())
	if paused.Expired() == 0 {
		t.Error("the paused consumer dropped no expired delivery: the test did not pause it long enough")
	}
}

// takeLive returns k's next message, or nil if Next fails, and fails the
// test if who (the application) got a message whose lease had run out.
func takeLive(t *testing.T, ctx context.Context, k *qbroker.Consumer, who string) *qbroker.Message {
	m, err := k.Next(ctx)
	if err != nil {
		return nil
	}
	if now := time.Now(); !now.Before(m.LeaseDeadline) {
		t.Errorf("%s got %s %v after its lease ran out", who, m.ID, now.Sub(m.LeaseDeadline))
	}
	return m
}

// ackTally acks messages and counts the acks of each. It is safe for
// concurrent use.
type ackTally struct {
	mu    sync.Mutex
	acked map[string]int
	errs  []error // other than an expired lease's
}

// ack acks m; ErrFailedPrecondition (its lease expired) is not an error.
func (a *ackTally) ack(ctx context.Context, m *qbroker.Message) {
	err := m.Ack(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err == nil:
		a.acked[m.ID]++
	case !errors.Is(err, qbroker.ErrFailedPrecondition):
		a.errs = append(a.errs, err)
	}
}

// count returns how many messages were acked.
func (a *ackTally) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.acked)
}

// checkOnce fails the test unless n messages were acked, each once, with
// no ack error.
func (a *ackTally) checkOnce(t *testing.T, n int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.acked) != n {
		t.Fatalf("%d of %d messages acked; ack errors: %v", len(a.acked), n, a.errs)
	}
	for id, k := range a.acked {
		if k != 1 {
			t.Errorf("message %s acked %d times", id, k)
		}
	}
	if len(a.errs) > 0 {
		t.Errorf("ack errors: %v", a.errs)
	}
}
