package main

import (
	"strings"
	"testing"
)

// create --packed makes a packed queue, shown as such by create and
// queues; --packed with a sync kind, --fairness-key or --message-ttl is
// refused naming both flags, before dialling.
func TestCreatePacked(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	out := c.ok("", "create", "--packed", "--kind", "priority", "jobs")
	if !strings.Contains(out, "priority+packed") {
		t.Errorf("create --packed printed %q, want the kind priority+packed", out)
	}
	c.ok("", "create", "plain")
	// The same configuration again succeeds; another is refused.
	c.ok("", "create", "--packed", "--kind", "priority", "jobs")
	if _, _, err := c.run("", "create", "--kind", "priority", "jobs"); err == nil {
		t.Errorf("create jobs unpacked: got no error, want the queue's existing configuration refused")
	}
	list := c.ok("", "queues")
	for _, l := range lines(list) {
		f := strings.Fields(l)
		switch f[0] {
		case "jobs":
			if f[1] != "priority+packed" {
				t.Errorf("queues: jobs is %q, want priority+packed", f[1])
			}
		case "plain":
			if f[1] != "fifo" {
				t.Errorf("queues: plain is %q, want fifo", f[1])
			}
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--packed", "--kind", "sync", "--members", "2", "q"}, "--packed is for fifo and priority queues"},
		{[]string{"--packed", "--fairness-key", "group", "q"}, "--packed does not combine with --fairness-key"},
		{[]string{"--packed", "--message-ttl", "1h", "q"}, "--packed does not combine with --message-ttl"},
	} {
		args := append([]string{"create"}, tc.args...)
		if _, _, err := c.run("", args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error saying %q", args, err, tc.want)
		}
	}
}
