// Package zktest gives integration tests a real ZooKeeper: one server per
// test package, started in TestMain, and a unique root path per test.
//
//	func TestMain(m *testing.M) { zktest.Main(m) }
//
//	func TestX(t *testing.T) {
//		conn := zktest.Conn(t)
//		root := zktest.Root(t)
//		...
//	}
//
// Without a ZooKeeper installation tests skip, unless the CI environment
// variable is set: then they fail.
package zktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zkutil"
)

var (
	server   *zkserver.Server
	startErr error
)

// ExampleEnv names the environment variable from which the recipe
// packages' examples read a ZooKeeper server's address; Main sets it to the
// package's server.
const ExampleEnv = "QBROKER_ZK"

// Main starts the package's ZooKeeper server, runs the tests, stops the
// server and checks that no goroutine leaked.
func Main(m *testing.M) {
	if zkserver.Installed() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		server, startErr = zkserver.Start(ctx, zkserver.Config{})
		cancel()
		if startErr == nil {
			// The packages' runnable examples connect to the server
			// named here, as a reader's copy of them would.
			os.Setenv(ExampleEnv, server.Addr())
		}
	} else {
		startErr = zkserver.ErrNotInstalled
	}
	code := m.Run()
	if server != nil {
		_ = server.Close()
	}
	if code == 0 {
		if err := goleak.Find(IgnoreGoroutines()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// IgnoreGoroutines lists goroutines that outlive tests by design.
func IgnoreGoroutines() []goleak.Option {
	return []goleak.Option{
		// glog/klog-style daemons are not used; grpc's and the race
		// detector's background goroutines are.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/resolver/dns.(*dnsResolver).watcher"),
	}
}

// Server returns the package's server, skipping the test when ZooKeeper is
// not installed (failing it when CI is set).
func Server(t testing.TB) *zkserver.Server {
	t.Helper()
	if server == nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("ZooKeeper is required in CI: %v", startErr)
		}
		t.Skipf("ZooKeeper not available: %v", startErr)
	}
	return server
}

// Addr returns the package server's address.
func Addr(t testing.TB) string { return Server(t).Addr() }

// Conn opens a new session to the package's server, closed when the test
// ends.
func Conn(t testing.TB) *zk.Conn {
	t.Helper()
	return ConnTo(t, []string{Addr(t)})
}

// ConnTo opens a session to servers, closed when the test ends.
func ConnTo(t testing.TB, servers []string) *zk.Conn {
	t.Helper()
	conn, err := zkutil.Connect(servers, 4*time.Second, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := zkutil.WaitConnected(conn, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return conn
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// Root returns a unique path for this test, /t/<test>-<random>, not yet
// created.
func Root(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "/t/" + unsafeChars.ReplaceAllString(t.Name(), "_") + "-" + hex.EncodeToString(b[:])
}

// Exists reports whether node p exists; an error fails the test.
func Exists(t testing.TB, conn *zk.Conn, p string) bool {
	t.Helper()
	ok, _, err := conn.Exists(p)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// Owner returns the session owning the ephemeral node p: 0 when there is
// none, or when it cannot be read.
func Owner(conn *zk.Conn, p string) int64 {
	ok, st, err := conn.Exists(p)
	if err != nil || !ok {
		return 0
	}
	return st.EphemeralOwner
}
