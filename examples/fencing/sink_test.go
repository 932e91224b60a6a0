package main

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
)

// A write lands only with a token greater than the row's; a refused
// write changes nothing. Of writers racing with different tokens, the
// greatest token's value stays.
func TestSinkRefusesStaleTokens(t *testing.T) {
	ctx := context.Background()
	s, err := OpenSink(filepath.Join(t.TempDir(), "effects.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	steps := []struct {
		value string
		token uint64
		stale bool
	}{
		{"first", 10, false},
		{"same token", 10, true},
		{"older", 9, true},
		{"newer", 12, false},
		{"old again", 11, true},
	}
	for _, st := range steps {
		err := s.Write(ctx, "m", st.value, st.token)
		if got := errors.Is(err, ErrStale); got != st.stale || (!st.stale && err != nil) {
			t.Fatalf("write %q with token %d: got %v, want stale %v", st.value, st.token, err, st.stale)
		}
	}
	rows, err := s.Rows(ctx)
	if err != nil || len(rows) != 1 || rows[0] != (Row{Key: "m", Value: "newer", Fence: 12}) {
		t.Fatalf("rows: %+v, %v; want m = newer with fence 12", rows, err)
	}
	if err := s.Write(ctx, "m", "at most once", 0); err == nil || errors.Is(err, ErrStale) {
		t.Fatalf("write without a token: got %v, want refused as no token", err)
	}

	var wg sync.WaitGroup
	for tok := uint64(100); tok < 120; tok++ {
		wg.Go(func() {
			if err := s.Write(ctx, "race", "v", tok); err != nil && !errors.Is(err, ErrStale) {
				t.Errorf("write %d: %v", tok, err)
			}
		})
	}
	wg.Wait()
	rows, err = s.Rows(ctx)
	if err != nil || len(rows) != 2 || rows[1].Fence != 119 {
		t.Fatalf("rows after the race: %+v, %v; want race with fence 119", rows, err)
	}
}
