package qbroker_test

import (
	"flag"
	"os"
	"testing"

	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) {
	// The runnable examples need ZooKeeper and cannot skip themselves:
	// without it (and outside CI, where it is required), leave them out
	// like the tests, which skip.
	flag.Parse()
	if !zkserver.Installed() && os.Getenv("CI") == "" {
		_ = flag.Set("test.skip", "^Example")
	}
	zktest.Main(m)
}
