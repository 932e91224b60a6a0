package main

import (
	"math"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latencies are recorded in microseconds, from 1µs to 10 minutes, with 3
// significant digits. A histogram is not safe for concurrent use: each
// producer and consumer records into its own, merged when they are done.
const (
	histMin    = 1
	histMax    = int64(10 * time.Minute / time.Microsecond)
	histDigits = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histDigits) }

// record adds d, clamped into the histogram's range (a clock step can make
// an end-to-end latency negative).
func record(h *hdrhistogram.Histogram, d time.Duration) {
	us := d.Microseconds()
	_ = h.RecordValue(min(max(us, histMin), histMax))
}

// mergeHists merges hs into a new histogram.
func mergeHists(hs []*hdrhistogram.Histogram) *hdrhistogram.Histogram {
	out := newHist()
	for _, h := range hs {
		out.Merge(h)
	}
	return out
}

// LatencySummary is a latency distribution in milliseconds.
type LatencySummary struct {
	Count  int64   `json:"count"`
	MeanMS float64 `json:"mean_ms"`
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	P999MS float64 `json:"p99_9_ms"`
	MaxMS  float64 `json:"max_ms"`
	// CDF: the latency at percentiles from 0 to 100, thinned to at most
	// cdfPoints points, for plotting.
	CDF []CDFPoint `json:"cdf,omitempty"`
	// Histogram: counts in logarithmic buckets, for plotting.
	Histogram []HistBucket `json:"histogram,omitempty"`
}

// CDFPoint is one point of a latency CDF.
type CDFPoint struct {
	Percentile float64 `json:"percentile"`
	MS         float64 `json:"ms"`
}

// HistBucket counts latencies in [FromMS, ToMS).
type HistBucket struct {
	FromMS float64 `json:"from_ms"`
	ToMS   float64 `json:"to_ms"`
	Count  int64   `json:"count"`
}

const cdfPoints = 200

func usToMS(us int64) float64 { return float64(us) / 1000 }

// summarize turns a histogram into a LatencySummary.
func summarize(h *hdrhistogram.Histogram) LatencySummary {
	s := LatencySummary{Count: h.TotalCount()}
	if s.Count == 0 {
		return s
	}
	s.MeanMS = h.Mean() / 1000
	s.P50MS = usToMS(h.ValueAtQuantile(50))
	s.P90MS = usToMS(h.ValueAtQuantile(90))
	s.P99MS = usToMS(h.ValueAtQuantile(99))
	s.P999MS = usToMS(h.ValueAtQuantile(99.9))
	s.MaxMS = usToMS(h.Max())
	s.CDF = cdf(h)
	s.Histogram = logBuckets(h)
	return s
}

// cdf samples the distribution at percentiles spaced evenly in "nines"
// (-log10(1-p)), so the tail gets as many points as the body.
func cdf(h *hdrhistogram.Histogram) []CDFPoint {
	out := make([]CDFPoint, 0, cdfPoints+1)
	const maxNines = 5 // 99.999%
	for i := 0; i <= cdfPoints; i++ {
		nines := maxNines * float64(i) / cdfPoints
		p := 100 * (1 - math.Pow(10, -nines))
		out = append(out, CDFPoint{Percentile: p, MS: usToMS(h.ValueAtQuantile(p))})
	}
	out = append(out, CDFPoint{Percentile: 100, MS: usToMS(h.Max())})
	return out
}

// logBuckets counts values in buckets of 1, 2, 5 × 10^k microseconds.
func logBuckets(h *hdrhistogram.Histogram) []HistBucket {
	var edges []int64
	for e := int64(1); e <= histMax; e *= 10 {
		edges = append(edges, e, 2*e, 5*e)
	}
	counts := make([]int64, len(edges))
	for _, b := range h.Distribution() {
		if b.Count == 0 {
			continue
		}
		i := 0
		for i+1 < len(edges) && edges[i+1] <= b.From {
			i++
		}
		counts[i] += b.Count
	}
	first, last := -1, -1
	for i, n := range counts {
		if n > 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return nil
	}
	out := make([]HistBucket, 0, last-first+1)
	for i := first; i <= last; i++ {
		to := edges[i] * 2
		if i+1 < len(edges) {
			to = edges[i+1]
		}
		out = append(out, HistBucket{FromMS: usToMS(edges[i]), ToMS: usToMS(to), Count: counts[i]})
	}
	return out
}
