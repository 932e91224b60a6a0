package main

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// lock runs a command under the lock with the grant in its environment
// and passes its exit status on; it waits while another holds the lock;
// a lock lost while the command runs stops the command.
func TestLockCommand(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	out, _, err := c.run("", "lock", "L", "--", "sh", "-c", `echo "$QBROKER_LOCK_NAME $QBROKER_LOCK_TOKEN"; exit 3`)
	var es exitStatus
	if !errors.As(err, &es) || es.code != 3 {
		t.Fatalf("lock -- sh exiting 3: got %v, want exit status 3", err)
	}
	f := strings.Fields(out)
	if len(f) != 2 || f[0] != "L" {
		t.Fatalf("the command's output %q, want the lock's name and token", out)
	}
	if tok, err := strconv.ParseInt(f[1], 10, 64); err != nil || tok <= 0 {
		t.Fatalf("QBROKER_LOCK_TOKEN = %q, want a positive number", f[1])
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	qc, err := qbroker.Dial(ctx, c.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer qc.Close()
	held, err := qc.Lock(ctx, "L")
	if err != nil {
		t.Fatal(err)
	}
	outBuf := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runLock(ctx, stdio{strings.NewReader(""), outBuf, &bytes.Buffer{}},
			[]string{"--addr", c.addr, "--value", "cli", "L", "--", "sh", "-c", "echo started; exec sleep 60"})
	}()
	if strings.Contains(outBuf.String(), "started") {
		t.Fatal("the command ran while another held the lock")
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, outBuf, "started\n")
	h, err := qc.Revoke(ctx, "L")
	if err != nil || string(h.Value) != "cli" {
		t.Fatalf("Revoke: got %+v, %v; want the command's holder", h, err)
	}
	if err := qc.UnlockKey(ctx, "L", h.Key, h.Token); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, qbroker.ErrLost) {
			t.Fatalf("lock after its lock was lost: got %v, want ErrLost", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the command still runs 30s after its lock was lost")
	}
}

// elect prints the leader once it leads, an observer prints it too, and
// Ctrl-C resigns.
func TestElectCommand(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	if _, _, err := c.run("", "elect", "bad/name", "v"); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("elect with a bad name: got %v, want ErrInvalidArgument", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leader := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runElect(ctx, stdio{strings.NewReader(""), leader, &bytes.Buffer{}}, []string{"--addr", c.addr, "E", "node-1"})
	}()
	waitOutput(t, leader, " node-1\n")
	octx, stopObserver := context.WithCancel(context.Background())
	defer stopObserver()
	observer := &syncBuffer{}
	observed := make(chan error, 1)
	go func() {
		observed <- runElect(octx, stdio{strings.NewReader(""), observer, &bytes.Buffer{}}, []string{"--addr", c.addr, "--observe", "E"})
	}()
	waitOutput(t, observer, strings.TrimSpace(leader.String())+"\n")

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("elect ended by Ctrl-C: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("elect did not end 20s after Ctrl-C")
	}
	qctx, qcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer qcancel()
	qc, err := qbroker.Dial(qctx, c.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer qc.Close()
	if _, err := qc.Leader(qctx, "E"); !errors.Is(err, qbroker.ErrNotFound) {
		t.Fatalf("Leader after elect resigned: got %v, want ErrNotFound", err)
	}
	stopObserver()
	if err := <-observed; err != nil {
		t.Fatalf("elect --observe ended by Ctrl-C: %v", err)
	}
}

// --lock-delay: a lock or a semaphore's permit taken with a minute's
// delay and released when its command exits is free at once; a bad delay
// is refused.
func TestLockDelayFlag(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	if _, _, err := c.run("", "lock", "--lock-delay", "1m", "L", "--", "true"); err != nil {
		t.Fatalf("lock --lock-delay 1m -- true: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	qc, err := qbroker.Dial(ctx, c.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer qc.Close()
	l, err := qc.Lock(ctx, "L") // the delay would outlast ctx
	if err != nil {
		t.Fatalf("Lock after the command released: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.run("", "sem", "--lock-delay", "1m", "S", "1", "--", "true"); err != nil {
		t.Fatalf("sem --lock-delay 1m S 1 -- true: %v", err)
	}
	p, err := qc.Acquire(ctx, "S", 1) // the delay would outlast ctx
	if err != nil {
		t.Fatalf("Acquire after the command released: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"lock", "--lock-delay", "-1s", "L", "--", "true"},
		{"lock", "--lock-delay", "2m", "L", "--", "true"},
		{"elect", "--lock-delay", "2m", "E", "v"},
		{"sem", "--lock-delay", "-1s", "S", "1", "--", "true"},
		{"sem", "--lock-delay", "2m", "S", "1", "--", "true"},
	} {
		if _, _, err := c.run("", args...); !errors.Is(err, qbroker.ErrInvalidArgument) {
			t.Errorf("%v: got %v, want ErrInvalidArgument", args, err)
		}
	}
}
