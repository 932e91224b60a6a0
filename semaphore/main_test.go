package semaphore_test

import (
	"os"
	"testing"

	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		// Re-executed by TestKilledHolder: hold a permit until killed.
		os.Exit(holdUntilKilled())
	}
	zktest.Main(m)
}
