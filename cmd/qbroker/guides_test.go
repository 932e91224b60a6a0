package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/tlsutil"
	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zktest"
)

// The commands of the guides (docs/operations.md, docs/security.md) are
// run as written, so that they cannot drift from what the broker accepts:
// only the addresses they name are replaced by free ones.

// docBlock returns the ```sh block of doc (a path from the repository's
// root) that contains marker.
func docBlock(t *testing.T, doc, marker string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("../..", doc))
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, part := range strings.Split(string(b), "```sh\n")[1:] {
		block, _, ok := strings.Cut(part, "```")
		if ok && strings.Contains(block, marker) {
			found = append(found, block)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d sh blocks contain %q, want 1", doc, len(found), marker)
	}
	return found[0]
}

// replaceAddrs replaces a block's addresses (old, new pairs), each of
// which must occur in s.
func replaceAddrs(t *testing.T, s string, pairs ...string) string {
	t.Helper()
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("the block lacks %s:\n%s", pairs[i], s)
		}
	}
	return strings.NewReplacer(pairs...).Replace(s)
}

// shellLine is a logical line of a block: its continuation lines joined.
type shellLine struct {
	raw     string // as written, with its continuation lines
	code    string // without the trailing comment
	comment string
}

func shellLines(block string) []shellLine {
	var out []shellLine
	var cur []string
	for _, l := range strings.Split(block, "\n") {
		cur = append(cur, l)
		if strings.HasSuffix(l, "\\") {
			continue
		}
		raw := strings.Join(cur, "\n")
		cur = nil
		code, comment := raw, ""
		if i := strings.LastIndex(raw, " # "); i >= 0 {
			code, comment = raw[:i], raw[i+3:]
		} else if strings.HasPrefix(strings.TrimSpace(raw), "#") {
			code, comment = "", strings.TrimSpace(raw)
		}
		out = append(out, shellLine{raw: raw, code: strings.TrimSpace(code), comment: comment})
	}
	return out
}

// guideEnv is the environment the guides' commands run in: the
// process's without QBROKER_* variables, with dir first in PATH.
func guideEnv(dir string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QBROKER_") && !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	return append(append(env, "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH")), extra...)
}

// startScript runs script with bash in dir, in a process group of its
// own that is sent SIGTERM (then SIGKILL) when the test ends.
func startScript(t *testing.T, dir, script string, env []string) *syncBuffer {
	t.Helper()
	var out syncBuffer
	cmd := exec.Command("bash", "-e", "-c", script)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			t.Errorf("the guide's commands did not stop 30s after SIGTERM:\n%s", out.String())
		}
	})
	return &out
}

// buildInto builds qbroker as dir/qbroker.
func buildInto(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "qbroker"), ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The production command of docs/operations.md starts a broker, given the files it
// names (certificate, rules, tokens), against a real ZooKeeper; clients
// reach it with TLS and a token; the ZooKeeper nodes it creates are
// closed to a ZooKeeper client without its credential.
func TestGuideProductionCommand(t *testing.T) {
	zktest.Server(t) // skips without ZooKeeper, as the package's tests do
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	zks, err := zkserver.Start(ctx, zkserver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer zks.Close()

	dir := t.TempDir()
	buildInto(t, filepath.Join(dir, "bin"))
	if err := tlsutil.Generate(dir, "app-1"); err != nil {
		t.Fatal(err)
	}
	tok, line, err := broker.MintToken("ops")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"rules": "ops all *\n", "tokens": line + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	listen := port(t, freeAddr(t))
	script := replaceAddrs(t, docBlock(t, "docs/operations.md", "qbroker serve --zk zk1:2181,zk2:2181,zk3:2181 --zk-auth-file zk-auth --listen 0.0.0.0:7070"),
		"zk1:2181,zk2:2181,zk3:2181", zks.Addr(), "0.0.0.0:7070", "0.0.0.0:"+listen)
	// The default metrics address, not in the command, is moved off 9090.
	out := startScript(t, dir, script, guideEnv(filepath.Join(dir, "bin"), "QBROKER_METRICS_LISTEN="+freeAddr(t)))

	c, err := qbroker.Dial(ctx, "127.0.0.1:"+listen, qbroker.WithTLSFiles(qbroker.TLSFiles{CAFile: filepath.Join(dir, tlsutil.CAFile)}),
		qbroker.WithToken(tok), qbroker.WithCallTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	zktest.WaitFor(t, 90*time.Second, "the production command's broker to serve", func() bool {
		_, err := c.ListQueues(ctx, "")
		return err == nil
	})
	if _, err := c.CreateQueue(ctx, "orders", qbroker.QueueOptions{}); err != nil {
		t.Fatalf("CreateQueue: %v\n%s", err, out.String())
	}
	if _, err := c.Publish(ctx, "orders", []byte("x")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	foreign := zktest.ConnTo(t, []string{zks.Addr()})
	if _, _, err := foreign.Children("/qbroker/queues/orders"); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("a ZooKeeper client without the credential lists the queue's nodes: got %v, want ErrNoAuth", err)
	}
	if _, err := foreign.Create("/qbroker/queues/injected", nil, 0, zk.WorldACL(zk.PermAll)); !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("a ZooKeeper client without the credential creates a node under the root: got %v, want ErrNoAuth", err)
	}
}

// expectedCode is the gRPC code a guide's line's comment says it fails
// with, as "(PermissionDenied)"; "" for a line that succeeds.
var expectedCode = regexp.MustCompile(`\((PermissionDenied|Unauthenticated|Unavailable)\)`)

// The complete example of docs/security.md runs as written, beside a broker
// on make run's ports: the commands before the broker's start, then,
// once it serves, each command, which must succeed or fail as its comment
// says. `make build` is the build of bin/qbroker the test does.
func TestGuideSecurityExample(t *testing.T) {
	zktest.Server(t)
	dir := t.TempDir()
	buildInto(t, filepath.Join(dir, "bin"))
	grpcAddr, metricsAddr := freeAddr(t), freeAddr(t)
	block := replaceAddrs(t, docBlock(t, "docs/security.md", "./bin/qbroker certs --dir sec"),
		"127.0.0.1:7071", grpcAddr, "127.0.0.1:9091", metricsAddr)
	lines := shellLines(block)
	if lines[0].code != "make build" {
		t.Fatalf("the Security example starts with %q, want make build", lines[0].raw)
	}
	lines = lines[1:]
	bg := -1
	for i, l := range lines {
		if strings.HasSuffix(l.code, "&") {
			bg = i
			break
		}
	}
	if bg < 0 {
		t.Fatal("the Security example starts no broker in the background")
	}
	var start []string
	for _, l := range lines[:bg+1] {
		start = append(start, l.raw)
	}
	env := guideEnv(filepath.Join(dir, "bin"))
	out := startScript(t, dir, strings.Join(start, "\n")+"\nwait\n", env)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	zktest.WaitFor(t, 120*time.Second, "the security example's dev broker to serve", func() bool {
		c, err := qbroker.Dial(ctx, grpcAddr, qbroker.WithTLSFiles(qbroker.TLSFiles{CAFile: filepath.Join(dir, "sec", tlsutil.CAFile)}),
			qbroker.WithCallTimeout(2*time.Second))
		if err != nil {
			return false
		}
		defer c.Close()
		return c.Ping(ctx) == nil
	})

	var vars []string
	ran := 0
	for _, l := range lines[bg+1:] {
		if l.code == "" {
			continue
		}
		if regexp.MustCompile(`^[A-Z]+=`).MatchString(l.code) {
			vars = append(vars, l.code)
			continue
		}
		ran++
		cctx, ccancel := context.WithTimeout(ctx, time.Minute)
		cmd := exec.CommandContext(cctx, "bash", "-c", strings.Join(append(vars, l.raw), "\n"))
		cmd.Dir, cmd.Env = dir, env
		got, err := cmd.CombinedOutput()
		ccancel()
		want := expectedCode.FindStringSubmatch(l.comment)
		switch {
		case want == nil && err != nil:
			t.Errorf("%s\nfailed: %v\n%s", l.raw, err, got)
		case want != nil && (err == nil || !strings.Contains(string(got), fmt.Sprintf("(%s)", want[1]))):
			t.Errorf("%s\ngot %v:\n%s\nwant a failure with (%s)", l.raw, err, got, want[1])
		case strings.Contains(l.comment, "speaks TLS") && !strings.Contains(string(got), "speaks TLS"):
			t.Errorf("%s\nsays %s, without \"speaks TLS\"", l.raw, got)
		}
	}
	if ran < 7 {
		t.Errorf("ran %d commands of the Security example after the broker's start, want at least 7", ran)
	}
	if t.Failed() {
		t.Logf("the broker's output:\n%s", out.String())
	}
}
