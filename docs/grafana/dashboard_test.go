// Package grafana_test checks the Grafana dashboard qbroker.json against
// the metrics a real broker registers, so that the dashboard cannot
// silently drift from the broker: every metric and label a panel or
// template variable queries must exist, and docs/operations.md must list
// every panel.
package grafana_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/natsbridge"
	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) { zktest.Main(m) }

// dashboard is the part of Grafana's dashboard model the test reads.
type dashboard struct {
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	Targets    []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile("qbroker.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("qbroker.json: %v", err)
	}
	return d
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// query is one PromQL expression of the dashboard and where it is.
type query struct{ where, expr string }

// queries returns the dashboard's panel expressions and the metric
// selectors of its label_values template variables.
func queries(t *testing.T, d dashboard) []query {
	t.Helper()
	var qs []query
	for _, p := range allPanels(d.Panels) {
		for i, tg := range p.Targets {
			qs = append(qs, query{fmt.Sprintf("panel %q target %d", p.Title, i), tg.Expr})
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil || q.Query == "" {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Fatalf("variable %s: query %s", v.Name, v.Query)
			}
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s: %q is not label_values(selector, label)", v.Name, q.Query)
		}
		// The label is checked like a grouping label of the selector.
		qs = append(qs, query{"variable " + v.Name, fmt.Sprintf("count by (%s) (%s)", m[2], m[1])})
	}
	return qs
}

var (
	grafanaVar  = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)
	rangeSel    = regexp.MustCompile(`\[[^\]]*\]`)
	stringLit   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	matchers    = regexp.MustCompile(`\{([^}]*)\}`)
	matcherName = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	grouping    = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	ident       = regexp.MustCompile(`(?:^|[^a-zA-Z0-9_.:])([a-zA-Z_:][a-zA-Z0-9_:]*)`)
)

// promql lists the functions, aggregations and keywords the dashboard may
// use; any other identifier in an expression is a metric name.
var promql = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "count": true, "topk": true, "bottomk": true,
	"quantile": true, "rate": true, "irate": true, "increase": true, "delta": true, "deriv": true,
	"histogram_quantile": true, "changes": true, "resets": true, "abs": true, "clamp_min": true,
	"clamp_max": true, "vector": true, "time": true, "sort": true, "sort_desc": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
}

// parse returns the metric names and label names an expression uses.
func parse(expr string) (metrics, labels []string, err error) {
	s := grafanaVar.ReplaceAllString(expr, "")
	s = rangeSel.ReplaceAllString(s, "")
	s = stringLit.ReplaceAllString(s, `""`)
	for _, m := range matchers.FindAllStringSubmatch(s, -1) {
		for _, n := range matcherName.FindAllStringSubmatch(m[1], -1) {
			labels = append(labels, n[1])
		}
	}
	s = matchers.ReplaceAllString(s, " ")
	for _, g := range grouping.FindAllStringSubmatch(s, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	s = grouping.ReplaceAllString(s, " ")
	for _, m := range ident.FindAllStringSubmatch(s, -1) {
		if !promql[m[1]] {
			metrics = append(metrics, m[1])
		}
	}
	if len(metrics) == 0 {
		return nil, nil, fmt.Errorf("no metric in %q", expr)
	}
	return metrics, labels, nil
}

func TestParse(t *testing.T) {
	for _, c := range []struct {
		expr            string
		metrics, labels []string
	}{
		{`sum by (queue) (rate(a_total{instance=~"$instance", queue=~"$queue"}[$__rate_interval]))`,
			[]string{"a_total"}, []string{"instance", "queue", "queue"}},
		{`histogram_quantile(0.99, sum by (op, le) (rate(b_bucket{x!="y,z"}[5m])))`,
			[]string{"b_bucket"}, []string{"x", "op", "le"}},
		{`count by (version) (c) / 1e3 + d`, []string{"c", "d"}, []string{"version"}},
	} {
		m, l, err := parse(c.expr)
		if err != nil || !slices.Equal(m, c.metrics) || !slices.Equal(l, c.labels) {
			t.Errorf("parse(%q) = %v, %v, %v; want %v, %v", c.expr, m, l, err, c.metrics, c.labels)
		}
	}
	if _, _, err := parse(`sum(rate([5m]))`); err == nil {
		t.Error("parse of an expression without a metric: no error")
	}
}

// describing records the descriptors of every collector registered
// through it: the names and labels of all series the broker can export,
// including vectors that have none yet.
type describing struct {
	prometheus.Registerer
	labels map[string][]string // metric name -> variable and constant labels
}

var (
	descName   = regexp.MustCompile(`fqName: "([^"]*)"`)
	descConst  = regexp.MustCompile(`constLabels: \{([^}]*)\}`)
	descVar    = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	constLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	varLabel   = regexp.MustCompile(`[a-zA-Z_][a-zA-Z0-9_]*`)
)

func (d *describing) Register(c prometheus.Collector) error {
	if err := d.Registerer.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for desc := range ch {
		s := desc.String()
		name := descName.FindStringSubmatch(s)
		if name == nil {
			panic("unexpected descriptor " + s)
		}
		var labels []string
		if m := descConst.FindStringSubmatch(s); m != nil {
			for _, l := range constLabel.FindAllStringSubmatch(m[1], -1) {
				labels = append(labels, l[1])
			}
		}
		if m := descVar.FindStringSubmatch(s); m != nil {
			for _, l := range varLabel.FindAllString(m[1], -1) {
				if l != "c" { // c(label): a label with a constraint
					labels = append(labels, l)
				}
			}
		}
		d.labels[name[1]] = labels
	}
	return nil
}

func (d *describing) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := d.Register(c); err != nil {
			panic(err)
		}
	}
}

// exported returns the labels of every metric the broker registers (as
// `qbroker serve` registers them without NATS, less the Go runtime and
// process collectors) and the type of every one with a series after a
// small workload (publish, consume at least once, ack).
func exported(t *testing.T) (map[string][]string, map[string]dto.MetricType) {
	t.Helper()
	reg := prometheus.NewRegistry()
	d := &describing{Registerer: reg, labels: map[string][]string{}}
	if err := natsbridge.RegisterDisabled(d); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, broker.Config{
		ZooKeeper:      []string{zktest.Addr(t)},
		Root:           zktest.Root(t),
		SessionTimeout: 4 * time.Second,
		Registerer:     d,
	}, brokertest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	c, err := qbroker.Dial(ctx, s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Histograms have series (and so a type) once observed.
	if _, err := c.CreateQueue(ctx, "dash", qbroker.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "dash", []byte("x")); err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Receive(ctx, "dash", qbroker.ReceiveOptions{Max: 1, Wait: 10 * time.Second, Mode: qbroker.AtLeastOnce})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("receive: %v, %v", msgs, err)
	}
	if err := msgs[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]dto.MetricType{}
	for _, mf := range mfs {
		types[mf.GetName()] = mf.GetType()
	}
	return d.labels, types
}

// targetLabels are added by Prometheus to every scraped series.
var targetLabels = []string{"instance", "job"}

// TestDashboardMetricsExist checks every metric and label name the
// dashboard queries against a real broker's registry.
func TestDashboardMetricsExist(t *testing.T) {
	d := loadDashboard(t)
	labels, types := exported(t)

	// seriesLabels returns the labels of a series name as Prometheus
	// stores it (histograms as _bucket, _sum and _count).
	seriesLabels := func(name string) ([]string, error) {
		if ls, ok := labels[name]; ok {
			if ty := types[name]; ty == dto.MetricType_HISTOGRAM || ty == dto.MetricType_SUMMARY {
				return nil, fmt.Errorf("%s is a %v: query %s_bucket, _sum or _count", name, ty, name)
			}
			return ls, nil
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base, ok := strings.CutSuffix(name, suffix)
			if !ok {
				continue
			}
			ls, ok := labels[base]
			if !ok {
				break
			}
			switch ty, seen := types[base]; {
			case !seen:
				return nil, fmt.Errorf("%s had no series after the test's workload: its type is unknown", base)
			case ty == dto.MetricType_HISTOGRAM && suffix == "_bucket":
				return append(slices.Clone(ls), "le"), nil
			case ty == dto.MetricType_HISTOGRAM || ty == dto.MetricType_SUMMARY && suffix != "_bucket":
				return ls, nil
			default:
				return nil, fmt.Errorf("%s is a %v, without %s", base, ty, suffix)
			}
		}
		return nil, fmt.Errorf("%s is not registered by the broker", name)
	}

	qs := queries(t, d)
	if len(qs) < 20 {
		t.Fatalf("only %d queries in qbroker.json", len(qs))
	}
	used := map[string]bool{}
	for _, q := range qs {
		metrics, ls, err := parse(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		known := slices.Clone(targetLabels)
		for _, m := range metrics {
			used[m] = true
			mls, err := seriesLabels(m)
			if err != nil {
				t.Errorf("%s: %v", q.where, err)
				continue
			}
			known = append(known, mls...)
		}
		for _, l := range ls {
			if !slices.Contains(known, l) {
				t.Errorf("%s: label %q is on none of %v", q.where, l, metrics)
			}
		}
	}
	// What an operator must see, each on a panel: the one warning before
	// ZooKeeper's memory runs out (data against its budget), and messages
	// that leave a queue without being consumed or never enter it.
	for _, m := range []string{"qbroker_zk_data_bytes", "qbroker_zk_data_budget_bytes", "qbroker_messages_expired_total",
		"qbroker_messages_duplicate_total", "qbroker_bad_message_nodes_total",
		"qbroker_streams_refused_total", "qbroker_connections_refused_total"} {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
	var names []string
	for m := range used {
		names = append(names, m)
	}
	sort.Strings(names)
	t.Logf("%d queries use %d metrics: %s", len(qs), len(names), strings.Join(names, " "))
}

// TestDashboardShape checks what Grafana needs to import the dashboard
// anywhere (a Prometheus data source variable every panel uses, unique
// panel ids), and that docs/operations.md lists its rows and panels as
// they are.
func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" && string(v.Query) == `"prometheus"` {
			hasDS = true
		}
	}
	if !hasDS {
		t.Error(`no "datasource" variable of type datasource for prometheus`)
	}
	ids := map[int]string{}
	var rows []string // "Row: panel; panel", as docs/operations.md lists them
	for _, p := range allPanels(d.Panels) {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			rows = append(rows, p.Title+":")
			continue
		}
		if len(rows) == 0 {
			t.Fatalf("panel %q before the first row", p.Title)
		}
		if strings.HasSuffix(rows[len(rows)-1], ":") {
			rows[len(rows)-1] += " " + p.Title
		} else {
			rows[len(rows)-1] += "; " + p.Title
		}
		var ds struct{ Type, UID string }
		if err := json.Unmarshal(p.Datasource, &ds); err != nil || ds.Type != "prometheus" || ds.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %s, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
	}
	if listed := guideRows(t); !slices.Equal(listed, rows) {
		t.Errorf("docs/operations.md lists the dashboard as\n%s\nwant\n%s", strings.Join(listed, "\n"), strings.Join(rows, "\n"))
	}
}

// guideRows returns docs/operations.md's list of the dashboard's rows, "- **Row**:
// panel; panel" items after the line naming docs/grafana/qbroker.json, with
// wrapped lines joined.
func guideRows(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(raw), "`docs/grafana/qbroker.json`")
	if !ok {
		t.Fatal("docs/operations.md does not name docs/grafana/qbroker.json")
	}
	var rows []string
	started := false
	for _, line := range strings.Split(after, "\n") {
		switch {
		case strings.HasPrefix(line, "- **"):
			started = true
			r := strings.TrimPrefix(line, "- **")
			r = strings.Replace(r, "**:", ":", 1)
			rows = append(rows, r)
		case started && strings.HasPrefix(line, "  "):
			rows[len(rows)-1] += " " + strings.TrimSpace(line)
		case started:
			return rows
		}
	}
	return rows
}
