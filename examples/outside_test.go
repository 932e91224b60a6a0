package examples_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
)

// The recipe packages, whose examples the outside module runs.
var recipes = []string{"zkqueue", "priority", "syncqueue", "lock", "election", "twophase", "counter"}

// The outside module (outside/) builds with the released go-zookeeper from
// the module proxy, and its program runs a FIFO queue, a lock, an
// election and a counter against a real ZooKeeper, its queue's consumer
// reading a getData per message. The recipe packages' own examples pass built the
// same way. With qbroker's patched client replaced in, the same program
// reads in multiRead requests. A recipe package that used a type or
// method only the patched client has would fail the first build.
func TestOutsideModule(t *testing.T) {
	addr := zktest.Addr(t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the outside module: %v", err)
	}
	checkout, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()

	// A copy, so that the go command may write go.mod and go.sum (the
	// recipes' tests need goleak) without touching the checkout, whose
	// replace then names the checkout by its absolute path.
	dir := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join("outside", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goflags, err := exec.CommandContext(ctx, goBin, "env", "GOFLAGS").Output()
	if err != nil {
		t.Fatalf("go env GOFLAGS: %v", err)
	}
	env := append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local",
		"GOFLAGS="+strings.TrimSpace(strings.TrimSpace(string(goflags))+" -mod=mod"), zktest.ExampleEnv+"="+addr)
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run(goBin, "mod", "edit", "-replace=github.com/qbroker/qbroker="+checkout)

	// The committed go.mod and go.sum are what go mod tidy makes of them:
	// the released go-zookeeper comes from the module proxy.
	cmd := exec.CommandContext(ctx, goBin, "mod", "tidy", "-diff")
	cmd.Dir, cmd.Env = dir, env
	if out, err := cmd.CombinedOutput(); err != nil {
		if os.Getenv("CI") == "" && offline(string(out)) {
			t.Skipf("the module proxy is not reachable:\n%s", out)
		}
		t.Fatalf("go mod tidy -diff in examples/outside: %v\n%s", err, out)
	}
	if out := run(goBin, "list", "-m", "-f", "{{.Path}} {{.Version}} {{.Replace}}", "github.com/go-zookeeper/zk"); strings.TrimSpace(out) != "github.com/go-zookeeper/zk v1.0.4 <nil>" {
		t.Fatalf("the outside module's go-zookeeper is %q, want the release v1.0.4", out)
	}

	bin := filepath.Join(dir, "outside")
	run(goBin, "vet", ".")
	run(goBin, "build", "-o", bin, ".")
	gets, multiReads := runOutside(t, run, bin, zktest.Root(t))
	if gets == 0 || multiReads != 0 {
		t.Errorf("with the released go-zookeeper: %d getData and %d multiRead requests, want getData only", gets, multiReads)
	}

	args := []string{"test", "-count=1", "-run", "Example"}
	for _, r := range recipes {
		args = append(args, "github.com/qbroker/qbroker/"+r)
	}
	t.Log(run(goBin, args...))

	// The same program with the patched client in place of the release.
	run(goBin, "mod", "edit", "-replace=github.com/go-zookeeper/zk="+filepath.Join(checkout, "third_party", "go-zookeeper"))
	run(goBin, "build", "-o", bin, ".")
	if gets, multiReads := runOutside(t, run, bin, zktest.Root(t)); multiReads == 0 {
		t.Errorf("with the patched go-zookeeper: %d getData and no multiRead requests", gets)
	}
}

var (
	readsLine = regexp.MustCompile(`read with (\d+) getData and (\d+) multiRead requests`)
	okLine    = regexp.MustCompile(`(?m)^ok$`)
)

// runOutside runs the outside program under root and returns how its
// queue's consumer read the messages.
func runOutside(t *testing.T, run func(string, ...string) string, bin, root string) (gets, multiReads int) {
	t.Helper()
	out := run(bin, "-root", root)
	t.Logf("outside:\n%s", out)
	m := readsLine.FindStringSubmatch(out)
	if m == nil || !okLine.MatchString(out) {
		t.Fatalf("outside printed %q", out)
	}
	gets, _ = strconv.Atoi(m[1])
	multiReads, _ = strconv.Atoi(m[2])
	return gets, multiReads
}

// offline reports whether the go command's output says the network is
// unreachable.
func offline(out string) bool {
	for _, s := range []string{"dial tcp", "lookup ", "i/o timeout", "GOPROXY=off", "network is unreachable"} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
}
