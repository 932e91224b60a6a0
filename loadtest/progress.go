package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"
)

// TimelinePoint is one second of the run (the last one may be shorter:
// Seconds says how long).
type TimelinePoint struct {
	T         float64 `json:"t"` // seconds from the start, at the bucket's end
	Seconds   float64 `json:"seconds"`
	Published int64   `json:"published"`
	Delivered int64   `json:"delivered"` // deliveries, redeliveries included
	Acked     int64   `json:"acked,omitempty"`
	Errors    int64   `json:"errors"`
}

// sampler turns the live counters into 1s buckets and a progress line.
// Its goroutine is owned by whoever calls start: cancel the context it was
// given, then wait on done.
type sampler struct {
	live    *liveCounters
	start   time.Time
	out     io.Writer // progress lines; nil: none
	tty     bool
	label   func() string // phase shown in the progress line
	points  []TimelinePoint
	last    TimelinePoint // cumulative counts at the previous tick
	lastAt  time.Time
	done    chan struct{}
	ackMode bool
}

func newSampler(live *liveCounters, start time.Time, out io.Writer, ackMode bool, label func() string) *sampler {
	s := &sampler{live: live, start: start, out: out, label: label, lastAt: start, done: make(chan struct{}), ackMode: ackMode}
	if f, ok := out.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			s.tty = true
		}
	}
	return s
}

// run ticks every second until ctx ends, then takes a last (partial)
// sample and closes done. The timeline may be read once done is closed.
func (s *sampler) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case now := <-t.C:
			s.sample(now)
		case <-ctx.Done():
			if now := time.Now(); now.Sub(s.lastAt) > time.Millisecond {
				s.sample(now)
			}
			if s.out != nil && s.tty {
				fmt.Fprintln(s.out)
			}
			return
		}
	}
}

func (s *sampler) sample(now time.Time) {
	cur := TimelinePoint{
		Published: s.live.published.Load(),
		Delivered: s.live.deliveries.Load(),
		Acked:     s.live.acked.Load(),
		Errors:    s.live.errors.Load(),
	}
	dt := now.Sub(s.lastAt).Seconds()
	p := TimelinePoint{
		T:         now.Sub(s.start).Seconds(),
		Seconds:   dt,
		Published: cur.Published - s.last.Published,
		Delivered: cur.Delivered - s.last.Delivered,
		Acked:     cur.Acked - s.last.Acked,
		Errors:    cur.Errors - s.last.Errors,
	}
	s.points = append(s.points, p)
	s.last, s.lastAt = cur, now
	if s.out == nil {
		return
	}
	line := fmt.Sprintf("%-8s %5.0fs  published %9d (%6.0f/s)  delivered %9d (%6.0f/s)",
		s.label(), p.T, cur.Published, float64(p.Published)/dt, cur.Delivered, float64(p.Delivered)/dt)
	if s.ackMode {
		line += fmt.Sprintf("  acked %9d", cur.Acked)
	}
	backlog := cur.Published - cur.Delivered
	if s.ackMode {
		backlog = cur.Published - cur.Acked
	}
	line += fmt.Sprintf("  backlog %7d  errors %d", backlog, cur.Errors)
	if s.tty {
		fmt.Fprintf(s.out, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(s.out, line)
	}
}
