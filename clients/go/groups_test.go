package qbroker_test

import (
	"testing"

	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/zktest"
)

// WithGroup publishes into a group: the group's second message waits for
// the first one's ack, and deliveries carry their group.
func TestPublishWithGroup(t *testing.T) {
	ctx := testCtx(t)
	b := startBroker(t, zktest.Root(t), "")
	c := dial(t, b.addr)
	createQueue(t, c, "q", qbroker.QueueOptions{})
	for _, p := range []string{"1", "2"} {
		if _, err := c.Publish(ctx, "q", []byte(p), qbroker.WithGroup("orders")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.PublishBatch(ctx, "q", []qbroker.OutMessage{{Payload: []byte("3"), Group: "orders"}}); err != nil {
		t.Fatal(err)
	}
	recv := func() []*qbroker.Message {
		ms, err := c.Receive(ctx, "q", qbroker.ReceiveOptions{Max: 10, Mode: qbroker.AtLeastOnce})
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	for _, want := range []string{"1", "2", "3"} {
		ms := recv()
		if len(ms) != 1 || string(ms[0].Payload) != want || ms[0].Group != "orders" {
			t.Fatalf("receive: %d messages, want %s of group orders", len(ms), want)
		}
		if ms := recv(); len(ms) != 0 {
			t.Fatalf("received %q while %s is in flight", ms[0].Payload, want)
		}
		if err := ms[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
