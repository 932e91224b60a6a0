package main

import (
	"strings"
	"testing"
)

// publish --dedup-id publishes once however often it runs; a repeat
// prints the first id marked duplicate. create --dedup-window sets the
// queue's window.
func TestPublishDedupID(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	c.ok("", "create", "--dedup-window", "30s", "q")
	first := c.ok("", "publish", "--dedup-id", "job-1", "q", "payload")
	if !idLine.MatchString(strings.TrimSpace(first)) {
		t.Fatalf("publish: got %q, want an id", first)
	}
	again := c.ok("", "publish", "--dedup-id", "job-1", "q", "payload")
	if want := strings.TrimSpace(first) + "\tduplicate\n"; again != want {
		t.Fatalf("repeat: got %q, want %q", again, want)
	}
	out := c.ok("", "publish", "--dedup-id", "many", "--batch", "q", "a", "b")
	out2 := c.ok("", "publish", "--dedup-id", "many", "q", "a", "b", "c")
	if l := lines(out2); len(l) != 3 || !strings.HasSuffix(l[0], "\tduplicate") || !strings.HasSuffix(l[1], "\tduplicate") || strings.Contains(l[2], "duplicate") {
		t.Fatalf("repeat of a batch plus one: got %q after %q", out2, out)
	}
	if f := strings.Fields(lines(c.ok("", "stats", "q"))[1]); f[1] != "4" {
		t.Fatalf("stats: %v, want 4 ready", f)
	}
	if _, errOut, err := c.run("", "publish", "--dedup-id", "a/b", "q", "x"); err == nil || !strings.Contains(err.Error(), "dedup_id") {
		t.Fatalf("bad dedup id: %v, stderr %q", err, errOut)
	}
}
