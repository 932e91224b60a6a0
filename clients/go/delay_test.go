package qbroker_test

import (
	"errors"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// WithDelay and WithDeliverAt hold messages back (Stats.Delayed) until
// due; bad delays are ErrInvalidArgument. A queue's MessageTTL comes back
// in QueueInfo and expired messages are counted in Stats.Expired.
func TestDelayAndTTL(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	info, err := c.CreateQueue(ctx, "q", qbroker.QueueOptions{MessageTTL: time.Minute, ExpireToDeadLetter: true})
	if err != nil || info.MessageTTL != time.Minute || !info.ExpireToDeadLetter {
		t.Fatalf("CreateQueue: %+v, %v; want a TTL of 1m to the dead letters", info, err)
	}
	if _, err := c.Publish(ctx, "q", []byte("soon"), qbroker.WithDelay(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "q", []byte("later"), qbroker.WithDeliverAt(time.Now().Add(10*time.Minute))); err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]qbroker.PublishOption{
		{qbroker.WithDelay(-time.Second)},
		{qbroker.WithDelay(time.Hour)},
		{qbroker.WithDelay(time.Second), qbroker.WithDeliverAt(time.Now().Add(time.Second))},
	} {
		if _, err := c.Publish(ctx, "q", []byte("bad"), opts...); !errors.Is(err, qbroker.ErrInvalidArgument) {
			t.Fatalf("bad delay: got %v, want ErrInvalidArgument", err)
		}
	}
	ms, err := c.Receive(ctx, "q", qbroker.ReceiveOptions{Wait: 30 * time.Second})
	if err != nil || len(ms) != 1 || string(ms[0].Payload) != "soon" {
		t.Fatalf("Receive: %v, %v; want the message delayed by 1s", ms, err)
	}
	st, err := c.Stats(ctx, "q")
	if err != nil || st.Delayed != 1 || st.Ready != 0 || st.Expired != 0 {
		t.Fatalf("Stats: %+v, %v; want 1 delayed", st, err)
	}
}
