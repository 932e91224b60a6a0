package qbroker_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// A queue's RetryBackoff comes back in QueueInfo; a bad one is
// ErrInvalidArgument naming the field. A nack without a delay waits the
// step, and the redelivery's FencingToken is greater than the first's;
// at most once there is no token.
func TestRetryBackoffAndFencingToken(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	_, err := c.CreateQueue(ctx, "bad", qbroker.QueueOptions{RetryBackoff: &qbroker.RetryBackoff{Steps: []time.Duration{time.Second, time.Second}}})
	if !errors.Is(err, qbroker.ErrInvalidArgument) || !strings.Contains(err.Error(), "retry_backoff.steps[1]") {
		t.Fatalf("a schedule that does not increase: got %v, want ErrInvalidArgument naming retry_backoff.steps[1]", err)
	}
	steps := []time.Duration{time.Second, 2 * time.Second}
	info, err := c.CreateQueue(ctx, "q", qbroker.QueueOptions{RetryBackoff: &qbroker.RetryBackoff{Steps: steps}})
	if err != nil || info.RetryBackoff == nil || !slices.Equal(info.RetryBackoff.Steps, steps) {
		t.Fatalf("CreateQueue: %+v, %v", info.RetryBackoff, err)
	}
	info, err = c.CreateQueue(ctx, "exp", qbroker.QueueOptions{RetryBackoff: &qbroker.RetryBackoff{Initial: time.Second, Max: time.Minute}})
	if r := info.RetryBackoff; err != nil || r == nil || r.Initial != time.Second || r.Multiplier != 2 || r.Max != time.Minute || r.Steps != nil {
		t.Fatalf("CreateQueue exponential: %+v, %v", info.RetryBackoff, err)
	}
	if info, err := c.GetQueue(ctx, "q"); err != nil || info.RetryBackoff == nil || !slices.Equal(info.RetryBackoff.Steps, steps) {
		t.Fatalf("GetQueue: %+v, %v", info.RetryBackoff, err)
	}

	if _, err := c.Publish(ctx, "q", []byte("x")); err != nil {
		t.Fatal(err)
	}
	lease := qbroker.ReceiveOptions{Mode: qbroker.AtLeastOnce, Wait: 30 * time.Second}
	ms, err := c.Receive(ctx, "q", lease)
	if err != nil || len(ms) != 1 || ms[0].FencingToken == 0 {
		t.Fatalf("Receive: %v, %v; want one message with a fencing token", ms, err)
	}
	first := ms[0]
	nacked := time.Now() // the broker's step starts after this, when it nacks
	if err := first.Nack(ctx, 0); err != nil {
		t.Fatal(err)
	}
	ms, err = c.Receive(ctx, "q", lease)
	if err != nil || len(ms) != 1 {
		t.Fatalf("Receive after the nack: %v, %v", ms, err)
	}
	if got := time.Since(nacked); got < steps[0] {
		t.Fatalf("redelivered %v after the nack, before the first step %v", got, steps[0])
	}
	if ms[0].FencingToken <= first.FencingToken {
		t.Fatalf("redelivery's token %d, want more than the first's %d", ms[0].FencingToken, first.FencingToken)
	}
	if err := ms[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "q", []byte("y")); err != nil {
		t.Fatal(err)
	}
	ms, err = c.Receive(ctx, "q", qbroker.ReceiveOptions{Wait: 30 * time.Second})
	if err != nil || len(ms) != 1 || ms[0].FencingToken != 0 {
		t.Fatalf("Receive at most once: %v, %v; want one message without a token", ms, err)
	}
}
