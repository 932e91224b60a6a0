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
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reasons []Reason
	l := New(inner, Config{Max: 3, OnRefuse: func(r Reason, _ net.Addr) {
		mu.Lock()
		reasons = append(reasons, r)
		mu.Unlock()
	}})
	defer l.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
			// The server reads what arrives, as gRPC does.
			go func() { _, _ = c.Read(make([]byte, 64)) }()
		}
	}()
	dial := func(data string) (client, server net.Conn) {
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
		case s := <-accepted:
			return c, s
		case <-time.After(10 * time.Second):
			t.Fatal("not accepted")
		}
		return nil, nil
	}
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
	waitGreeted := func(s net.Conn) {
		deadline := time.Now().Add(10 * time.Second)
		for s.(*conn).state.Load() != stateGreeted {
			if time.Now().After(deadline) {
				t.Fatal("preface not seen")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	_, ps := dial(preface)
	waitGreeted(ps)
	l.Proven(ps.RemoteAddr())
	greeted, gs := dial(preface)
	waitGreeted(gs)
	silent, _ := dial("")
	// Full. A new connection evicts the silent one.
	silent2, _ := dial("")
	if !closed(silent) {
		t.Fatal("the silent connection was not evicted")
	}
	// The newer silent one goes before the older greeted one.
	_, hs := dial(preface)
	if !closed(silent2) {
		t.Fatal("a silent connection was not evicted before a greeted one")
	}
	waitGreeted(hs)
	// No silent one left: the oldest greeted one goes.
	_, ss := dial("")
	if !closed(greeted) {
		t.Fatal("the oldest greeted connection was not evicted")
	}
	// All proven: a new connection is refused.
	l.Proven(hs.RemoteAddr())
	l.Proven(ss.RemoteAddr())
	refused := dialRefused(t, l.Addr().String())
	if !closed(refused) {
		t.Fatal("a connection beyond the bound of proven ones was not refused")
	}
	if l.Open() != 3 {
		t.Fatalf("open = %d, want 3", l.Open())
	}
	want := []Reason{ReasonEvicted, ReasonEvicted, ReasonEvicted, ReasonMaxConns}
	// The refusal is reported just after the connection is closed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(reasons)
		mu.Unlock()
		if n >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reasons) != len(want) {
		t.Fatalf("refusals %v, want %v", reasons, want)
	}
	for i := range want {
		if reasons[i] != want[i] {
			t.Fatalf("refusals %v, want %v", reasons, want)
		}
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
