package qbroker_test

import (
	"errors"
	"reflect"
	"testing"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// A queue's fairness goes to the broker and comes back; bad weights are
// ErrInvalidArgument, refused by the client (negative) or by the broker
// (out of range).
func TestCreateQueueFairness(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	want := qbroker.Fairness{Key: qbroker.FairByHeader("tenant"), Weights: map[string]int{"gold": 4}}
	info, err := c.CreateQueue(ctx, "fair", qbroker.QueueOptions{Fairness: want})
	if err != nil || !reflect.DeepEqual(info.Fairness, want) {
		t.Fatalf("CreateQueue: got %+v, %v; want fairness %+v", info.Fairness, err, want)
	}
	if got, err := c.GetQueue(ctx, "fair"); err != nil || !reflect.DeepEqual(got.Fairness, want) {
		t.Fatalf("GetQueue: got %+v, %v; want fairness %+v", got.Fairness, err, want)
	}
	for _, w := range []int{-1, 0, 101} {
		_, err := c.CreateQueue(ctx, "bad", qbroker.QueueOptions{Fairness: qbroker.Fairness{Key: qbroker.FairByGroup, Weights: map[string]int{"a": w}}})
		if !errors.Is(err, qbroker.ErrInvalidArgument) {
			t.Errorf("weight %d: got %v, want ErrInvalidArgument", w, err)
		}
	}
}
