package main

import (
	"strings"
	"testing"
)

// create --fairness-key and --fairness-weight make a queue with fair
// dispatch; bad values are refused naming the flag or the field.
func TestCreateWithFairness(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	c.ok("", "create", "--fairness-key", "header:tenant", "--fairness-weight", "gold=3", "--fairness-weight", "silver=2", "tenants")
	// The same configuration again succeeds; another is refused.
	c.ok("", "create", "--fairness-key", "header:tenant", "--fairness-weight", "silver=2", "--fairness-weight", "gold=3", "tenants")
	if _, _, err := c.run("", "create", "--fairness-key", "group", "tenants"); err == nil {
		t.Errorf("create with another fairness key: got no error, want the queue's existing configuration refused")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--fairness-weight", "a=2", "q"}, "--fairness-weight needs --fairness-key"},
		{[]string{"--fairness-key", "group", "--fairness-weight", "a=0", "q"}, "want 1..100"},
		{[]string{"--fairness-key", "tenant", "q"}, "fairness.key"},
	} {
		args := append([]string{"create"}, tc.args...)
		if _, _, err := c.run("", args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error saying %q", args, err, tc.want)
		}
	}
}
