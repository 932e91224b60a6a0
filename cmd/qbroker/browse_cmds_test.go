package main

import (
	"strings"
	"testing"
)

// publish --header and --content-type reach consume, dlq and peek, which
// print them after the payload; peek takes nothing.
func TestHeadersAndPeekCommands(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	c.ok("", "create", "--max-deliveries", "1", "--dead-letter", "h")
	c.ok("", "publish", "--header", "trace=abc", "--header", "tab=a\tb", "--content-type", "text/plain", "h", "one", "two")
	c.ok("three\n", "publish", "--stdin", "--batch", "--header", "k=v=w", "h")
	if _, errOut, err := c.run("", "publish", "--header", "novalue", "h", "x"); err == nil || !strings.Contains(errOut, "want key=value") {
		t.Fatalf("--header without '=': got %v, stderr %q", err, errOut)
	}
	if _, _, err := c.run("", "publish", "--header", "k="+strings.Repeat("x", 17<<10), "h", "x"); err == nil || !strings.Contains(err.Error(), "16384") {
		t.Fatalf("oversized header: got %v, want a refusal naming the bound", err)
	}

	want := []string{
		"one\tcontent-type=text/plain\theader.tab=\"a\\tb\"\theader.trace=abc",
		"two\tcontent-type=text/plain\theader.tab=\"a\\tb\"\theader.trace=abc",
		"three\theader.k=\"v=w\"",
	}
	// peek: all three, twice (nothing taken), in pages of one with -n.
	for range 2 {
		out := c.ok("", "peek", "h")
		ls := lines(out)
		if len(ls) != 3 {
			t.Fatalf("peek: got %q, want 3 lines", out)
		}
		for i, l := range ls {
			f := strings.SplitN(l, "\t", 4)
			if len(f) != 4 || f[1] != "0" || f[3] != want[i] {
				t.Fatalf("peek line %d: got %q, want id, 0, time, %q", i, l, want[i])
			}
		}
	}
	if out := c.ok("", "peek", "-n", "2", "h"); len(lines(out)) != 2 {
		t.Fatalf("peek -n 2: got %q", out)
	}
	if _, _, err := c.run("", "peek", "-n", "-1", "h"); err == nil {
		t.Fatal("peek -n -1 accepted")
	}

	out := c.ok("", "consume", "-n", "1", "h")
	if f := strings.SplitN(lines(out)[0], "\t", 3); len(f) != 3 || f[2] != want[0] {
		t.Fatalf("consume: got %q, want %q after id and count", out, want[0])
	}
	out = c.ok("", "consume", "--wait", "1s", "-n", "1", "h")
	if f := strings.SplitN(lines(out)[0], "\t", 3); len(f) != 3 || f[2] != want[1] {
		t.Fatalf("consume --wait: got %q, want %q", out, want[1])
	}
	// Not acked, past max deliveries 1: a dead letter once the stream
	// ends, listed with its attributes.
	out = c.ok("", "consume", "--mode", "at-least-once", "--no-ack", "-n", "1", "h")
	line, token, _ := strings.Cut(lines(out)[0], "\tfencing-token=")
	if f := strings.SplitN(line, "\t", 3); len(f) != 3 || f[2] != want[2] || token == "" {
		t.Fatalf("consume at least once: got %q, want %q and the fencing token", out, want[2])
	}
	out = c.ok("", "dlq", "h")
	if f := strings.SplitN(lines(out)[0], "\t", 4); len(f) != 4 || f[3] != want[2] {
		t.Fatalf("dlq: got %q, want %q", out, want[2])
	}
	if out := c.ok("", "peek", "h"); out != "" {
		t.Fatalf("peek of an empty queue: got %q", out)
	}
}
