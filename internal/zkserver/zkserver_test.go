package zkserver_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zkutil"
)

func TestMain(m *testing.M) {
	if os.Getenv("ZKSERVER_TEST_CHILD") == "1" {
		// The child of TestKilledParentLeavesNoJava: start a server,
		// report its pid, wait to be killed.
		s, err := zkserver.Start(context.Background(), zkserver.Config{})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(s.Pid())
		select {}
	}
	goleak.VerifyTestMain(m)
}

func requireZK(t *testing.T) {
	t.Helper()
	if !zkserver.Installed() {
		if os.Getenv("CI") != "" {
			t.Fatal("ZooKeeper is required in CI")
		}
		t.Skip("ZooKeeper not installed")
	}
}

// running reports whether pid is a live (not zombie) process.
func running(pid int) bool {
	out, err := exec.Command("ps", "-o", "stat=", "-p", strconv.Itoa(pid)).Output()
	st := strings.TrimSpace(string(out))
	return err == nil && st != "" && !strings.HasPrefix(st, "Z")
}

// A test binary killed with SIGKILL (no cleanup runs) leaves no java
// behind: the parent-death signal takes the server down with it.
func TestKilledParentLeavesNoJava(t *testing.T) {
	requireZK(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "ZKSERVER_TEST_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Fscan(out, &pid); err != nil || pid == 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child did not report a server pid: %v", err)
	}
	if !running(pid) {
		t.Fatalf("server %d not running", pid)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if err := retry(10*time.Second, func() error {
		if running(pid) {
			return errors.New("still running")
		}
		return nil
	}); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("java %d survived its killed parent", pid)
	}
}

// A standalone server answers ruok and srvr, and Close leaves no process.
func TestStandalone(t *testing.T) {
	requireZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := zkserver.Start(ctx, zkserver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := zkserver.FourLetter(s.Addr(), "ruok", time.Second); err != nil || out != "imok" {
		t.Fatalf("ruok = %q, %v", out, err)
	}
	if out, _ := zkserver.FourLetter(s.Addr(), "srvr", time.Second); !strings.Contains(out, "Mode: standalone") {
		t.Fatalf("srvr = %q", out)
	}
	pid, dir := s.Pid(), s.Dir()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if running(pid) {
		t.Fatalf("java %d still running after Close", pid)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("data dir %s left behind", dir)
	}
}

// A 3-server ensemble serves clients while one member is down, fails
// without quorum, and recovers when members come back; data survives.
func TestEnsembleQuorum(t *testing.T) {
	requireZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := zkserver.StartCluster(ctx, 3, zkserver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := zkutil.Connect(c.Addrs(), 4*time.Second, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := zkutil.WaitConnected(conn, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Create("/a", []byte("1"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	// Stop the member the session is on: the client moves to another.
	var on *zkserver.Server
	for _, s := range c.Servers {
		if s.Addr() == conn.Server() {
			on = s
		}
	}
	if on == nil {
		t.Fatalf("session on %q, not a member", conn.Server())
	}
	if err := on.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := retry(20*time.Second, func() error { _, err := conn.Create("/b", nil, 0, zk.WorldACL(zk.PermAll)); return err }); err != nil {
		t.Fatalf("write with 2 of 3 members: %v", err)
	}
	// Lose quorum: writes fail.
	var other *zkserver.Server
	for _, s := range c.Servers {
		if s != on && s.Running() {
			other = s
			break
		}
	}
	if err := other.Stop(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := conn.Create("/c", nil, 0, zk.WorldACL(zk.PermAll)); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("write succeeded without quorum")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("write without quorum neither failed nor succeeded")
	}
	// Quorum back: everything written before is there.
	if err := on.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.Start(ctx); err != nil {
		t.Fatal(err)
	}
	err = retry(30*time.Second, func() error {
		data, _, err := conn.Get("/a")
		if err == nil && string(data) != "1" {
			return errors.New("bad data")
		}
		if err == nil {
			_, _, err = conn.Get("/b")
		}
		return err
	})
	if err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}

func retry(within time.Duration, f func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A server that dies on its own is noticed (Exited, ExitError) and leaves
// its reason behind: ZooKeeper's own log lines and the exit status are in
// zookeeper.log in its directory.
func TestDeathIsReported(t *testing.T) {
	requireZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := zkserver.Start(ctx, zkserver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if want := filepath.Join(s.Dir(), zkserver.LogName); s.LogPath() != want {
		t.Fatalf("LogPath = %s, want %s", s.LogPath(), want)
	}
	select {
	case <-s.Exited():
		t.Fatal("Exited closed while the server runs")
	default:
	}
	// A crash, as the OOM killer or an OutOfMemoryError exit would be.
	if err := syscall.Kill(s.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the server's death was not noticed")
	}
	if err := s.ExitError(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("ExitError = %v, want signal: killed", err)
	}
	tail, err := s.LogTail(200)
	if err != nil {
		t.Fatal(err)
	}
	log := strings.Join(tail, "\n")
	for _, want := range []string{"binding to port", "ZooKeeper exited", "signal: killed"} {
		if !strings.Contains(log, want) {
			t.Fatalf("log %s lacks %q:\n%s", s.LogPath(), want, log)
		}
	}
}

// A NoSync server runs with zookeeper.forceSync=no (the JVM's system
// property, set from the configuration file) and serves writes.
func TestNoSync(t *testing.T) {
	requireZK(t)
	if _, err := exec.LookPath("jcmd"); err != nil {
		t.Skip("jcmd (a JDK) reads the server's system properties")
	}
	for _, noSync := range []bool{false, true} {
		s, conn := startConnected(t, zkserver.Config{NoSync: noSync})
		if _, err := conn.Create("/written", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("jcmd", strconv.Itoa(s.Pid()), "VM.system_properties").CombinedOutput()
		if err != nil {
			t.Fatalf("jcmd: %v: %s", err, out)
		}
		if got := strings.Contains(string(out), "zookeeper.forceSync=no"); got != noSync {
			t.Errorf("NoSync %v: zookeeper.forceSync=no set: %v", noSync, got)
		}
	}
}
