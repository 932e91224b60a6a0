package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// `qbroker dlq` lists dead letters that do not fit one response (4.5 MiB
// here), all of them by default and --limit of them when given, in order.
func TestDLQListsPageByPage(t *testing.T) {
	addr := startBroker(t)
	c := cli{t: t, addr: addr}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := qbroker.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const queue, n, size = "big", 9, 512 << 10
	if _, err := cl.CreateQueue(ctx, queue, qbroker.QueueOptions{MaxDeliveries: 1, DeadLetter: true}); err != nil {
		t.Fatal(err)
	}
	payload := func(i int) string { return fmt.Sprintf("m%04d", i) + strings.Repeat(".", size-5) }
	for i := range n {
		if _, err := cl.Publish(ctx, queue, []byte(payload(i))); err != nil {
			t.Fatal(err)
		}
		ms, err := cl.Receive(ctx, queue, qbroker.ReceiveOptions{Mode: qbroker.AtLeastOnce})
		if err != nil || len(ms) != 1 {
			t.Fatalf("receive %d: %d messages, %v", i, len(ms), err)
		}
		if err := ms[0].Nack(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"dlq", queue}, n},
		{[]string{"dlq", "--limit", "3", queue}, 3},
	} {
		out := c.ok("", tc.args...)
		got := payloads(t, out, "1")
		if len(got) != tc.want {
			t.Fatalf("%s: %d dead letters, want %d", strings.Join(tc.args, " "), len(got), tc.want)
		}
		for i, p := range got {
			if p != payload(i) {
				t.Fatalf("%s: dead letter %d is %.5s...", strings.Join(tc.args, " "), i, p)
			}
		}
	}
	if _, _, err := c.run("", "dlq", "--limit", "-1", queue); err == nil {
		t.Error("dlq --limit -1 succeeded")
	}
}
