package main

import (
	"strings"
	"testing"
	"time"
)

// TestHoldLog checks the single-active sweep: overlaps between streams
// are counted, a stream's own intervals never overlap it, and the
// handovers and the longest takeover gap are measured.
func TestHoldLog(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type iv struct{ stream, from, to int }
	tests := []struct {
		name      string
		holds     []iv
		overlaps  int64
		handovers int
		takeover  float64
		streams   int
	}{
		{name: "none"},
		{name: "one stream overlapping itself", holds: []iv{{0, 0, 10}, {0, 5, 20}, {0, 30, 40}}, streams: 1},
		{name: "handovers", holds: []iv{{0, 0, 10}, {0, 10, 20}, {1, 520, 530}, {2, 600, 610}, {2, 615, 700}},
			handovers: 2, takeover: 500, streams: 3},
		{name: "touching is not overlapping", holds: []iv{{0, 0, 10}, {1, 10, 20}}, handovers: 1, streams: 2},
		{name: "overlap", holds: []iv{{0, 0, 10}, {1, 5, 20}, {0, 30, 40}}, overlaps: 1, handovers: 2, takeover: 10, streams: 2},
		// Stream 1 starts inside stream 0's long interval, after a later
		// interval of its own ended: still an overlap.
		{name: "overlap behind own", holds: []iv{{0, 0, 100}, {1, 1, 2}, {1, 50, 60}, {2, 200, 210}}, overlaps: 2, handovers: 2, takeover: 140, streams: 3},
		{name: "end of stream", holds: []iv{{0, 0, 5}, {0, 2, 50}, {1, 40, 60}}, overlaps: 1, handovers: 1, streams: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewChecker(1, true)
			c.holds = newHoldLog()
			for _, h := range tt.holds {
				c.Held(h.stream, at(h.from), at(h.to))
			}
			v := c.Verdict(false)
			a := v.SingleActive
			if a == nil || a.Overlaps != tt.overlaps || a.Handovers != tt.handovers || a.MaxTakeoverMS != tt.takeover || a.Streams != tt.streams {
				t.Fatalf("got %+v, want %d overlaps, %d handovers, takeover %vms, %d streams", a, tt.overlaps, tt.handovers, tt.takeover, tt.streams)
			}
			if v.OK != (tt.overlaps == 0) {
				t.Errorf("verdict OK %v with %d overlaps: %v", v.OK, tt.overlaps, v.Problems)
			}
			if tt.overlaps > 0 && !strings.Contains(strings.Join(v.Problems, "\n"), "single-active overlap") {
				t.Errorf("problems %q do not name the overlap", v.Problems)
			}
		})
	}
	if v := NewChecker(1, true).Verdict(false); v.SingleActive != nil {
		t.Errorf("single-active figures without --single-active: %+v", v.SingleActive)
	}
}
