package console

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// Charts: the queue page draws a queue's history (history.go) as inline
// SVG made here, one small chart a value, no script.

// The charts' drawing area, in SVG user units (the viewBox).
const (
	chartW      = 240.0
	chartH      = 90.0
	chartTop    = 12.0 // above: the scale's label
	chartBottom = 76.0 // below: the time axis' labels
)

// chartView is one chart as the template draws it.
type chartView struct {
	ID      string // publish, deliver, ack, dead, depth: its element id and colour
	Title   string
	Line    string // the SVG path of the values
	Area    string // the path of the area under them
	Top     string // the scale's top, labelled
	Last    string // the newest known value
	Points  int    // known values drawn
	NonZero int    // of them above zero
	Peak    string // the largest value
}

// chartsData is the queue page's charts section.
type chartsData struct {
	On     bool   // the console keeps a history
	Note   string // why there are no charts, or what they lack
	Span   string // the time axis' extent, e.g. "1h"
	Every  string // the sampling interval
	Charts []chartView
}

var chartMeta = [nVals]struct{ id, title string }{
	valPublish: {"publish", "Published/s"},
	valDeliver: {"deliver", "Delivered/s"},
	valAck:     {"ack", "Acked/s"},
	valDead:    {"dead", "Dead-lettered/s"},
	valDepth:   {"depth", "Depth (ready)"},
}

// charts draws window w.
func charts(w window) chartsData {
	d := chartsData{On: true, Span: shortDuration(w.Span), Every: shortDuration(w.Every)}
	switch {
	case w.Skipped:
		d.Note = "Not charted: the console charts at most " + strconv.Itoa(maxChartQueues) + " queues."
		return d
	case !w.Known:
		d.Note = "No sample of this queue yet (the broker's counters of a queue appear when it first serves it); reload in a few seconds. " +
			"A queue past the broker's cap on metric labels (MaxQueueLabels, 1,000 by default; the rest share \"_other\") is not charted."
		return d
	}
	for v := range nVals {
		d.Charts = append(d.Charts, drawChart(chartMeta[v].id, chartMeta[v].title, w.Vals[v], w.Span, v == valDepth))
	}
	return d
}

// drawChart draws the points pts (oldest first) over span: x from -span
// (left) to the newest sample (right), y from 0 to a round top above the
// peak. Unknown values break the line.
func drawChart(id, title string, pts []point, span time.Duration, whole bool) chartView {
	c := chartView{ID: id, Title: title, Last: "-"}
	peak := 0.0
	for _, p := range pts {
		if !math.IsNaN(p.V) && !math.IsInf(p.V, 0) {
			c.Points++
			peak = max(peak, p.V)
			if p.V > 0 {
				c.NonZero++
			}
			c.Last = showValue(p.V, whole)
		}
	}
	top := niceTop(peak)
	c.Top, c.Peak = showValue(top, whole), showValue(peak, whole)
	var line, area strings.Builder
	runStart, lastX := -1.0, 0.0
	endRun := func() {
		if runStart >= 0 {
			area.WriteString("L" + coord(lastX) + "," + coord(chartBottom) + "Z")
		}
		runStart = -1
	}
	for _, p := range pts {
		if math.IsNaN(p.V) || math.IsInf(p.V, 0) || p.Ago > span {
			endRun()
			continue
		}
		x := chartW * (1 - p.Ago.Seconds()/span.Seconds())
		y := chartBottom - (chartBottom-chartTop)*p.V/top
		xy := coord(x) + "," + coord(y)
		if runStart < 0 {
			runStart = x
			line.WriteString("M" + xy)
			area.WriteString("M" + coord(x) + "," + coord(chartBottom) + "L" + xy)
		} else {
			line.WriteString("L" + xy)
			area.WriteString("L" + xy)
		}
		lastX = x
	}
	endRun()
	c.Line, c.Area = line.String(), area.String()
	return c
}

// niceTop is the smallest of 1, 2, 5 times a power of ten at or above x;
// 1 for 0.
func niceTop(x float64) float64 {
	if x <= 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// showValue shows a rate (formatRate) or a whole count.
func showValue(x float64, whole bool) string {
	if whole {
		return strconv.FormatFloat(math.Round(x), 'f', -1, 64)
	}
	return formatRate(x)
}

func coord(x float64) string { return strconv.FormatFloat(math.Round(x*10)/10, 'f', -1, 64) }

// shortDuration shows d as "1h", "12m", "36s" or Duration's form.
func shortDuration(d time.Duration) string {
	switch {
	case d >= time.Hour && d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d >= time.Minute && d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	}
	return d.String()
}
