package qbroker_test

import (
	"errors"
	"testing"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Quotas set at creation come back in QueueInfo, and a publish past one
// fails with ErrResourceExhausted.
func TestQueueQuotas(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	info, err := c.CreateQueue(ctx, "q", qbroker.QueueOptions{MaxDepth: 2, MaxBytes: 1 << 20})
	if err != nil || info.MaxDepth != 2 || info.MaxBytes != 1<<20 {
		t.Fatalf("CreateQueue: %+v, %v; want max depth 2, max bytes 1 MiB", info, err)
	}
	if got, err := c.GetQueue(ctx, "q"); err != nil || got.MaxDepth != 2 || got.MaxBytes != 1<<20 {
		t.Fatalf("GetQueue: %+v, %v", got, err)
	}
	if _, err := c.PublishBatch(ctx, "q", []qbroker.OutMessage{{Payload: []byte("a")}, {Payload: []byte("b")}, {Payload: []byte("c")}}); !errors.Is(err, qbroker.ErrResourceExhausted) {
		t.Fatalf("three messages into a queue of depth 2: got %v, want ErrResourceExhausted", err)
	}
	if _, err := c.CreateQueue(ctx, "bad", qbroker.QueueOptions{MaxBytes: -1}); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("a negative quota: got %v, want ErrInvalidArgument", err)
	}
}
