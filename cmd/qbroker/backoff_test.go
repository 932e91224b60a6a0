package main

import (
	"strconv"
	"strings"
	"testing"
)

// create --retry-backoff sets the queue's schedule, shown in its row; a
// bad one is refused naming the field; consume prints each at-least-once
// delivery's fencing token, greater after a redelivery.
func TestCreateWithRetryBackoffAndFencingTokens(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	out := c.ok("", "create", "--retry-backoff", "100ms,200ms", "steps")
	if rows := lines(out); len(rows) != 2 || !strings.Contains(rows[0], "RETRY-BACKOFF") || !strings.Contains(rows[1], " 100ms,200ms ") {
		t.Fatalf("create: got %q, want the schedule 100ms,200ms in its RETRY-BACKOFF column", out)
	}
	if row := lines(c.ok("", "create", "--retry-backoff", "exp:1s,3", "exp"))[1]; !strings.Contains(row, " exp:1s,3,12h0m0s ") {
		t.Errorf("row %q: want exp:1s,3,12h0m0s", row)
	}
	if row := lines(c.ok("", "queues", "--prefix", "steps"))[1]; !strings.Contains(row, " 100ms,200ms ") {
		t.Errorf("queues row %q: want the schedule", row)
	}
	for _, tc := range []struct{ arg, want string }{
		{"1s,1s", "retry_backoff.steps[1]"},
		{"exp:1m,2,1s", "retry_backoff.max"},
		{"1s,soon", "invalid value"},
	} {
		_, stderr, err := c.run("", "create", "--retry-backoff", tc.arg, "bad")
		if err == nil || !strings.Contains(err.Error()+stderr, tc.want) {
			t.Errorf("create --retry-backoff %s: got %v, %q; want an error naming %s", tc.arg, err, stderr, tc.want)
		}
	}

	c.ok("", "publish", "steps", "x")
	var tokens []uint64
	for range 2 {
		out := c.ok("", "consume", "--mode", "at-least-once", "--no-ack", "--visibility", "100ms", "-n", "1", "steps")
		_, tok, ok := strings.Cut(strings.TrimSpace(out), "\tfencing-token=")
		n, err := strconv.ParseUint(tok, 10, 64)
		if !ok || err != nil {
			t.Fatalf("consume at least once: got %q, want a fencing-token field", out)
		}
		tokens = append(tokens, n)
	}
	if tokens[1] <= tokens[0] {
		t.Fatalf("tokens %v: want the redelivery's greater", tokens)
	}
	out = c.ok("", "consume", "--wait", "10s", "-n", "1", "steps")
	if strings.Contains(out, "fencing-token") {
		t.Fatalf("consume at most once printed a token: %q", out)
	}
}
