package zktest

import (
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// WaitFor polls cond every 10 ms until it holds, and fails the test when d
// passes first. Tests wait for conditions this way, never for a sleep.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Deletions counts, per path, the NodeDeleted events a session's watches
// received: how herd-free recipes show that a release woke one waiter.
type Deletions struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *Deletions) onEvent(ev zk.Event) {
	if ev.Type == zk.EventNodeDeleted {
		d.mu.Lock()
		d.n[ev.Path]++
		d.mu.Unlock()
	}
}

// Count returns the NodeDeleted events received for p.
func (d *Deletions) Count(p string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[p]
}

// ConnCounting opens a session to servers whose watches' NodeDeleted
// events are counted; it is closed when the test ends.
func ConnCounting(t testing.TB, servers []string, timeout time.Duration) (*zk.Conn, *Deletions) {
	t.Helper()
	d := &Deletions{n: map[string]int{}}
	conn, err := zkutil.Connect(servers, timeout, nil, d.onEvent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if err := zkutil.WaitConnected(conn, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return conn, d
}
