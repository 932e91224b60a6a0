package proccpu

import (
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses.
	stat := "4242 (java (zk) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 130 0 0 20 0 40 0 12345 0 0"
	got, err := ParseStat(stat)
	if want := 3800 * time.Millisecond; err != nil || got != want {
		t.Errorf("got %v, %v, want %v", got, err, want)
	}
	if _, err := ParseStat("garbage"); err == nil {
		t.Error("got no error for garbage")
	}
}
