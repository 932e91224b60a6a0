package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/qbroker/qbroker/internal/zkserver"
)

// The plain message's path runs no optional feature's code: pathcover,
// built with coverage as docs/design.md says, succeeds and lists each
// step's files.
func TestPlainPathCrossesNoFeature(t *testing.T) {
	if !zkserver.Installed() {
		if os.Getenv("CI") != "" {
			t.Fatal("ZooKeeper is required in CI")
		}
		t.Skip("ZooKeeper is not installed")
	}
	if testing.Short() {
		t.Skip("builds a coverage binary")
	}
	bin := filepath.Join(t.TempDir(), "pathcover")
	build := exec.Command("go", "build", "-cover", "-covermode=atomic",
		"-coverpkg=github.com/qbroker/qbroker/zkqueue/...,github.com/qbroker/qbroker/internal/pathcover",
		"-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	run := exec.Command(bin)
	run.Env = append(os.Environ(), "GOCOVERDIR="+t.TempDir())
	out, err := run.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("pathcover: %v", err)
	}
}
