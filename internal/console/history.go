package console

import (
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// History.
//
// The queue page charts a queue's publish, deliver, ack and dead-letter
// rates and its depth over the last hour. The samples come from the
// registry the broker's metrics are on, read by one goroutine every
// Config.ChartInterval (default chartEvery) from New until Close:
//
//	qbroker_messages_published_total{queue}     publish rate
//	qbroker_messages_delivered_total{queue}     deliver rate (both modes)
//	qbroker_messages_acked_total{queue}         ack rate
//	qbroker_messages_dead_lettered_total{queue} dead-letter rate
//	qbroker_queue_depth{queue}                  depth (ready messages)
//
// The counters are the ones the broker keeps on its message path anyway,
// and the depth gauge is the one its stats loop refreshes every
// StatsInterval for the queues it serves: the sampler makes no ZooKeeper
// request at all (it has no connection to make one with) and adds nothing
// to the message path. Rates are this broker's; depth is the queue's, as
// ZooKeeper last told this broker.
//
// Memory is bounded: a ring of historyPoints(interval) samples (at most
// maxChartPoints+1) per queue, five float32 values each, for at most
// maxChartQueues queues (first seen first kept; the broker's queue label
// is capped as well, MaxQueueLabels): 361 x 5 x 4 B ~ 7.2 KB a queue,
// 7.9 KB with the maps (BenchmarkHistoryTick), ~8 MB for 1,000 queues.

const (
	chartSpan      = time.Hour        // what the charts cover at the default interval
	chartEvery     = 10 * time.Second // default Config.ChartInterval
	maxChartPoints = 360              // intervals a ring holds: at most an hour at 10 s
	maxChartQueues = 1000             // queues charted at most
)

// The charted values, in the order a series keeps them.
const (
	valPublish = iota
	valDeliver
	valAck
	valDead
	valDepth
	nVals
)

// counterOf names the counter each rate comes from.
var counterOf = [...]string{
	valPublish: "qbroker_messages_published_total",
	valDeliver: "qbroker_messages_delivered_total",
	valAck:     "qbroker_messages_acked_total",
	valDead:    "qbroker_messages_dead_lettered_total",
	valDepth:   "qbroker_queue_depth",
}

// historyPoints is how many samples a ring holds at interval every: an
// hour and one, at most maxChartPoints+1, at least 3.
func historyPoints(every time.Duration) int {
	n := int(chartSpan / every)
	return min(max(n, 2), maxChartPoints) + 1
}

// series is one queue's ring. vals[v][i] is value v at sample i (mod
// the ring's length); NaN where unknown.
type series struct {
	vals    [nVals][]float32
	prev    [valDepth]float64 // the counters at the previous sample
	hasPrev [valDepth]bool    // prev holds a value to compare with
}

// history samples the registry and keeps the rings. It is safe for
// concurrent use.
type history struct {
	g     prometheus.Gatherer
	now   func() time.Time
	every time.Duration
	n     int // ring length
	limit int // queues kept at most

	mu      sync.Mutex
	at      []time.Time // the samples' times, a ring like the series'
	taken   int         // samples taken so far
	queues  map[string]*series
	skipped map[string]struct{} // queues over limit, at most limit of them noted

	stop chan struct{}
	done chan struct{}
}

func newHistory(g prometheus.Gatherer, every time.Duration, now func() time.Time) *history {
	n := historyPoints(every)
	return &history{g: g, now: now, every: every, n: n, limit: maxChartQueues, at: make([]time.Time, n),
		queues: map[string]*series{}, skipped: map[string]struct{}{}}
}

// start runs the sampler until close: a sample at once, then one every
// h.every.
func (h *history) start() {
	h.stop, h.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.done)
		t := time.NewTicker(h.every)
		defer t.Stop()
		for {
			h.tick()
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
}

// close stops the sampler and waits for it.
func (h *history) close() {
	if h.stop == nil {
		return
	}
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	<-h.done
}

// read gathers the five values of every queue; false when the registry
// cannot be read.
func (h *history) read() (map[string]*[nVals]float64, bool) {
	mfs, err := h.g.Gather()
	if err != nil && len(mfs) == 0 {
		return nil, false
	}
	out := map[string]*[nVals]float64{}
	for _, mf := range mfs {
		v := -1
		for i, name := range counterOf {
			if mf.GetName() == name {
				v = i
			}
		}
		if v < 0 {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "queue" {
					continue
				}
				x := out[l.GetValue()]
				if x == nil {
					x = &[nVals]float64{}
					for i := range x {
						x[i] = math.NaN()
					}
					out[l.GetValue()] = x
				}
				val := m.GetCounter().GetValue()
				if v == valDepth {
					val = m.GetGauge().GetValue()
				}
				if math.IsNaN(x[v]) {
					x[v] = 0
				}
				x[v] += val
			}
		}
	}
	return out, true
}

// tick takes a sample.
func (h *history) tick() {
	cur, ok := h.read()
	if !ok {
		return
	}
	at := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	i := h.taken % h.n
	var dt float64
	if h.taken > 0 {
		dt = at.Sub(h.at[(h.taken-1)%h.n]).Seconds()
	}
	h.at[i] = at
	h.taken++
	for _, q := range slices.Sorted(maps.Keys(cur)) { // first seen first kept, by name within a sample
		if _, ok := h.queues[q]; ok {
			continue
		}
		if len(h.queues) >= h.limit {
			if len(h.skipped) < h.limit {
				h.skipped[q] = struct{}{}
			}
			continue
		}
		s := &series{}
		for v := range s.vals {
			s.vals[v] = make([]float32, h.n)
			for j := range s.vals[v] {
				s.vals[v][j] = float32(math.NaN())
			}
		}
		// A queue's counters appear at 0 when the broker loads it: one
		// that was not there at the last sample counts from 0 (the
		// first sample has none to compare with).
		s.hasPrev = [valDepth]bool{true, true, true, true}
		h.queues[q] = s
	}
	for q, s := range h.queues {
		x, seen := cur[q]
		for v := range valDepth {
			rate := math.NaN()
			if seen && !math.IsNaN(x[v]) {
				if s.hasPrev[v] && dt > 0 {
					d := x[v] - s.prev[v]
					if d < 0 { // a counter that restarted
						d = x[v]
					}
					rate = d / dt
				}
				s.prev[v], s.hasPrev[v] = x[v], true
			} else {
				s.prev[v], s.hasPrev[v] = 0, true // counts from 0 when it appears
			}
			s.vals[v][i] = float32(rate)
		}
		depth := math.NaN()
		if seen {
			depth = x[valDepth]
		}
		s.vals[valDepth][i] = float32(depth)
	}
}

// point is one sample of one value.
type point struct {
	Ago time.Duration // before the newest sample
	V   float64       // NaN: unknown
}

// window is what the history holds of a queue: its samples oldest first,
// by value, and the time the ring covers.
type window struct {
	Known   bool          // the queue has a series
	Skipped bool          // over the queue limit: not charted
	Span    time.Duration // what a full ring covers
	Every   time.Duration
	Vals    [nVals][]point
}

// get returns queue label q's samples.
func (h *history) get(q string) window {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := window{Span: time.Duration(h.n-1) * h.every, Every: h.every}
	s, ok := h.queues[q]
	if !ok {
		_, w.Skipped = h.skipped[q]
		return w
	}
	w.Known = true
	if h.taken == 0 {
		return w
	}
	newest := h.at[(h.taken-1)%h.n]
	for k := max(0, h.taken-h.n); k < h.taken; k++ {
		i := k % h.n
		ago := newest.Sub(h.at[i])
		for v := range s.vals {
			w.Vals[v] = append(w.Vals[v], point{Ago: ago, V: float64(s.vals[v][i])})
		}
	}
	return w
}
