package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/qbroker/qbroker/internal/zkserver"
)

// A plain publish, consume, ack and lease expiry run no optional
// feature's code, and a publish and a consume stay within their bounds
// of files: pathfiles, built with coverage as `make pathfiles` builds it,
// succeeds and lists each call's files.
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
	bin := filepath.Join(t.TempDir(), "pathfiles")
	build := exec.Command("go", "build", "-cover", "-covermode=atomic",
		"-coverpkg=github.com/qbroker/qbroker/...", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	run := exec.Command(bin)
	run.Env = append(os.Environ(), "GOCOVERDIR="+t.TempDir())
	out, err := run.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("pathfiles: %v", err)
	}
}
