package main

import (
	"strings"
	"testing"
)

// publish --group puts the messages into a group: at least once, the
// second waits while the first is in flight (a leased, unacked first
// message comes back first); bad keys are refused.
func TestPublishGroup(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	c.ok("", "create", "q")
	c.ok("", "publish", "--group", "g", "q", "first", "second")
	// A poll's lease outlives the command: "first" stays in flight,
	// so a second poll finds nothing of its group.
	if got := payloads(t, c.ok("", "consume", "--mode", "at-least-once", "--no-ack", "--visibility", "1m", "--wait", "1s", "-n", "2", "q"), "1"); len(got) != 1 || got[0] != "first" {
		t.Fatalf("first poll: %v, want [first]", got)
	}
	if out := c.ok("", "consume", "--mode", "at-least-once", "--wait", "1s", "-n", "1", "q"); out != "" {
		t.Fatalf("second poll: %q, want nothing while first is in flight", out)
	}
	if _, errOut, err := c.run("", "publish", "--group", "a/b", "q", "x"); err == nil || !strings.Contains(err.Error(), "group") {
		t.Fatalf("bad group: %v, stderr %q", err, errOut)
	}
}
