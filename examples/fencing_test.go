package examples_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

var receivedLine = regexp.MustCompile(`(?m)^received (\S+) delivery=(\d+) token=(\d+)$`)

// The fencing module (fencing/) is a consumer that writes its effect to a
// SQLite table with the delivery's fencing token. Consumer A receives a
// message and is paused (held before its write, and SIGSTOPped) past its
// lease; the leader's sweep gives the message back, consumer B receives
// it with a greater token, writes and acks; when A goes on, the table
// refuses its stale write, and the row holds B's effect and token. The
// module's own tests (the sink against SQLite) pass too.
func TestFencingModule(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the fencing module: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "fencing")
	env := append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local")
	gocmd := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir, cmd.Env = "fencing", env
		if out, err := cmd.CombinedOutput(); err != nil {
			if os.Getenv("CI") == "" && offline(string(out)) {
				t.Skipf("the module proxy is not reachable:\n%s", out)
			}
			t.Fatalf("go %s in examples/fencing: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	gocmd("build", "-o", bin, ".")
	gocmd("vet", ".")
	gocmd("test", "-count=1", ".")

	s, err := brokertest.Start(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t),
		SweepInterval: 50 * time.Millisecond, SessionTimeout: 4 * time.Second}, brokertest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	c, err := qbroker.Dial(ctx, s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const lease = time.Second
	if _, err := c.CreateQueue(ctx, "jobs", qbroker.QueueOptions{VisibilityTimeout: lease}); err != nil {
		t.Fatal(err)
	}
	id, err := c.Publish(ctx, "jobs", []byte("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "effects.db")
	args := func(name string, more ...string) []string {
		return append([]string{"-addr", s.Addr, "-queue", "jobs", "-db", db, "-name", name}, more...)
	}

	// A receives and holds.
	a := exec.CommandContext(ctx, bin, args("A", "-hold")...)
	stdin, err := a.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := a.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var aErr strings.Builder
	a.Stderr = &aErr
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Process.Kill(); _ = a.Wait() })
	lines := bufio.NewScanner(stdout)
	var aOut strings.Builder
	for !strings.Contains(aOut.String(), "holding\n") {
		if !lines.Scan() {
			t.Fatalf("consumer A ended before holding: %v\n%s%s", lines.Err(), aOut.String(), aErr.String())
		}
		aOut.WriteString(lines.Text() + "\n")
	}
	first := receivedLine.FindStringSubmatch(aOut.String())
	if first == nil || first[1] != id || first[2] != "1" {
		t.Fatalf("consumer A printed %q, want the first delivery of %s", aOut.String(), id)
	}
	tokenA, _ := strconv.ParseUint(first[3], 10, 64)
	// Paused for real, past its lease.
	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	// B gets the message once A's lease ran out, writes and acks.
	out, err := exec.CommandContext(ctx, bin, args("B", "-wait", "30s")...).CombinedOutput()
	if err != nil {
		t.Fatalf("consumer B: %v\n%s", err, out)
	}
	second := receivedLine.FindStringSubmatch(string(out))
	if second == nil || second[1] != id || second[2] != "2" || !strings.Contains(string(out), "wrote "+id) || !strings.Contains(string(out), "\nacked\n") {
		t.Fatalf("consumer B printed %q, want the second delivery of %s written and acked", out, id)
	}
	tokenB, _ := strconv.ParseUint(second[3], 10, 64)
	if tokenB <= tokenA {
		t.Fatalf("B's token %d is not greater than A's %d", tokenB, tokenA)
	}

	// A goes on: its write is refused.
	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
		aOut.WriteString(lines.Text() + "\n")
	}
	if err := a.Wait(); err != nil {
		t.Fatalf("consumer A: %v\n%s%s", err, aOut.String(), aErr.String())
	}
	if want := fmt.Sprintf("refused %s token=%d", id, tokenA); !strings.Contains(aOut.String(), want) || strings.Contains(aOut.String(), "wrote") {
		t.Fatalf("consumer A printed %q, want %q and no write", aOut.String(), want)
	}

	out, err = exec.CommandContext(ctx, bin, "-db", db, "-dump").CombinedOutput()
	if want := fmt.Sprintf("row %s fence=%d value=%q\n", id, tokenB, "job-1 handled by B"); err != nil || string(out) != want {
		t.Fatalf("the table: %q, %v; want %q", out, err, want)
	}
	t.Logf("A (token %d) refused, B (token %d) wrote:\n%s", tokenA, tokenB, out)
}
