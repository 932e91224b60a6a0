package console

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Rates.
//
// A queue's publish and delivery rates are this broker's: its counters
// qbroker_messages_published_total and qbroker_messages_delivered_total,
// read from the registry, compared with the oldest sample taken within
// rateWindow. Samples are taken when a page asks and, while the pages are
// viewed, every sampleEvery by a goroutine, which stops rateIdle after the
// last view, or when the console closes or the http.Server serving it
// shuts down: a console nobody looks at reads nothing. The
// console takes its first sample when it starts, so that the first page
// already has a rate; a page viewed after a pause longer than rateWindow
// has none yet (it says so), and the next one a few seconds later has.

const (
	rateWindow  = time.Minute      // a rate covers at most this
	rateGap     = time.Second      // samples closer than this are not kept
	sampleEvery = 5 * time.Second  // the sampler's period
	rateIdle    = 10 * time.Minute // the sampler stops this long after the last view
)

// rate is a queue's messages per second.
type rate struct {
	Publish, Deliver float64
}

type sample struct {
	at       time.Time
	pub, del map[string]float64 // by queue label
}

// rates is safe for concurrent use.
type rates struct {
	g     prometheus.Gatherer
	now   func() time.Time
	every time.Duration // the sampler's period; 0: no sampler (tests call tick)

	mu       sync.Mutex
	samples  []sample // oldest first, none older than rateWindow before the newest
	lastView time.Time
	running  bool // the sampler runs
	closed   bool
	stop     chan struct{} // closed by close
	wg       sync.WaitGroup
}

func newRates(g prometheus.Gatherer, now func() time.Time) *rates {
	r := &rates{g: g, now: now, stop: make(chan struct{})}
	if s, ok := r.gather(); ok {
		r.samples = append(r.samples, s)
	}
	return r
}

// gather reads the counters; false when the registry cannot be read.
func (r *rates) gather() (sample, bool) {
	s := sample{at: r.now(), pub: map[string]float64{}, del: map[string]float64{}}
	mfs, err := r.g.Gather()
	if err != nil && len(mfs) == 0 {
		return s, false
	}
	for _, mf := range mfs {
		var into map[string]float64
		switch mf.GetName() {
		case "qbroker_messages_published_total":
			into = s.pub
		case "qbroker_messages_delivered_total":
			into = s.del
		default:
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" {
					into[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return s, true
}

// add keeps s, and drops the samples it makes older than rateWindow.
// Called with mu held.
func (r *rates) add(s sample) {
	drop := 0
	for drop < len(r.samples) && s.at.Sub(r.samples[drop].at) > rateWindow {
		drop++
	}
	r.samples = slices.Delete(r.samples, 0, drop)
	if n := len(r.samples); n == 0 || s.at.Sub(r.samples[n-1].at) >= rateGap {
		r.samples = append(r.samples, s)
	}
}

// since returns the rates from the oldest sample within rateWindow
// before cur, and the time they cover; none and 0 when there is no such
// sample (at least rateGap before cur). Called with mu held.
func (r *rates) since(cur sample) (map[string]rate, time.Duration) {
	for _, ref := range r.samples {
		dt := cur.at.Sub(ref.at)
		if dt > rateWindow {
			continue
		}
		if dt < rateGap {
			return nil, 0
		}
		per := func(now, then float64) float64 {
			if now < then { // not expected of counters; never negative
				return 0
			}
			return (now - then) / dt.Seconds()
		}
		out := map[string]rate{}
		for q, v := range cur.pub {
			x := out[q]
			x.Publish = per(v, ref.pub[q])
			out[q] = x
		}
		for q, v := range cur.del {
			x := out[q]
			x.Deliver = per(v, ref.del[q])
			out[q] = x
		}
		return out, dt
	}
	return nil, 0
}

// read returns the rates by queue label and the time they cover, at
// most rateWindow; a zero duration when there is no sample to compare
// with yet. It starts the sampler.
func (r *rates) read() (map[string]rate, time.Duration) {
	cur, ok := r.gather()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.viewed()
	if !ok {
		return nil, 0
	}
	out, window := r.since(cur)
	r.add(cur)
	return out, window
}

// viewed notes a view and starts the sampler unless it runs. Called with
// mu held.
func (r *rates) viewed() {
	r.lastView = r.now()
	if r.every <= 0 || r.running || r.closed {
		return
	}
	r.running = true
	r.wg.Add(1)
	go r.sample()
}

// sample is the sampler: a tick every r.every until close, or until the
// pages have not been viewed for rateIdle.
func (r *rates) sample() {
	defer r.wg.Done()
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		if !r.tick() {
			return
		}
	}
}

// tick takes a sample; false, and the sampler marked stopped, when the
// pages have not been viewed for rateIdle.
func (r *rates) tick() bool {
	s, ok := r.gather()
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok {
		r.add(s)
	}
	if r.now().Sub(r.lastView) > rateIdle {
		r.running = false
		return false
	}
	return true
}

// halt tells the sampler to stop, and keeps it from starting again.
func (r *rates) halt() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		close(r.stop)
	}
}

// close stops the sampler and waits for it.
func (r *rates) close() {
	r.halt()
	r.wg.Wait()
	r.mu.Lock()
	r.running = false
	r.mu.Unlock()
}

// formatRate shows a rate with two significant digits, and no decimals
// from 10 on: 0.017, 0.05, 2.5, 12, 340; 0 as 0.
func formatRate(x float64) string {
	if x <= 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return "0"
	}
	d := max(0, 1-int(math.Floor(math.Log10(x))))
	p := math.Pow(10, float64(d))
	return strconv.FormatFloat(math.Round(x*p)/p, 'f', -1, 64)
}
