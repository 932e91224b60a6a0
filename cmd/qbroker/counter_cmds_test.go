package main

import (
	"errors"
	"strings"
	"testing"
)

// counter get, add (negative too), cas (exit status 1 when not swapped)
// and set; bad verbs and numbers are usage errors.
func TestCounterCommand(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	steps := []struct {
		args []string
		out  string
	}{
		{[]string{"get", "hits"}, "0"},
		{[]string{"add", "hits", "5"}, "5"},
		{[]string{"add", "hits", "-7"}, "-2"},
		{[]string{"cas", "hits", "-2", "10"}, "true"},
		{[]string{"set", "hits", "-1"}, "10"},
		{[]string{"get", "hits"}, "-1"},
	}
	for _, s := range steps {
		out, _, err := c.run("", append([]string{"counter"}, s.args...)...)
		if err != nil || strings.TrimSpace(out) != s.out {
			t.Fatalf("counter %v: got %q, %v; want %s", s.args, out, err, s.out)
		}
	}
	out, _, err := c.run("", "counter", "cas", "hits", "3", "4")
	var es exitStatus
	if !errors.As(err, &es) || es.code != 1 || strings.TrimSpace(out) != "false" {
		t.Fatalf("counter cas from a stale value: got %q, %v; want false and exit status 1", out, err)
	}
	for _, bad := range [][]string{{"inc", "hits"}, {"add", "hits"}, {"add", "hits", "x"}, {"cas", "hits", "1"}, {"get"}} {
		var ue usageError
		if _, _, err := c.run("", append([]string{"counter"}, bad...)...); !errors.As(err, &ue) {
			t.Errorf("counter %v: got %v, want a usage error", bad, err)
		}
	}
	if out, _, err := c.run("", "counter", "add", "no/such", "1"); err == nil || !strings.Contains(err.Error(), "counter name") {
		t.Fatalf("counter add to a bad name: got %q, %v; want an error naming the counter name", out, err)
	}
}
