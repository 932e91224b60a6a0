package zktest

import (
	"github.com/qbroker/qbroker/internal/zkserver"
)

// ServerAddr returns the address of the package's server, for code that
// has no testing.TB, such as runnable examples. It fails when ZooKeeper
// is not installed or did not start.
func ServerAddr() (string, error) {
	if server == nil {
		if startErr == nil {
			return "", zkserver.ErrNotInstalled // Main was not called
		}
		return "", startErr
	}
	return server.Addr(), nil
}
