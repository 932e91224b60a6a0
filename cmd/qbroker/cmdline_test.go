package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/ports"
	"github.com/qbroker/qbroker/internal/zktest"
)

// buildCommand builds qbroker with its version set at link time.
func buildCommand(t *testing.T, version string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "qbroker")
	out, err := exec.Command("go", "build", "-ldflags", "-X main.version="+version, "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// exitRun runs the command and returns its stdout, stderr and exit status.
func exitRun(t *testing.T, bin string, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("qbroker %s: still running after 20s", strings.Join(args, " "))
	case err == nil:
		return out.String(), errOut.String(), 0
	case errors.As(err, &ee):
		return out.String(), errOut.String(), ee.ExitCode()
	default:
		t.Fatalf("qbroker %s: %v", strings.Join(args, " "), err)
	}
	return "", "", -1
}

// Help goes to stdout with status 0; usage errors, and QBROKER_* values or
// flag values that are invalid, go to stderr with status 2 and name the
// offending value, before anything starts.
func TestCommandLine(t *testing.T) {
	bin := buildCommand(t, "v0.0.0-test")
	// A ZooKeeper address where nothing listens: a command that got past
	// its checks would wait for it.
	noZK := "127.0.0.1:1"
	for _, tt := range []struct {
		name   string
		env    []string
		args   []string
		status int
		stdout string // substring; "" means empty
		stderr string // substring; "" means empty
	}{
		{name: "--help", args: []string{"--help"}, stdout: "usage: qbroker <command>"},
		{name: "-h", args: []string{"-h"}, stdout: "usage: qbroker <command>"},
		{name: "help", args: []string{"help"}, stdout: "Run 'qbroker <command> --help'"},
		{name: "help publish", args: []string{"help", "publish"}, stdout: "usage: qbroker publish"},
		{name: "publish --help", args: []string{"publish", "--help"}, stdout: "usage: qbroker publish"},
		{name: "consume -h", args: []string{"consume", "-h"}, stdout: "usage: qbroker consume"},
		{name: "serve --help", args: []string{"serve", "--help"}, stdout: "usage: qbroker serve"},
		{name: "dev --help", args: []string{"dev", "--help"}, stdout: "usage: qbroker dev"},
		{name: "delete --help", args: []string{"delete", "--help"}, stdout: "usage: qbroker delete"},
		{name: "join --help", args: []string{"join", "--help"}, stdout: "usage: qbroker join"},
		{name: "peek -h", args: []string{"peek", "-h"}, stdout: "usage: qbroker peek"},
		{name: "help peek", args: []string{"help", "peek"}, stdout: "usage: qbroker peek"},
		{name: "completion --help", args: []string{"completion", "--help"}, stdout: "usage: qbroker completion bash|zsh|fish"},
		{name: "completion bash", args: []string{"completion", "bash"}, stdout: "complete -F _qbroker qbroker"},
		{name: "completion of no shell", args: []string{"completion"}, status: 2, stderr: "want one shell"},
		{name: "completion of tcsh", args: []string{"completion", "tcsh"}, status: 2, stderr: `unknown shell "tcsh"`},
		{name: "version", args: []string{"version"}, stdout: "qbroker v0.0.0-test "},
		{name: "--version", args: []string{"--version"}, stdout: "qbroker v0.0.0-test "},
		{name: "no command", args: nil, status: 2, stderr: "usage: qbroker <command>"},
		{name: "unknown command", args: []string{"nosuch"}, status: 2, stderr: `unknown command "nosuch"`},
		{name: "unknown flag", args: []string{"publish", "--bogus", "q", "x"}, status: 2, stderr: "flag provided but not defined: -bogus"},
		{name: "missing argument", args: []string{"publish"}, status: 2, stderr: "missing arguments"},
		{name: "too many arguments", args: []string{"consume", "a", "b"}, status: 2, stderr: "too many arguments"},
		{name: "bad flag value", args: []string{"serve", "--zk", noZK, "--max-payload", "big"}, status: 2, stderr: `invalid value "big" for flag -max-payload`},
		{name: "bad integer in env", env: []string{"QBROKER_MAX_PAYLOAD=12x"}, args: []string{"serve", "--zk", noZK}, status: 2, stderr: `$QBROKER_MAX_PAYLOAD="12x"`},
		{name: "bad duration in env", env: []string{"QBROKER_SESSION_TIMEOUT=10"}, args: []string{"serve", "--zk", noZK}, status: 2, stderr: `$QBROKER_SESSION_TIMEOUT="10"`},
		{name: "bad bool in env", env: []string{"QBROKER_PPROF=maybe"}, args: []string{"serve", "--zk", noZK}, status: 2, stderr: `$QBROKER_PPROF="maybe"`},
		{name: "bad env of dev", env: []string{"QBROKER_VISIBILITY_TIMEOUT=soon"}, args: []string{"dev"}, status: 2, stderr: `$QBROKER_VISIBILITY_TIMEOUT="soon"`},
		{name: "negative duration", args: []string{"serve", "--zk", noZK, "--sweep-interval", "-1s"}, status: 2, stderr: "--sweep-interval (or $QBROKER_SWEEP_INTERVAL) -1s"},
		{name: "negative duration in env", env: []string{"QBROKER_SHUTDOWN_TIMEOUT=-5s"}, args: []string{"serve", "--zk", noZK}, status: 2, stderr: "--shutdown-timeout (or $QBROKER_SHUTDOWN_TIMEOUT) -5s"},
		{name: "batch below payload", args: []string{"serve", "--zk", noZK, "--max-payload", "4096", "--max-batch-bytes", "1024"}, status: 2, stderr: "--max-batch-bytes 1024 < --max-payload 4096"},
		{name: "bad log level of dev", args: []string{"dev", "--log-level", "loud"}, status: 2, stderr: "--log-level"},
		{name: "open ZooKeeper tree", args: []string{"serve", "--zk", noZK}, status: 2, stderr: "give --zk-auth-file with a digest credential user:password (mode 0600; see docs/security.md), or --insecure"},
		{name: "payload over the bound", args: []string{"serve", "--zk", noZK, "--max-payload", "2000000"}, status: 2, stderr: "--max-payload (or $QBROKER_MAX_PAYLOAD) 2000000: at most 1032192"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, status := exitRun(t, bin, tt.env, tt.args...)
			if status != tt.status {
				t.Fatalf("exit status %d, want %d\nstdout: %s\nstderr: %s", status, tt.status, out, errOut)
			}
			check := func(stream, got, want string) {
				if want == "" && got != "" {
					t.Errorf("%s: got %q, want nothing", stream, got)
				}
				if !strings.Contains(got, want) {
					t.Errorf("%s: got %q, want %q in it", stream, got, want)
				}
			}
			check("stdout", out, tt.stdout)
			check("stderr", errOut, tt.stderr)
		})
	}
}

// freeAddr returns a loopback address to start a server on, and start it
// again on after a stop (ports.Free).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := ports.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// startServe runs qbroker serve with args (flags as a user types them)
// until the test ends, then stops it and fails the test if serve failed
// or did not stop within 30s. stop stops it earlier, with the same checks;
// calling it again does nothing.
func startServe(t *testing.T, args ...string) (stop func()) {
	t.Helper()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	o := serveFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, o) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-served:
				if err != nil {
					t.Errorf("serve: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("serve did not stop 30s after its context")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// qbroker serve fails at once on a port in use, before it connects to
// ZooKeeper (here nothing listens on the ZooKeeper address, which would
// hold a start for its 30s), for either of its two ports.
func TestServePortInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	noZK := freeAddr(t)
	for _, ports := range [][2]string{{taken.Addr().String(), ""}, {freeAddr(t), taken.Addr().String()}} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		o := serveFlags(fs)
		args := []string{"--zk", noZK, "--root", "/qbroker-test", "--listen", ports[0], "--log-level", "error", "--insecure"}
		if ports[1] != "" {
			args = append(args, "--metrics-listen", ports[1])
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := o.validate(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		err := serve(ctx, o)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			t.Errorf("serve on %v = %v, want address already in use", ports, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("serve on %v failed after %v: it waited for ZooKeeper first", ports, d)
		}
	}
}

// qbroker serve without --nats-url exposes the NATS bridge's metrics (at
// 0), and with --max-payload near the bound, without --max-batch-bytes,
// accepts a publish of that size.
func TestServe(t *testing.T) {
	addr, metrics := freeAddr(t), freeAddr(t)
	stop := startServe(t, "--zk", zktest.Addr(t), "--root", zktest.Root(t), "--listen", addr,
		"--metrics-listen", metrics, "--max-payload", "1024000", "--log-level", "error", "--insecure")

	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no /metrics after 30s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{
		"qbroker_nats_connected 0",
		"qbroker_nats_reconnects_total 0",
		`qbroker_events_published_total{event="published"} 0`,
		`qbroker_events_dropped_total{reason="buffer_full"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics without --nats-url lacks %q", want)
		}
	}

	// The Go profiles are off unless --pprof.
	if resp, err := http.Get("http://" + metrics + "/debug/pprof/"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --pprof: %d, want 404", resp.StatusCode)
	}

	c := cli{t: t, addr: addr}
	c.ok("", "create", "big")
	payload := strings.Repeat("x", 1024000)
	c.ok(payload+"\n", "publish", "--stdin", "big")
	if got := payloads(t, c.ok("", "consume", "-n", "1", "big"), "1"); len(got) != 1 || len(got[0]) != len(payload) {
		t.Errorf("consumed %d messages, want the one of %d bytes", len(got), len(payload))
	}

	stop()
}
