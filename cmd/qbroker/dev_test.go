package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zktest"
)

// `qbroker dev` notices its ZooKeeper dying: it stops the broker, logs an
// error with the exit status and the log's path, prints the log's last
// lines and fails (a non-zero exit).
func TestDevReportsZooKeeperDeath(t *testing.T) {
	zktest.Server(t) // skips without ZooKeeper, as the package's tests do
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	zk, err := zkserver.Start(ctx, zkserver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer zk.Close()
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	o := serveFlags(fs)
	if err := fs.Parse([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "", "--session-timeout", "4s", "--shutdown-timeout", "2s"}); err != nil {
		t.Fatal(err)
	}
	o.zk = zk.Addr()
	var logs, stderr syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	done := make(chan error, 1)
	go func() { done <- devServe(ctx, o, zk, log, &stderr) }()

	observer := zktest.ConnTo(t, []string{zk.Addr()})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if children, _, err := observer.Children("/qbroker/brokers"); err == nil && len(children) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the broker did not register")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := syscall.Kill(zk.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("dev went on after ZooKeeper died")
	}
	if !errors.Is(err, errZKExited) || !strings.Contains(err.Error(), zk.LogPath()) || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("dev returned %v, want ZooKeeper's death with the exit status and %s", err, zk.LogPath())
	}
	if !strings.Contains(logs.String(), "level=ERROR msg=\"ZooKeeper exited") {
		t.Fatalf("no error logged:\n%s", logs.String())
	}
	if !strings.Contains(stderr.String(), "last lines of "+zk.LogPath()) || !strings.Contains(stderr.String(), "ZooKeeper exited") {
		t.Fatalf("no log tail printed:\n%s", stderr.String())
	}
}

// dev refuses a ZooKeeper heap too small to start, before starting
// anything, as a usage error naming the flag.
func TestDevHeapFlag(t *testing.T) {
	err := commands["dev"].run([]string{"--zk-heap", "16"})
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--zk-heap 16") {
		t.Fatalf("got %v, want a usage error naming --zk-heap 16", err)
	}
}

// dev binds its ports before it starts ZooKeeper: one in use fails at
// once, naming the port and the flag that changes it, and no ZooKeeper
// was started (its data directory holds no log).
func TestDevPortInUse(t *testing.T) {
	zktest.Server(t) // skips without ZooKeeper, as the package's tests do
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := taken.Addr().String()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", busy, "--metrics-listen", ""}, "--listen " + busy + ": listen tcp " + busy + ": bind: address already in use (is another broker, such as make run, on it? pass --listen with another port)"},
		{[]string{"--listen", freeAddr(t), "--metrics-listen", busy}, "--metrics-listen " + busy + ": listen tcp " + busy + ": bind: address already in use (pass --metrics-listen with another port"},
	} {
		dir := t.TempDir()
		err := commands["dev"].run(append(tt.args, "--zk-dir", dir, "--log-level", "error"))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("dev %v: got %v, want %q", tt.args, err, tt.want)
		}
		if _, err := os.Stat(filepath.Join(dir, zkserver.LogName)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("dev %v started ZooKeeper before finding its port in use (stat zookeeper.log: %v)", tt.args, err)
		}
	}
}
