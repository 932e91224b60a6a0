package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// barrierCmd runs "qbroker barrier args..." against addr and returns its
// stdout and error.
func barrierCmd(ctx context.Context, addr string, args ...string) (string, error) {
	out := &syncBuffer{}
	err := runBarrier(ctx, stdio{strings.NewReader(""), out, &bytes.Buffer{}},
		append([]string{"--addr", addr, "--timeout", "5s"}, args...))
	return out.String(), err
}

// stillRunning fails if one of the commands ended.
func stillRunning(t *testing.T, what string, done chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s ended (%v) too soon", what, err)
	default:
	}
}

// barrier set/wait/remove: wait holds until remove. barrier wait name
// count returns once count participants met. barrier enter runs its
// command inside the double barrier and passes its status on. Bad
// arguments are usage errors or the broker's InvalidArgument.
func TestBarrierCommand(t *testing.T) {
	addr := startBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	qc, err := qbroker.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer qc.Close()

	if _, err := barrierCmd(ctx, addr, "set", "B"); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { _, err := barrierCmd(ctx, addr, "wait", "B"); waited <- err }()
	short, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if err := qc.WaitBarrier(short, "B"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the barrier after set: WaitBarrier got %v, want DeadlineExceeded", err)
	}
	scancel()
	stillRunning(t, "barrier wait B while set", waited)
	if _, err := barrierCmd(ctx, addr, "remove", "B"); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("barrier wait B after remove: %v", err)
	}

	// Two commands and this test's participant meet at W.
	met := make(chan error, 2)
	for range 2 {
		go func() { _, err := barrierCmd(ctx, addr, "wait", "W", "3"); met <- err }()
	}
	p, err := qc.EnterBarrier(ctx, "W", 3) // returns once both commands arrived
	if err != nil {
		t.Fatal(err)
	}
	stillRunning(t, "barrier wait W 3 before its participants left", met)
	if err := p.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-met; err != nil {
			t.Fatalf("barrier wait W 3: %v", err)
		}
	}

	type result struct {
		out string
		err error
	}
	ran := make(chan result, 2)
	for range 2 {
		go func() {
			out, err := barrierCmd(ctx, addr, "enter", "E", "2", "--", "sh", "-c", `echo "$QBROKER_BARRIER_NAME $QBROKER_BARRIER_KEY"; exit 3`)
			ran <- result{out, err}
		}()
	}
	for range 2 {
		r := <-ran
		var es exitStatus
		if !errors.As(r.err, &es) || es.code != 3 {
			t.Fatalf("barrier enter -- sh exiting 3: got %v, want exit status 3", r.err)
		}
		if f := strings.Fields(r.out); len(f) != 2 || f[0] != "E" || !strings.HasPrefix(f[1], "p@") {
			t.Fatalf("the command's output %q, want the barrier's name and key", r.out)
		}
	}

	for _, args := range [][]string{{"wait", "W", "0"}, {"wait", "W", "x"}, {"frob", "W"}, {"set", "W", "2"}, {"enter", "E", "2"}} {
		var ue usageError
		if _, err := barrierCmd(ctx, addr, args...); !errors.As(err, &ue) {
			t.Errorf("barrier %v: got %v, want a usage error", args, err)
		}
	}
	for _, args := range [][]string{{"set", "bad/name"}, {"wait", "W", "1001"}} {
		if _, err := barrierCmd(ctx, addr, args...); !errors.Is(err, qbroker.ErrInvalidArgument) {
			t.Errorf("barrier %v: got %v, want ErrInvalidArgument", args, err)
		}
	}
}
