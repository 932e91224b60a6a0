package qbroker_test

import (
	"errors"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// A queue's packed option goes to the broker and comes back; packed with
// fairness or a message TTL is ErrInvalidArgument.
func TestCreateQueuePacked(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	info, err := c.CreateQueue(ctx, "packed", qbroker.QueueOptions{Packed: true})
	if err != nil || !info.Packed {
		t.Fatalf("CreateQueue: got packed %v, %v; want true", info.Packed, err)
	}
	if got, err := c.GetQueue(ctx, "packed"); err != nil || !got.Packed {
		t.Fatalf("GetQueue: got packed %v, %v; want true", got.Packed, err)
	}
	for _, o := range []qbroker.QueueOptions{
		{Packed: true, Fairness: qbroker.Fairness{Key: qbroker.FairByGroup}},
		{Packed: true, MessageTTL: time.Hour},
	} {
		if _, err := c.CreateQueue(ctx, "bad", o); !errors.Is(err, qbroker.ErrInvalidArgument) {
			t.Errorf("CreateQueue(%+v): got %v, want ErrInvalidArgument", o, err)
		}
	}
}
