package main

import (
	"strings"
	"testing"
)

// publish --delay publishes delayed messages (their ids name the delayed
// node); a delay past the broker's maximum fails.
func TestPublishDelay(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	c.ok("", "create", "q")
	out := c.ok("", "publish", "--delay", "10m", "--batch", "q", "a", "b")
	ids := strings.Fields(out)
	if len(ids) != 2 || !strings.HasPrefix(ids[0], "d-") || !strings.HasPrefix(ids[1], "d-") {
		t.Fatalf("publish --delay: got ids %q, want two delayed ids (d-...)", out)
	}
	if _, errOut, err := c.run("", "publish", "--delay", "1h", "q", "c"); err == nil {
		t.Fatalf("publish --delay 1h past the 15m maximum succeeded (stderr %q)", errOut)
	}
}
