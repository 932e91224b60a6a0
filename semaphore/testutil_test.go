package semaphore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/semaphore"
)

func newSem(t testing.TB, conn *zk.Conn, p string, limit int, opts ...semaphore.Option) *semaphore.Semaphore {
	t.Helper()
	s, err := semaphore.New(conn, p, limit, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

type result struct {
	l   *semaphore.Lease
	err error
}

// async runs an Acquire in the background; its result arrives on the
// channel.
func async(ctx context.Context, s *semaphore.Semaphore, n int) <-chan result {
	c := make(chan result, 1)
	go func() {
		l, err := s.Acquire(ctx, n)
		c <- result{l, err}
	}()
	return c
}

func await(t testing.TB, c <-chan result, what string) *semaphore.Lease {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.l
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		return nil
	}
}

// stillWaiting fails the test when the Acquire behind c has returned.
func stillWaiting(t testing.TB, c <-chan result, what string) {
	t.Helper()
	select {
	case r := <-c:
		t.Fatalf("%s returned (%v, %v), want it still waiting", what, r.l, r.err)
	default:
	}
}

func children(t testing.TB, conn *zk.Conn, p string) []string {
	t.Helper()
	c, _, err := conn.Children(p)
	if err != nil {
		t.Fatalf("children %s: %v", p, err)
	}
	slices.Sort(c)
	return c
}

// waitersOf returns the number of waiters in the semaphore at p.
func waitersOf(t testing.TB, conn *zk.Conn, p string) int { return len(children(t, conn, p+"/queue")) }

func release(t testing.TB, ctx context.Context, l *semaphore.Lease) {
	t.Helper()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
