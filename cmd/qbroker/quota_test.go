package main

import (
	"strings"
	"testing"
)

// create --max-depth and --max-bytes set the queue's quotas, shown in the
// queue's row; a publish past one fails naming it.
func TestCreateWithQuotas(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	out := c.ok("", "create", "--max-depth", "2", "--max-bytes", "4096", "small")
	rows := lines(out)
	if len(rows) != 2 || !strings.Contains(rows[0], "MAX-DEPTH") || !strings.Contains(rows[0], "MAX-BYTES") {
		t.Fatalf("create: got %q, want a header with the quotas and one row", out)
	}
	if f := strings.Fields(rows[1]); !strings.Contains(rows[1], " 2 ") || !strings.Contains(rows[1], " 4096 ") || f[0] != "small" {
		t.Errorf("row %q: want max depth 2 and max bytes 4096", rows[1])
	}
	c.ok("", "publish", "small", "a", "b")
	if _, _, err := c.run("", "publish", "small", "c"); err == nil || !strings.Contains(err.Error(), "max_depth") {
		t.Fatalf("publish past the quota: got %v, want an error naming max_depth", err)
	}
}
