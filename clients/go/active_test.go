package qbroker_test

import (
	"errors"
	"testing"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// The single-active option travels through CreateQueue and GetQueue; a
// stream priority out of range is refused before any call, Receive on a
// single-active queue by the broker.
func TestSingleActiveAndPriorityOptions(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	info, err := c.CreateQueue(ctx, "sac", qbroker.QueueOptions{SingleActiveConsumer: true})
	if err != nil || !info.SingleActiveConsumer {
		t.Fatalf("CreateQueue: %+v, %v; want SingleActiveConsumer", info, err)
	}
	if info, err = c.GetQueue(ctx, "sac"); err != nil || !info.SingleActiveConsumer {
		t.Fatalf("GetQueue: %+v, %v; want SingleActiveConsumer", info, err)
	}
	if _, err := c.CreateQueue(ctx, "sync", qbroker.QueueOptions{Kind: qbroker.KindSync, SyncMembers: 2, SingleActiveConsumer: true}); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Errorf("single-active SYNC queue: %v, want ErrInvalidArgument", err)
	}
	if _, err := c.Consume(ctx, "sac", qbroker.ConsumeOptions{Priority: qbroker.MaxConsumerPriority + 1}); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Errorf("priority out of range: %v, want ErrInvalidArgument", err)
	}
	if _, err := c.Receive(ctx, "sac", qbroker.ReceiveOptions{}); !errors.Is(err, qbroker.ErrFailedPrecondition) {
		t.Errorf("Receive on a single-active queue: %v, want ErrFailedPrecondition", err)
	}
	k, err := c.Consume(ctx, "sac", qbroker.ConsumeOptions{Priority: 7})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "sac", []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-k.Messages():
		if m == nil || string(m.Payload) != "x" {
			t.Fatalf("got %v, want x", m)
		}
	case <-ctx.Done():
		t.Fatal("no delivery on the single-active queue")
	}
	_ = k.Close()
}
