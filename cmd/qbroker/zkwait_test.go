package main

import (
	"context"
	"flag"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// serve with a --zk where nothing listens says at once that it connects
// there, then which server it still waits for and what it answers, and
// gives up after --zk-connect-timeout with an error naming the server and
// the flag, instead of appearing to hang.
func TestServeReportsZooKeeperWait(t *testing.T) {
	noZK := freeAddr(t) // nothing listens there
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	o := serveFlags(fs)
	if err := fs.Parse([]string{"--zk", noZK, "--root", "/qbroker-test", "--listen", freeAddr(t), "--metrics-listen", "",
		"--insecure", "--zk-connect-timeout", "6s"}); err != nil {
		t.Fatal(err)
	}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	served := make(chan error, 1)
	start := time.Now()
	go func() { served <- serveCtx(ctx, o, log) }()
	waitOutput(t, &logs, `msg="connecting to ZooKeeper" zk=`+noZK)
	waitOutput(t, &logs, `msg="still waiting for ZooKeeper" zk="`+noZK+" (connect: connection refused)")
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
		t.Fatalf("serve still waiting for ZooKeeper after %v, with --zk-connect-timeout 6s", time.Since(start))
	}
	for _, want := range []string{"no ZooKeeper session within 6s (--zk-connect-timeout)", noZK + " (connect: connection refused)", "check --zk"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("serve: got %v, want an error with %q", err, want)
		}
	}
}
