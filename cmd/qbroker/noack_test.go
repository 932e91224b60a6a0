package main

import (
	"strings"
	"testing"
)

// Streaming at least once without acks: -n sets the prefetch, so the
// command gets its n messages instead of stopping after the first; a
// prefetch that would stop it, or no -n, is refused up front.
func TestConsumeNoAckStreamsN(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	c.ok("", "create", "q")
	c.ok("", "publish", "q", "a", "b", "c", "d", "e", "f")
	out := c.ok("", "consume", "--mode", "at-least-once", "--no-ack", "-n", "5", "q")
	if got := strings.Join(payloads(t, out, "1"), ","); got != "a,b,c,d,e" {
		t.Fatalf("consume --no-ack -n 5: got payloads %s, want a,b,c,d,e", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--no-ack", "q"}, "needs -n"},
		{[]string{"--no-ack", "-n", "2000", "q"}, "needs -n"},
		{[]string{"--no-ack", "--prefetch", "2", "-n", "5", "q"}, "give --prefetch 5"},
	} {
		args := append([]string{"consume", "--mode", "at-least-once"}, tc.args...)
		_, _, err := c.run("", args...)
		if _, ok := err.(usageError); !ok || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want a usage error saying %q", args, err, tc.want)
		}
	}
	// At most once --no-ack changes nothing, and --prefetch stays free.
	out = c.ok("", "consume", "--no-ack", "--prefetch", "1", "-n", "1", "q")
	if got := payloads(t, out, "2"); len(got) != 1 || got[0] != "a" {
		t.Fatalf("at most once --no-ack: got %q, want a, released by the first command", out)
	}
}
