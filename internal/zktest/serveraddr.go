package zktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zkutil"
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

// ExampleSession opens a session to the package's server for a runnable
// example (which has no testing.TB) and returns a unique root for it and a
// cleanup func that deletes the root and closes the session. It panics
// when no server runs: an example cannot skip.
func ExampleSession(name string) (conn *zk.Conn, root string, cleanup func()) {
	addr, err := ServerAddr()
	if err != nil {
		panic("example " + name + " needs a ZooKeeper server: " + err.Error())
	}
	conn, err = zkutil.Connect([]string{addr}, 4*time.Second, nil, nil)
	if err != nil {
		panic(err)
	}
	if err := zkutil.WaitConnected(conn, 10*time.Second); err != nil {
		panic(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	root = "/examples/" + name + "-" + hex.EncodeToString(b[:])
	return conn, root, func() {
		_ = zkutil.DeleteTree(context.Background(), conn, root, nil)
		conn.Close()
	}
}
