package connlimit

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

func TestDefaultMax(t *testing.T) {
	for _, tc := range []struct {
		limit uint64
		want  int
	}{
		{0, 16},
		{100, 16},
		{1024, 896},
		{20000, 18000},
		{1 << 20, maxDefault},
		{^uint64(0), maxDefault},
	} {
		if got := DefaultMax(tc.limit); got != tc.want {
			t.Errorf("DefaultMax(%d) = %d, want %d", tc.limit, got, tc.want)
		}
	}
}

// At the bound, a silent connection makes room before one that sent the
// preface, and a proven one never does: when only proven ones are left,
// the new connection is refused.
func TestEvictionOrder(t *testing.T) {
	l := newTestListener(t, 3)
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	_, ps := l.dial(t, preface)
	waitGreeted(t, ps)
	l.Proven(ps.RemoteAddr())
	greeted, gs := l.dial(t, preface)
	waitGreeted(t, gs)
	silent, _ := l.dial(t, "")
	// Full. A new connection evicts the silent one.
	silent2, _ := l.dial(t, "")
	if !closedByServer(silent) {
		t.Fatal("the silent connection was not evicted")
	}
	// The newer silent one goes before the older greeted one.
	_, hs := l.dial(t, preface)
	if !closedByServer(silent2) {
		t.Fatal("a silent connection was not evicted before a greeted one")
	}
	waitGreeted(t, hs)
	// No silent one left: the oldest greeted one goes.
	_, ss := l.dial(t, "")
	if !closedByServer(greeted) {
		t.Fatal("the oldest greeted connection was not evicted")
	}
	// All proven: a new connection is refused.
	l.Proven(hs.RemoteAddr())
	l.Proven(ss.RemoteAddr())
	refused := dialRefused(t, l.Addr().String())
	if !closedByServer(refused) {
		t.Fatal("a connection beyond the bound of proven ones was not refused")
	}
	if l.Open() != 3 {
		t.Fatalf("open = %d, want 3", l.Open())
	}
	want := []Reason{ReasonEvicted, ReasonEvicted, ReasonEvicted, ReasonMaxConns}
	// The refusal is reported just after the connection is closed.
	reasons := l.waitReasons(len(want), 10*time.Second)
	if len(reasons) != len(want) {
		t.Fatalf("refusals %v, want %v", reasons, want)
	}
	for i := range want {
		if reasons[i] != want[i] {
			t.Fatalf("refusals %v, want %v", reasons, want)
		}
	}
}

// testListener is a Listener of at most limit connections on 127.0.0.1,
// closed when the test ends, that records its refusals and serves what
// it accepts to dial, reading from each as gRPC does.
type testListener struct {
	*Listener
	accepted chan net.Conn // closed when Accept fails

	mu      sync.Mutex
	reasons []Reason
}

func newTestListener(t *testing.T, limit int) *testListener {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &testListener{accepted: make(chan net.Conn, 16)}
	l.Listener = New(inner, Config{Max: limit, OnRefuse: func(r Reason, _ net.Addr) {
		l.mu.Lock()
		l.reasons = append(l.reasons, r)
		l.mu.Unlock()
	}})
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(l.accepted)
				return
			}
			l.accepted <- c
			// The server reads what arrives, as gRPC does.
			go func() { _, _ = c.Read(make([]byte, 64)) }()
		}
	}()
	return l
}

// dial opens a connection (closed when the test ends), sends data on it
// unless it is empty, and returns it with the server's end once accepted.
func (l *testListener) dial(t *testing.T, data string) (client, server net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if data != "" {
		if _, err := c.Write([]byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case s := <-l.accepted:
		return c, s
	case <-time.After(10 * time.Second):
		t.Fatal("not accepted")
	}
	return nil, nil
}

// waitReasons waits up to within for n refusals and returns those seen.
func (l *testListener) waitReasons(n int, within time.Duration) []Reason {
	deadline := time.Now().Add(within)
	for {
		l.mu.Lock()
		got := len(l.reasons)
		l.mu.Unlock()
		if got >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Reason(nil), l.reasons...)
}

// closedByServer reports whether the server closed c within 5s.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// waitGreeted waits until the server's end s saw the HTTP/2 preface.
func waitGreeted(t *testing.T, s net.Conn) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.(*conn).state.Load() != stateGreeted {
		if time.Now().After(deadline) {
			t.Fatal("preface not seen")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dialRefused dials a connection the listener is expected to refuse (it
// is never returned by Accept).
func dialRefused(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
