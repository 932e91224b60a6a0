package zktest_test

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads it back within a generous deadline.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	readExactly(t, c, msg)
}

func readExactly(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read %q: %v", msg, err)
	}
	if string(buf) != msg {
		t.Fatalf("got %q, want %q", buf, msg)
	}
}

// nothingArrives checks that c stays open and silent for a moment: a read
// times out instead of returning data or EOF.
func nothingArrives(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var b [1]byte
	n, err := c.Read(b[:])
	var ne net.Error
	if n != 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read during a stall: %d bytes, %v; want a timeout", n, err)
	}
}

// A stalled proxy carries nothing and closes nothing; after Resume the
// held bytes arrive in order and the connection works on.
func TestProxyStall(t *testing.T) {
	p := zktest.NewProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "before")

	p.Stall()
	if !p.Stalled() {
		t.Fatal("Stalled() = false after Stall")
	}
	if _, err := c.Write([]byte("held-1 ")); err != nil {
		t.Fatal(err)
	}
	nothingArrives(t, c)
	if _, err := c.Write([]byte("held-2")); err != nil {
		t.Fatal(err)
	}
	// A connection made during the stall is accepted, but nothing flows.
	late := dial(t, p.Addr())
	if _, err := late.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	nothingArrives(t, late)

	p.Resume()
	if p.Stalled() {
		t.Fatal("Stalled() = true after Resume")
	}
	readExactly(t, c, "held-1 held-2")
	readExactly(t, late, "late")
	roundTrip(t, c, "after")
}

// Cut closes connections and refuses new ones until Restore.
func TestProxyCut(t *testing.T) {
	p := zktest.NewProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "x")
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var b [1]byte
	if _, err := c.Read(b[:]); err == nil {
		t.Fatal("read from a cut connection succeeded")
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("cut connection not closed")
	}
	p.Restore()
	roundTrip(t, dial(t, p.Addr()), "y")
}

// Stopping a stalled proxy (the test's end) does not hang.
func TestProxyCloseWhileStalled(t *testing.T) {
	p := zktest.NewProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "x")
	p.Stall()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	_ = dial(t, p.Addr())
}
