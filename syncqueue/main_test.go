package syncqueue_test

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"

	"testing"
)

func TestMain(m *testing.M) { zktest.Main(m) }

// exampleSession connects an Example to the package's test server and
// returns a fresh path below /examples. cleanup removes the path and closes
// the session. Examples need ZooKeeper: without it they fail loudly.
func exampleSession(name string) (conn *zk.Conn, root string, cleanup func()) {
	addr, err := zktest.ServerAddr()
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
		_ = zkutil.DeleteTree(conn, root)
		conn.Close()
	}
}
