package broker

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
)

// The budget against a real server: known, it refuses what would pass it
// and counts what it admits until the next read; unknown (no server
// answers, or the last answer is stale) it admits, and says so on the
// gauge.
func TestZKMemoryAdmit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var gauge float64
	m := newZKMemory([]string{zktest.Addr(t)}, 1, slog.New(slog.DiscardHandler), func(v float64) { gauge = v })
	if err := m.admit(1 << 30); err != nil {
		t.Fatalf("never read: got %v, want admitted", err)
	}
	if err := m.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if gauge < NodeCharge*4 {
		t.Fatalf("gauge %v: want at least the charge of a few znodes", gauge)
	}
	used := m.used
	m.budget = used + 1000
	if err := m.admit(600); err != nil {
		t.Fatalf("within the budget: %v", err)
	}
	err := m.admit(600)
	if !errors.Is(err, errLimit) || !strings.Contains(err.Error(), "--zk-data-budget") {
		t.Fatalf("past the budget with what was admitted: got %v, want errLimit naming --zk-data-budget", err)
	}
	// The admitted bytes were never written: the next read forgets them.
	if err := m.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.admit(600); err != nil {
		t.Fatalf("after a read: %v", err)
	}
	m.readAt = time.Now().Add(-2 * dataStale)
	if err := m.admit(1 << 30); err != nil {
		t.Fatalf("stale: got %v, want admitted", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	down := newZKMemory([]string{dead}, 1, slog.New(slog.DiscardHandler), func(v float64) { gauge = v })
	if err := down.refresh(ctx); err == nil {
		t.Fatal("refresh without a server succeeded")
	}
	if err := down.admit(1 << 30); err != nil {
		t.Fatalf("unknown: got %v, want admitted", err)
	}
	// One server answering of two is enough.
	both := newZKMemory([]string{dead, zktest.Addr(t)}, 1, slog.New(slog.DiscardHandler), func(float64) {})
	if err := both.refresh(ctx); err != nil {
		t.Fatalf("one server of two: %v", err)
	}
	if err := both.admit(1); !errors.Is(err, errLimit) {
		t.Fatalf("one server of two, past the budget: got %v, want errLimit", err)
	}
}
