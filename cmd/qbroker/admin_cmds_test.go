package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
)

func TestDeleteCommand(t *testing.T) {
	// No lease sweep: it opens every queue, and a queue opened while it is
	// deleted is a race of DeleteQueue's own, not this command's.
	c := cli{t: t, addr: startBroker(t, func(c *broker.Config) { c.SweepInterval = time.Hour })}
	c.ok("", "create", "q1", "q2", "q3")
	c.ok("", "publish", "q1", "a", "b")

	// Without --yes it asks; anything but yes deletes nothing.
	for _, answer := range []string{"n\n", "", "maybe\n"} {
		_, errOut, err := c.run(answer, "delete", "q1")
		if err == nil || !strings.Contains(errOut, "q1 (2 ready, 0 in flight, 0 dead letters)? [y/N]") {
			t.Fatalf("delete q1 answered %q: got %v, stderr %q; want a question and a refusal", answer, err, errOut)
		}
	}
	if out := c.ok("", "queues"); !strings.Contains(out, "q1") {
		t.Fatalf("q1 gone after refused deletes:\n%s", out)
	}
	if out := c.ok("y\n", "delete", "q1"); out != "q1: deleted\n" {
		t.Fatalf("delete q1 answered y: got %q", out)
	}
	if out := c.ok("", "delete", "--yes", "q2"); out != "q2: deleted\n" {
		t.Fatalf("delete --yes q2: got %q", out)
	}
	if out := c.ok("", "delete", "q3", "-f"); out != "q3: deleted\n" {
		t.Fatalf("delete q3 -f: got %q", out)
	}
	if out := c.ok("", "queues"); len(lines(out)) != 1 {
		t.Fatalf("queues after deleting all:\n%s", out)
	}
	if _, _, err := c.run("", "delete", "--yes", "q1"); !errors.Is(err, qbroker.ErrNotFound) {
		t.Fatalf("delete of a deleted queue: got %v, want ErrNotFound", err)
	}
}

// syncBuffer is a bytes.Buffer safe for a command writing while the test
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A sync queue created from the CLI opens once 'qbroker join' holds its
// members, and then serves consume.
func TestJoinCommand(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	c.ok("", "create", "--kind", "sync", "--members", "2", "g")
	c.ok("", "publish", "g", "go")
	if _, _, err := c.run("", "consume", "-n", "1", "g"); !errors.Is(err, qbroker.ErrFailedPrecondition) {
		t.Fatalf("consume before the group is complete: got %v, want ErrFailedPrecondition", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder := &syncBuffer{}
	held := make(chan error, 1)
	go func() {
		held <- runJoin(ctx, stdio{strings.NewReader(""), holder, &bytes.Buffer{}}, []string{"--addr", c.addr, "g", "m1"})
	}()
	waitOutput(t, holder, "joined 1/2\n")
	if _, _, err := c.run("", "join", "g", "m1"); !errors.Is(err, qbroker.ErrAlreadyExists) {
		t.Fatalf("join with a member id in use: got %v, want ErrAlreadyExists", err)
	}
	// The second member completes the group and leaves once it is open.
	// One line per change: the group completing and the queue opening
	// are separate events of the same counts, printed once.
	out := c.ok("", "join", "--until-open", "g", "m2")
	if out != "joined 2/2\nopen\n" {
		t.Fatalf("join --until-open: got %q, want joined 2/2 and open, once each", out)
	}
	waitOutput(t, holder, "open\n")
	if got := holder.String(); got != "joined 1/2\njoined 2/2\nopen\n" {
		t.Fatalf("first member: got %q, want joined 1/2, joined 2/2 and open, once each", got)
	}
	if got := payloads(t, c.ok("", "consume", "-n", "1", "g"), "1"); len(got) != 1 || got[0] != "go" {
		t.Fatalf("consume of the opened queue: got %v, want go", got)
	}

	cancel()
	select {
	case err := <-held:
		if err != nil {
			t.Fatalf("join ended by Ctrl-C: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("join did not end 20s after Ctrl-C")
	}
	if out := c.ok("", "stats", "g"); !strings.Contains(out, "0/2 open") {
		t.Fatalf("stats after the members left: %q, want 0/2 open", out)
	}
}

// purge asks for confirmation as delete does: without --yes, anything but
// yes on standard input (none, as in a script) purges nothing.
func TestPurgeConfirms(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	c.ok("", "create", "q")
	c.ok("", "publish", "q", "a", "b")
	for _, answer := range []string{"", "n\n"} {
		out, errOut, err := c.run(answer, "purge", "q")
		if err == nil || out != "" || !strings.Contains(errOut, "purge q (2 ready messages)? [y/N]") || !strings.Contains(err.Error(), "--yes") {
			t.Fatalf("purge answered %q: got %v, stdout %q, stderr %q; want the question, a refusal naming --yes and nothing purged", answer, err, out, errOut)
		}
	}
	if f := strings.Fields(lines(c.ok("", "stats", "q"))[1]); f[1] != "2" {
		t.Fatalf("stats after refused purges: %v, want 2 ready", f)
	}
	if out := c.ok("yes\n", "purge", "q"); out != "q: purged 2\n" {
		t.Fatalf("purge answered yes: got %q", out)
	}
	c.ok("", "publish", "q", "c")
	if out := c.ok("", "purge", "-f", "q"); out != "q: purged 1\n" {
		t.Fatalf("purge -f: got %q", out)
	}
}

func waitOutput(t *testing.T, b *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q lacks %q after 20s", b.String(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// consume --no-ack does what its help says: streaming, the messages come
// back as soon as the command ends; with --wait, they stay in flight until
// their lease runs out.
func TestConsumeNoAckHelpIsTrue(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	out, _, _ := c.run("", "consume", "--help")
	help := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{
		"Then it is redelivered: streaming, when the command ends",
		"with --wait, only once its lease runs out, even long after the command ended",
		"--no-ack changes nothing",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("consume --help does not say %q:\n%s", want, out)
		}
	}

	c.ok("", "create", "--visibility", "1h", "s", "w")
	c.ok("", "publish", "s", "x")
	c.ok("", "publish", "w", "x")
	c.ok("", "consume", "--mode", "at-least-once", "--no-ack", "-n", "1", "s")
	c.ok("", "consume", "--mode", "at-least-once", "--no-ack", "--wait", "1s", "-n", "1", "w")
	counts := func(q string) (ready, inFlight string) {
		f := strings.Fields(lines(c.ok("", "stats", q))[1])
		return f[1], f[2]
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ready, inFlight := counts("s")
		if ready == "1" && inFlight == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("streamed --no-ack: ready %s, in flight %s 20s after the command; want the message back", ready, inFlight)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ready, inFlight := counts("w"); ready != "0" || inFlight != "1" {
		t.Fatalf("--wait --no-ack: ready %s, in flight %s after the command; want the message still leased", ready, inFlight)
	}
}
