package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"strings"

	chart "github.com/wcharczuk/go-chart/v2"
	"github.com/wcharczuk/go-chart/v2/drawing"
)

// The HTML report is one self-contained page: charts are SVG drawn by
// go-chart and inlined; no script, stylesheet or font is loaded from
// anywhere.

const chartW, chartH = 960, 360

var (
	colPublished = drawing.ColorFromHex("1f77b4")
	colDelivered = drawing.ColorFromHex("2ca02c")
	colAcked     = drawing.ColorFromHex("9467bd")
	colErrors    = drawing.ColorFromHex("d62728")
)

// writeHTML renders the report page to path.
func writeHTML(path string, r *Report) error {
	page, err := renderHTML(r)
	if err != nil {
		return err
	}
	return os.WriteFile(path, page, 0o644)
}

func renderHTML(r *Report) ([]byte, error) {
	type chartOut struct {
		Title string
		SVG   template.HTML
		Note  string
	}
	var charts []chartOut
	add := func(title, note string, svg []byte, err error) error {
		if err != nil {
			return fmt.Errorf("chart %q: %w", title, err)
		}
		if svg != nil {
			charts = append(charts, chartOut{Title: title, SVG: template.HTML(svg), Note: note}) // go-chart's own SVG
		}
		return nil
	}
	svg, err := throughputChart(r)
	if err := add("Throughput over time", "messages per second, 1 s buckets (delivered counts redeliveries)", svg, err); err != nil {
		return nil, err
	}
	svg, err = latencyHistogram("End-to-end latency (send to first delivery)", r.Latency.EndToEnd)
	if err := add("End-to-end latency histogram", "messages per latency bucket", svg, err); err != nil {
		return nil, err
	}
	svg, err = latencyHistogram("Publish call latency", r.Latency.Publish)
	if err := add("Publish call latency histogram", "publish calls per latency bucket", svg, err); err != nil {
		return nil, err
	}
	svg, err = latencyCDF(r)
	if err := add("Latency CDF", "latency (log scale) at each percentile (scale in nines)", svg, err); err != nil {
		return nil, err
	}
	svg, err = baselineChart(r)
	if err := add("Baseline comparison", "messages per second on the same ZooKeeper, same payload", svg, err); err != nil {
		return nil, err
	}
	cfg, err := json.MarshalIndent(r.Config, "", "  ")
	if err != nil {
		return nil, err
	}
	var summary strings.Builder
	writeSummary(&summary, r)
	var out bytes.Buffer
	err = pageTmpl.Execute(&out, map[string]any{
		"R":       r,
		"Charts":  charts,
		"Summary": summary.String(),
		"Config":  string(cfg),
	})
	return out.Bytes(), err
}

// renderer is what go-chart's Chart and BarChart have in common.
type renderer interface {
	Render(rp chart.RendererProvider, w io.Writer) error
}

func renderSVG(c renderer) ([]byte, error) {
	var b bytes.Buffer
	if err := c.Render(chart.SVG, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func axisStyle() chart.Style { return chart.Style{FontSize: 9} }

// throughputChart plots the timeline: published, delivered (and acked)
// messages per second.
func throughputChart(r *Report) ([]byte, error) {
	if len(r.Timeline) < 2 {
		return nil, nil
	}
	var xs, pub, del, ack, errs []float64
	anyAck, anyErr := false, false
	for _, p := range r.Timeline {
		if p.Seconds < 0.25 {
			continue // a last partial bucket's rate is noise
		}
		xs = append(xs, p.T)
		pub = append(pub, float64(p.Published)/p.Seconds)
		del = append(del, float64(p.Delivered)/p.Seconds)
		ack = append(ack, float64(p.Acked)/p.Seconds)
		errs = append(errs, float64(p.Errors)/p.Seconds)
		anyAck = anyAck || p.Acked > 0
		anyErr = anyErr || p.Errors > 0
	}
	line := func(name string, ys []float64, c drawing.Color) chart.Series {
		return chart.ContinuousSeries{Name: name, XValues: xs, YValues: ys,
			Style: chart.Style{StrokeColor: c, StrokeWidth: 2}}
	}
	series := []chart.Series{line("published/s", pub, colPublished), line("delivered/s", del, colDelivered)}
	if anyAck {
		series = append(series, line("acked/s", ack, colAcked))
	}
	if anyErr {
		series = append(series, line("errors/s", errs, colErrors))
	}
	c := chart.Chart{
		Width: chartW, Height: chartH,
		Background: chart.Style{Padding: chart.Box{Top: 20, Left: 20, Right: 20, Bottom: 10}},
		XAxis: chart.XAxis{Name: "seconds", Style: axisStyle(), Ticks: secondTicks(xs[len(xs)-1]),
			Range: &chart.ContinuousRange{Min: 0, Max: xs[len(xs)-1]}},
		YAxis: chart.YAxis{Name: "msg/s", Style: axisStyle(), ValueFormatter: intFormatter,
			Range: &chart.ContinuousRange{Min: 0, Max: maxOf(pub, del, ack, errs) * 1.05}},
		Series: series,
	}
	c.Elements = []chart.Renderable{chart.LegendLeft(&c)}
	return renderSVG(c)
}

// secondTicks labels about ten whole seconds from 0 to end.
func secondTicks(end float64) []chart.Tick {
	step := 1.0
	for _, s := range []float64{1, 2, 5, 10, 15, 30, 60, 120, 300, 600} {
		step = s
		if end/s <= 12 {
			break
		}
	}
	var ticks []chart.Tick
	for t := 0.0; t <= end; t += step {
		ticks = append(ticks, chart.Tick{Value: t, Label: fmt.Sprintf("%.0f", t)})
	}
	return ticks
}

func maxOf(vs ...[]float64) float64 {
	m := 1.0
	for _, v := range vs {
		for _, x := range v {
			m = math.Max(m, x)
		}
	}
	return m
}

func intFormatter(v any) string {
	if f, ok := v.(float64); ok {
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprint(v)
}

// latencyHistogram draws a summary's logarithmic buckets as bars.
func latencyHistogram(title string, s LatencySummary) ([]byte, error) {
	if len(s.Histogram) < 1 {
		return nil, nil
	}
	bars := make([]chart.Value, len(s.Histogram))
	for i, b := range s.Histogram {
		bars[i] = chart.Value{Value: float64(b.Count), Label: msLabel(b.FromMS) + "-" + msLabel(b.ToMS),
			Style: chart.Style{FillColor: colPublished, StrokeColor: colPublished}}
	}
	bw := max(8, min(60, (chartW-120)/len(bars)-6))
	c := chart.BarChart{
		Title: title, Width: chartW, Height: chartH, BarWidth: bw, BarSpacing: 6,
		UseBaseValue: true, BaseValue: 0,
		Background: chart.Style{Padding: chart.Box{Top: 40, Left: 20, Right: 20, Bottom: 30}},
		XAxis:      chart.Style{FontSize: 7},
		YAxis:      barAxis(bars),
		Bars:       bars,
	}
	return renderSVG(c)
}

// barAxis is a y axis from 0 to a little above the tallest bar.
func barAxis(bars []chart.Value) chart.YAxis {
	top := 1.0
	for _, b := range bars {
		top = math.Max(top, b.Value)
	}
	return chart.YAxis{Style: axisStyle(), ValueFormatter: intFormatter, Range: &chart.ContinuousRange{Min: 0, Max: top * 1.05}}
}

// msLabel names a bucket edge: 0.5ms, 2ms, 1s.
func msLabel(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gs", v/1000)
	case v >= 1:
		return fmt.Sprintf("%gms", v)
	}
	return fmt.Sprintf("%gus", v*1000)
}

// latencyCDF plots latency against percentile. The x axis is in nines
// (-log10(1-p): 90% is 1, 99% is 2, ...) and y is log10 of the latency,
// both with readable tick labels, so the tail is as visible as the body.
func latencyCDF(r *Report) ([]byte, error) {
	var series []chart.Series
	minY, maxY := math.Inf(1), math.Inf(-1)
	for _, l := range []struct {
		name string
		s    LatencySummary
		c    drawing.Color
	}{{"publish call", r.Latency.Publish, colPublished}, {"end to end", r.Latency.EndToEnd, colDelivered}} {
		var xs, ys []float64
		for _, p := range l.s.CDF {
			if p.Percentile >= 100 || p.MS <= 0 {
				continue
			}
			xs = append(xs, -math.Log10(1-p.Percentile/100))
			y := math.Log10(p.MS)
			ys = append(ys, y)
			minY, maxY = math.Min(minY, y), math.Max(maxY, y)
		}
		if len(xs) > 1 {
			series = append(series, chart.ContinuousSeries{Name: l.name, XValues: xs, YValues: ys,
				Style: chart.Style{StrokeColor: l.c, StrokeWidth: 2}})
		}
	}
	if len(series) == 0 {
		return nil, nil
	}
	var xticks []chart.Tick
	for i, l := range []string{"0%", "90%", "99%", "99.9%", "99.99%", "99.999%"} {
		xticks = append(xticks, chart.Tick{Value: float64(i), Label: l})
	}
	var yticks []chart.Tick
	lo, hi := math.Floor(minY), math.Ceil(maxY)
	if hi == lo {
		hi++
	}
	for e := lo; e <= hi; e++ {
		yticks = append(yticks, chart.Tick{Value: e, Label: msLabel(math.Pow(10, e))})
	}
	c := chart.Chart{
		Width: chartW, Height: chartH,
		Background: chart.Style{Padding: chart.Box{Top: 20, Left: 20, Right: 20, Bottom: 10}},
		XAxis:      chart.XAxis{Name: "percentile", Style: axisStyle(), Ticks: xticks, Range: &chart.ContinuousRange{Min: 0, Max: 5}},
		YAxis:      chart.YAxis{Name: "latency", Style: axisStyle(), Ticks: yticks, Range: &chart.ContinuousRange{Min: lo, Max: hi}},
		Series:     series,
	}
	c.Elements = []chart.Renderable{chart.LegendLeft(&c)}
	return renderSVG(c)
}

// baselineChart compares qbroker's delivered/s with the baselines.
func baselineChart(r *Report) ([]byte, error) {
	if len(r.Baselines) == 0 {
		return nil, nil
	}
	bars := []chart.Value{{Value: r.Throughput.DeliveredPerSec, Label: "qbroker delivered/s",
		Style: chart.Style{FillColor: colDelivered, StrokeColor: colDelivered}}}
	for _, b := range r.Baselines {
		label := "raw create+delete pairs/s"
		if b.Name == baselineNaive {
			label = "naive consumers delivered/s"
		}
		bars = append(bars, chart.Value{Value: b.PerSec, Label: label,
			Style: chart.Style{FillColor: colPublished, StrokeColor: colPublished}})
	}
	c := chart.BarChart{
		Width: chartW, Height: chartH, BarWidth: 160, BarSpacing: 60,
		UseBaseValue: true, BaseValue: 0,
		Background: chart.Style{Padding: chart.Box{Top: 40, Left: 20, Right: 20, Bottom: 30}},
		XAxis:      chart.Style{FontSize: 9},
		YAxis:      barAxis(bars),
		Bars:       bars,
	}
	return renderSVG(c)
}

var pageTmpl = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>qbroker load test {{.R.Started.Format "2006-01-02 15:04:05"}}</title>
<style>
body { font-family: sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
pre { background: #f6f6f6; padding: 1em; white-space: pre-wrap; font-size: 0.85em; }
table { border-collapse: collapse; } td, th { padding: 0.2em 0.8em; text-align: right; border-bottom: 1px solid #ddd; }
th:first-child, td:first-child { text-align: left; }
.ok { color: #2ca02c; font-weight: bold; } .failed { color: #d62728; font-weight: bold; }
.note { color: #666; font-size: 0.9em; }
svg { width: 100%; height: auto; }
</style>
</head>
<body>
<h1>qbroker load test: {{if .R.OK}}<span class="ok">OK</span>{{else}}<span class="failed">FAILED</span>{{end}}</h1>
{{if .R.Failures}}<h2>Failures</h2><pre>{{range .R.Failures}}{{.}}
{{end}}</pre>{{end}}
<h2>Summary</h2>
<pre>{{.Summary}}</pre>
<h2>Latency (ms)</h2>
<table>
<tr><th></th><th>samples</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th></tr>
{{with .R.Latency.Publish}}<tr><td>publish call</td><td>{{.Count}}</td><td>{{printf "%.3f" .P50MS}}</td><td>{{printf "%.3f" .P90MS}}</td><td>{{printf "%.3f" .P99MS}}</td><td>{{printf "%.3f" .P999MS}}</td><td>{{printf "%.3f" .MaxMS}}</td></tr>{{end}}
{{with .R.Latency.EndToEnd}}<tr><td>end to end</td><td>{{.Count}}</td><td>{{printf "%.3f" .P50MS}}</td><td>{{printf "%.3f" .P90MS}}</td><td>{{printf "%.3f" .P99MS}}</td><td>{{printf "%.3f" .P999MS}}</td><td>{{printf "%.3f" .MaxMS}}</td></tr>{{end}}
</table>
{{with .R.ZKCost}}<h2>ZooKeeper cost per message {{.Per}}</h2>
<table>
<tr><th></th><th>per message</th></tr>
<tr><td>transactions</td><td>{{printf "%.3f" .Transactions}}</td></tr>
<tr><td>brokers' requests</td><td>{{printf "%.3f" .Requests}}</td></tr>
{{if eq .Per "published"}}<tr><td>znodes</td><td>{{printf "%.4f" .ZnodesPerMessage}} ({{printf "%.1f" .MessagesPerZnode}} messages per znode)</td></tr>
<tr><td>data bytes</td><td>{{printf "%.0f" .DataBytesPerMessage}}</td></tr>
<tr><td>live heap bytes</td><td>{{if .HeapNote}}not measured: {{.HeapNote}}{{else}}{{printf "%.0f" .HeapBytesPerMessage}}{{end}}</td></tr>{{end}}
</table>{{end}}
{{range .Charts}}
<h2>{{.Title}}</h2>
<p class="note">{{.Note}}</p>
{{.SVG}}
{{end}}
<h2>Configuration</h2>
<pre>{{.Config}}</pre>
</body>
</html>
`))
