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

// sem runs a command holding permits with the lease in its environment
// and passes its exit status on; it waits while the permits are held by
// others; a lease lost while the command runs stops the command; a bad
// limit is a usage error and a limit other than the semaphore's is
// refused.
func TestSemCommand(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	out, _, err := c.run("", "sem", "--permits", "2", "S", "2", "--", "sh", "-c",
		`echo "$QBROKER_SEM_NAME $QBROKER_SEM_PERMITS $QBROKER_SEM_TOKEN"; exit 3`)
	var es exitStatus
	if !errors.As(err, &es) || es.code != 3 {
		t.Fatalf("sem -- sh exiting 3: got %v, want exit status 3", err)
	}
	f := strings.Fields(out)
	if len(f) != 3 || f[0] != "S" || f[1] != "2" {
		t.Fatalf("the command's output %q, want the semaphore's name, permits and token", out)
	}
	if tok, err := strconv.ParseInt(f[2], 10, 64); err != nil || tok <= 0 {
		t.Fatalf("QBROKER_SEM_TOKEN = %q, want a positive number", f[2])
	}
	var ue usageError
	if _, _, err := c.run("", "sem", "S", "two"); !errors.As(err, &ue) {
		t.Fatalf("sem with a limit that is no number: got %v, want a usage error", err)
	}
	if _, _, err := c.run("", "sem", "S", "3", "--", "true"); !errors.Is(err, qbroker.ErrFailedPrecondition) {
		t.Fatalf("sem with another limit: got %v, want ErrFailedPrecondition", err)
	}
	if _, _, err := c.run("", "sem", "S", "0", "--", "true"); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("sem with limit 0: got %v, want ErrInvalidArgument", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	qc, err := qbroker.Dial(ctx, c.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer qc.Close()
	a, err := qc.Acquire(ctx, "S", 2)
	if err != nil {
		t.Fatal(err)
	}
	b, err := qc.Acquire(ctx, "S", 2)
	if err != nil {
		t.Fatal(err)
	}
	outBuf := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- runSem(ctx, stdio{strings.NewReader(""), outBuf, &bytes.Buffer{}},
			[]string{"--addr", c.addr, "--value", "cli", "S", "2", "--", "sh", "-c", "echo started; exec sleep 60"})
	}()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, outBuf, "started\n")
	hs, err := qc.RevokePermits(ctx, "S", "")
	if err != nil || len(hs) != 2 {
		t.Fatalf("RevokePermits: got %+v, %v; want the command's holder and b", hs, err)
	}
	var mine qbroker.PermitHolder
	for _, h := range hs {
		if string(h.Value) == "cli" {
			mine = h
		}
	}
	if mine.Key == "" || mine.Key == b.Key() {
		t.Fatalf("holders %+v: none is the command's", hs)
	}
	if err := qc.ReleasePermit(ctx, "S", mine.Key, mine.Token); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, qbroker.ErrLost) {
			t.Fatalf("sem after its lease was lost: got %v, want ErrLost", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the command still runs 30s after its lease was lost")
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
