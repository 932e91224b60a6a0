package main

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Single active consumer (--single-active): the queue is created with
// single_active_consumer, and the checker records, per consumer stream,
// the intervals during which it held a delivery: from the moment the
// consumer took it from its stream to the return of its ack (or nack),
// or to the end of the stream when the settlement failed. The broker
// holds a delivery at least that long (it leased the message before
// sending it and settles it after the ack arrives), so two streams'
// intervals overlapping means two streams held deliveries at once: an
// overlap, which fails the run. A message still buffered in the client
// when the consumer has not taken it yet is not counted as held, so the
// check can miss an overlap shorter than that, never report a false one.
//
// The handovers are the changes of the stream holding deliveries; the
// takeover time of one is the gap from the end of the last interval of
// the stream before to the start of the first of the next.

// holdLog records the intervals of single-active holding. Safe for
// concurrent use.
type holdLog struct {
	mu      sync.Mutex
	streams map[int][]hold
}

type hold struct {
	stream   int
	from, to time.Time
}

func newHoldLog() *holdLog { return &holdLog{streams: map[int][]hold{}} }

// held records that stream held a delivery from from to to. Consecutive
// intervals of a stream that touch are merged.
func (l *holdLog) held(stream int, from, to time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.streams[stream]
	if n := len(s); n > 0 && !from.Before(s[n-1].from) && !from.After(s[n-1].to) {
		if to.After(s[n-1].to) {
			s[n-1].to = to
		}
		return
	}
	l.streams[stream] = append(s, hold{stream: stream, from: from, to: to})
}

// ActiveCheck is the single-active part of the verdict.
type ActiveCheck struct {
	Streams   int `json:"streams"`   // streams that held deliveries
	Handovers int `json:"handovers"` // changes of the stream holding deliveries
	// Overlaps counts intervals that began while another stream held a
	// delivery: 0 expected.
	Overlaps int64 `json:"overlaps"`
	// MaxTakeoverMS is the longest gap of a handover.
	MaxTakeoverMS float64 `json:"max_takeover_ms"`
	problems      problemSet
}

// check sweeps all streams' intervals in order of start.
func (l *holdLog) check() *ActiveCheck {
	l.mu.Lock()
	var all []hold
	for _, s := range l.streams {
		all = append(all, s...)
	}
	a := &ActiveCheck{Streams: len(l.streams)}
	l.mu.Unlock()
	if len(all) == 0 {
		return a
	}
	slices.SortFunc(all, func(x, y hold) int { return x.from.Compare(y.from) })
	t0 := all[0].from
	rel := func(t time.Time) string { return fmt.Sprintf("+%.3fs", t.Sub(t0).Seconds()) }
	// The latest end so far (best) and the latest end of a stream other
	// than best's (second): an interval overlaps another stream's iff the
	// latest end among the other streams' earlier intervals is after its
	// start.
	best, second := hold{stream: -1}, hold{stream: -1}
	cur, curEnd := all[0].stream, all[0].to
	for _, h := range all {
		other := best
		if best.stream == h.stream {
			other = second
		}
		if other.stream >= 0 && other.to.After(h.from) {
			a.problems.add("consumer %d took a delivery at %s while consumer %d held one until %s",
				h.stream, rel(h.from), other.stream, rel(other.to))
		}
		switch {
		case h.stream == best.stream:
			if h.to.After(best.to) {
				best.to = h.to
			}
		case h.to.After(best.to):
			second, best = best, h
		case h.to.After(second.to) || second.stream < 0:
			second = h
		}
		if h.stream != cur {
			a.Handovers++
			if gap := h.from.Sub(curEnd); gap > 0 {
				a.MaxTakeoverMS = max(a.MaxTakeoverMS, float64(gap)/float64(time.Millisecond))
			}
			cur, curEnd = h.stream, h.to
		} else if h.to.After(curEnd) {
			curEnd = h.to
		}
	}
	a.Overlaps = a.problems.n
	return a
}
