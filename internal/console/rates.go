package console

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Rates.
//
// A queue's publish and delivery rates are this broker's: its counters
// qbroker_messages_published_total and qbroker_messages_delivered_total,
// read from the registry whenever a page asks (no goroutine samples in
// the background), compared with the oldest sample kept within
// rateWindow. The console takes its first sample when it starts, so the
// first page already has a rate.

const (
	rateWindow = time.Minute
	rateEvery  = time.Second // samples closer than this are not kept
)

// rate is a queue's messages per second.
type rate struct {
	Publish, Deliver float64
}

type sample struct {
	at       time.Time
	pub, del map[string]float64 // by queue label
}

type rates struct {
	g   prometheus.Gatherer
	now func() time.Time

	mu      sync.Mutex
	samples []sample // oldest first
}

func newRates(g prometheus.Gatherer, now func() time.Time) *rates {
	r := &rates{g: g, now: now}
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

// read returns the rates by queue label and the window they cover; a
// zero window when there is no earlier sample to compare with yet.
func (r *rates) read() (map[string]rate, time.Duration) {
	cur, ok := r.gather()
	if !ok {
		return nil, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.samples) > 1 && cur.at.Sub(r.samples[1].at) >= rateWindow {
		r.samples = r.samples[1:]
	}
	var out map[string]rate
	var window time.Duration
	if len(r.samples) > 0 {
		ref := r.samples[0]
		if dt := cur.at.Sub(ref.at); dt >= rateEvery {
			window = dt
			out = map[string]rate{}
			per := func(now, then float64) float64 {
				if now < then { // not expected of counters; never negative
					return 0
				}
				return (now - then) / dt.Seconds()
			}
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
		}
	}
	if n := len(r.samples); n == 0 || cur.at.Sub(r.samples[n-1].at) >= rateEvery {
		r.samples = append(r.samples, cur)
	}
	return out, window
}
