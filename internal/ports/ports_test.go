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
