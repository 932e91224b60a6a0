package main

import (
	"strings"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
)

// create --message-ttl and --expire-to-dead-letter set the queue's TTL,
// shown in its row with the dedup window; a message past it is not
// delivered but dead-lettered.
func TestCreateWithTTL(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	out := c.ok("", "create", "--message-ttl", "1s", "--expire-to-dead-letter", "--dedup-window", "30s", "short")
	rows := lines(out)
	if len(rows) != 2 || !strings.Contains(rows[0], "TTL") || !strings.Contains(rows[0], "DEDUP-WINDOW") {
		t.Fatalf("create: got %q, want a header with TTL and DEDUP-WINDOW and one row", out)
	}
	if !strings.Contains(rows[1], " 1s+dead-letter ") || !strings.Contains(rows[1], " 30s ") {
		t.Errorf("row %q: want TTL 1s+dead-letter and dedup window 30s", rows[1])
	}
	if row := lines(c.ok("", "create", "plain"))[1]; !strings.Contains(row, " - ") || !strings.Contains(row, " 5m0s ") {
		t.Errorf("row %q: want no TTL and the default dedup window 5m0s", row)
	}
	c.ok("", "publish", "short", "stale")
	zktest.WaitFor(t, 30*time.Second, "the message dead-lettered by its TTL", func() bool {
		return strings.Fields(lines(c.ok("", "stats", "short"))[1])[3] == "1"
	})
	if out := c.ok("", "dlq", "short"); len(lines(out)) != 1 || !strings.Contains(out, "\tstale") {
		t.Fatalf("dlq: got %q, want the expired message", out)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--expire-to-dead-letter", "q"}, "--expire-to-dead-letter needs --message-ttl"},
		{[]string{"--message-ttl", "-1s", "q"}, "--message-ttl: want 0 or more"},
		{[]string{"--max-deliveries", "-1", "q"}, "--max-deliveries: want 0 or more"},
	} {
		args := append([]string{"create"}, tc.args...)
		if _, _, err := c.run("", args...); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "qbroker:") {
			t.Errorf("%v: got %v, want an error saying %q", args, err, tc.want)
		}
	}
	if _, _, err := c.run("", "create", "--message-ttl", "500ms", "q"); err == nil || !strings.Contains(err.Error(), "message_ttl 500ms") {
		t.Errorf("create --message-ttl 500ms: got %v, want the broker's range error", err)
	}
}
