package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/lock"
)

func newMutex(t testing.TB, conn *zk.Conn, p string, opts ...lock.Option) *lock.Mutex {
	t.Helper()
	m, err := lock.NewMutex(conn, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func newRWMutex(t testing.TB, conn *zk.Conn, p string, opts ...lock.Option) *lock.RWMutex {
	t.Helper()
	rw, err := lock.NewRWMutex(conn, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Close() })
	return rw
}

type result struct {
	g   *lock.Grant
	err error
}

// async runs a Lock-like call in the background; its result arrives on
// the channel.
func async(ctx context.Context, f func(context.Context) (*lock.Grant, error)) <-chan result {
	c := make(chan result, 1)
	go func() {
		g, err := f(ctx)
		c <- result{g, err}
	}()
	return c
}

func await(t testing.TB, c <-chan result, what string) result {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return result{}
	}
}

func pending(c <-chan result) bool {
	return len(c) == 0
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func waitClosed(t testing.TB, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func children(t testing.TB, conn *zk.Conn, p string) []string {
	t.Helper()
	c, _, err := conn.Children(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
