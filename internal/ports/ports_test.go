package ports

import (
	"net"
	"strconv"
	"testing"
)

// Free gives distinct ports below the ephemeral range that can be bound.
func TestFree(t *testing.T) {
	low := ephemeralLow()
	ps, err := Free(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if seen[p] {
			t.Errorf("port %d given twice", p)
		}
		seen[p] = true
		if low-1-lowest >= 1000 && (p < lowest || p >= low) {
			t.Errorf("port %d outside [%d, %d)", p, lowest, low)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Errorf("port %d: %v", p, err)
			continue
		}
		l.Close()
	}
}

// A process never gets a port twice: a server may not have bound the
// first, or may be stopped for a restart on it. Picks of 6 ports at a
// time collided in about 1 of 1,500 rounds before.
func TestNeverTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 3000 {
		ps, err := Free(1)
		if err != nil {
			t.Fatal(err)
		}
		if seen[ps[0]] {
			t.Fatalf("port %d given twice", ps[0])
		}
		seen[ps[0]] = true
	}
}
