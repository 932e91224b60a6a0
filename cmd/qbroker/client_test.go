package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) { zktest.Main(m) }

// startBroker runs an in-process broker on a 127.0.0.1 listener until the
// test ends and returns its address. mods adjust its Config.
func startBroker(t *testing.T, mods ...func(*broker.Config)) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t), SweepInterval: 100 * time.Millisecond}
	for _, m := range mods {
		m(&cfg)
	}
	s, err := brokertest.Start(ctx, cfg, brokertest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s.Addr
}

// cli runs the client commands against one broker.
type cli struct {
	t    *testing.T
	addr string
}

// run runs a command with stdin and returns its stdout, stderr and error.
func (c cli) run(stdin string, args ...string) (string, string, error) {
	c.t.Helper()
	for _, cmd := range append(append(append(clientCommands, adminCommands...), coordCommands...), browseCommands...) {
		if cmd.name == args[0] {
			var out, errOut bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := cmd.run(ctx, stdio{strings.NewReader(stdin), &out, &errOut}, append([]string{"--addr", c.addr, "--timeout", "5s"}, args[1:]...))
			return out.String(), errOut.String(), err
		}
	}
	c.t.Fatalf("no client command %q", args[0])
	return "", "", nil
}

// ok runs a command that must succeed and returns its stdout.
func (c cli) ok(stdin string, args ...string) string {
	c.t.Helper()
	out, errOut, err := c.run(stdin, args...)
	if err != nil {
		c.t.Fatalf("qbroker %s: %v\nstderr: %s", strings.Join(args, " "), err, errOut)
	}
	return out
}

var idLine = regexp.MustCompile(`^\S+$`)

func lines(s string) []string { return strings.Split(strings.TrimSuffix(s, "\n"), "\n") }

// payloads returns the payload column of consume/dlq output, checking
// each line's id and delivery count.
func payloads(t *testing.T, out string, count string) []string {
	t.Helper()
	var ps []string
	for _, l := range lines(out) {
		f := strings.Split(l, "\t")
		if len(f) < 3 || f[0] == "" || f[1] != count {
			t.Fatalf("line %q: want id, delivery count %s, payload", l, count)
		}
		if strings.HasPrefix(f[len(f)-1], "fencing-token=") {
			f = f[:len(f)-1] // at least once: the delivery's token
		}
		ps = append(ps, f[len(f)-1])
	}
	return ps
}

func TestClientCommands(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}

	out := c.ok("", "create", "jobs", "--visibility", "5s")
	if !strings.Contains(out, "jobs") || !strings.Contains(out, "fifo") || !strings.Contains(out, "5s") {
		t.Errorf("create: got %q, want a row for jobs, fifo, 5s", out)
	}
	c.ok("", "create", "--kind", "priority", "urgent")
	c.ok("", "create", "--kind", "sync", "--members", "3", "group")
	c.ok("", "create", "--max-deliveries", "1", "--dead-letter", "flaky")

	out = c.ok("", "queues")
	for _, want := range []string{"NAME", "flaky", "group", "jobs", "urgent", "priority", "sync"} {
		if !strings.Contains(out, want) {
			t.Errorf("queues: %q lacks %q", out, want)
		}
	}
	if got := len(lines(out)); got != 5 {
		t.Errorf("queues: got %d lines, want a header and 4 queues:\n%s", got, out)
	}

	out = c.ok("", "publish", "jobs", "a", "b", "c")
	if ids := lines(out); len(ids) != 3 || !idLine.MatchString(ids[0]) {
		t.Errorf("publish: got %q, want 3 ids", out)
	}
	out = c.ok("d\ne\n", "publish", "--stdin", "--batch", "jobs")
	if ids := lines(out); len(ids) != 2 {
		t.Errorf("publish --stdin --batch: got %q, want 2 ids", out)
	}
	c.ok("", "publish", "urgent", "--priority", "9", "later")
	c.ok("", "publish", "--priority", "1", "urgent", "now")

	out = c.ok("", "stats", "jobs")
	if f := strings.Fields(lines(out)[1]); f[0] != "jobs" || f[1] != "5" || f[2] != "0" {
		t.Errorf("stats: got %q, want jobs with 5 ready, 0 in flight", out)
	}

	out = c.ok("", "consume", "-n", "3", "jobs")
	if got := strings.Join(payloads(t, out, "1"), ","); got != "a,b,c" {
		t.Errorf("consume -n 3: got payloads %s, want a,b,c", got)
	}
	out = c.ok("", "consume", "--mode", "at-least-once", "--wait", "300ms", "jobs")
	if got := strings.Join(payloads(t, out, "1"), ","); got != "d,e" {
		t.Errorf("consume --wait: got payloads %s, want d,e", got)
	}
	out = c.ok("", "consume", "--mode", "at-least-once", "--prefetch", "5", "-n", "2", "urgent")
	if got := strings.Join(payloads(t, out, "1"), ","); got != "now,later" {
		t.Errorf("consume priority: got payloads %s, want now,later", got)
	}
	out = c.ok("", "stats")
	for _, l := range lines(out)[1:] {
		if f := strings.Fields(l); f[1] != "0" || f[2] != "0" {
			t.Errorf("stats after consuming: %q, want 0 ready and 0 in flight", l)
		}
	}
	if !strings.Contains(out, "0/3") {
		t.Errorf("stats: %q lacks the sync group's 0/3", out)
	}

	// Dead letters: not acked, past max deliveries 1.
	c.ok("", "publish", "flaky", "boom")
	out = c.ok("", "consume", "--mode", "at-least-once", "--no-ack", "-n", "1", "flaky")
	if got := payloads(t, out, "1"); len(got) != 1 || got[0] != "boom" {
		t.Errorf("consume --no-ack: got %v, want boom", got)
	}
	out = c.ok("", "dlq", "flaky")
	if got := payloads(t, out, "1"); len(got) != 1 || got[0] != "boom" {
		t.Errorf("dlq: got %q, want boom", out)
	}
	id := strings.Split(out, "\t")[0]
	if out := c.ok("", "dlq", "--redrive", "flaky", id); out != "flaky: redriven 1\n" {
		t.Errorf("dlq --redrive: got %q", out)
	}
	c.ok("", "publish", "flaky", "x", "y")
	if out := c.ok("", "purge", "--yes", "flaky"); out != "flaky: purged 3\n" {
		t.Errorf("purge: got %q, want 3 purged", out)
	}
}

func TestClientCommandErrors(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	for _, args := range [][]string{{"consume", "nope"}, {"publish", "nope", "x"}, {"stats", "nope"}, {"purge", "nope"}, {"dlq", "nope"}} {
		if _, _, err := c.run("", args...); !errors.Is(err, qbroker.ErrNotFound) {
			t.Errorf("%v: got %v, want ErrNotFound", args, err)
		}
	}
	// stats prints its table only when it has every row.
	c.ok("", "create", "there")
	if out, _, err := c.run("", "stats", "there", "nope"); !errors.Is(err, qbroker.ErrNotFound) || out != "" {
		t.Errorf("stats of a missing queue: got %v, stdout %q; want ErrNotFound and nothing printed", err, out)
	}
	if _, _, err := c.run("", "create", "--kind", "lifo", "q"); err == nil || !strings.Contains(err.Error(), "lifo") {
		t.Errorf("create --kind lifo: got %v, want an error naming lifo", err)
	}
	if _, _, err := c.run("", "create", "bad/name"); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Errorf("create bad/name: got %v, want ErrInvalidArgument", err)
	}
	if _, errOut, err := c.run("", "publish", "q"); err == nil || !strings.Contains(errOut, "usage: qbroker publish") {
		t.Errorf("publish without messages: got %v, stderr %q; want an error and the usage", err, errOut)
	}
	for _, cmd := range append(append(append(clientCommands, adminCommands...), coordCommands...), browseCommands...) {
		out, errOut, err := c.run("", cmd.name, "--help")
		if !errors.Is(err, flag.ErrHelp) || !strings.Contains(out, "usage: qbroker "+cmd.name) || !strings.Contains(out, "-addr") || errOut != "" {
			t.Errorf("%s --help: got %v, stdout %q, stderr %q; want ErrHelp and a usage with --addr on stdout only", cmd.name, err, out, errOut)
		}
		if _, ok := commands[cmd.name]; !ok {
			t.Errorf("%s is not registered", cmd.name)
		}
	}
}

// Ctrl-C (a cancelled context) ends a streaming consume cleanly.
func TestConsumeUntilInterrupted(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	c.ok("", "create", "q")
	c.ok("", "publish", "q", "one")
	var cmd clientCommand
	for _, cc := range clientCommands {
		if cc.name == "consume" {
			cmd = cc
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- cmd.run(ctx, stdio{strings.NewReader(""), &cancelWriter{w: &out, wrote: cancel}, &bytes.Buffer{}},
			[]string{"--addr", c.addr, "--mode", "at-least-once", "q"})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("consume: %v", err)
		}
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("consume did not end 20s after its context")
	}
	if got := payloads(t, out.String(), "1"); len(got) != 1 || got[0] != "one" {
		t.Errorf("got %q, want one", out.String())
	}
	if out := c.ok("", "stats", "q"); strings.Fields(lines(out)[1])[2] != "0" {
		t.Errorf("stats: %q, want the printed message acked", out)
	}
}

// cancelWriter cancels the command (like Ctrl-C) after its first write.
type cancelWriter struct {
	w     *bytes.Buffer
	wrote func()
}

func (s *cancelWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.wrote()
	return n, err
}
