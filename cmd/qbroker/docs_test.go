package main

import (
	"context"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/natsbridge"
	"github.com/qbroker/qbroker/internal/zktest"
)

// The documentation a reader uses (README.md and the guides in docs/) is
// checked against the code in both directions: every metric, flag and
// qbroker command it names exists, and every metric the broker registers,
// every flag of qbroker serve and every command is documented. The real
// sets come from the code: the metrics from a registry a real broker (and
// the NATS bridge) registers into, the flags from the commands' FlagSets
// and the load tester's flag definitions, the commands from the command
// table.

// readerDocs returns the text of README.md and docs/*.md, by path.
func readerDocs(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, "../../README.md")
	docs := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs[strings.TrimPrefix(p, "../../")] = string(b)
	}
	if len(docs) < 5 {
		t.Fatalf("found %d documents (README.md, docs/*.md), want at least 5", len(docs))
	}
	return docs
}

var (
	docMetric   = regexp.MustCompile(`\bqbroker_[a-z0-9_]*[a-z0-9]`)
	docFlag     = regexp.MustCompile(`(?:^|[^\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)`)
	docCommand  = regexp.MustCompile(`(?:^|[\s/(])qbroker ([a-z]+)\b`)
	fenced      = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	inlineCode  = regexp.MustCompile("`([^`\n]+)`")
	codeComment = regexp.MustCompile(`(^|\s)(#|//).*`)
)

// metricsIn returns the metric names text names (histogram series named
// by their _bucket, _sum or _count series count as the histogram).
func metricsIn(text string) []string {
	var out []string
	for _, m := range docMetric.FindAllString(text, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			m = strings.TrimSuffix(m, suffix)
		}
		out = append(out, m)
	}
	return out
}

// codeOf returns the code of text: its fenced blocks without their
// comments, and its inline code spans.
func codeOf(text string) string {
	var b strings.Builder
	for _, m := range fenced.FindAllStringSubmatch(text, -1) {
		for _, line := range strings.Split(m[1], "\n") {
			b.WriteString(codeComment.ReplaceAllString(line, ""))
			b.WriteString("\n")
		}
	}
	for _, m := range inlineCode.FindAllStringSubmatch(fenced.ReplaceAllString(text, ""), -1) {
		b.WriteString(m[1])
		b.WriteString("\n")
	}
	return b.String()
}

// documented returns what the documents name, each name with the
// documents that name it.
func documented(docs map[string]string) (metrics, flags, cmds map[string][]string) {
	metrics, flags, cmds = map[string][]string{}, map[string][]string{}, map[string][]string{}
	add := func(set map[string][]string, name, doc string) {
		if !slices.Contains(set[name], doc) {
			set[name] = append(set[name], doc)
		}
	}
	for doc, text := range docs {
		for _, m := range metricsIn(text) {
			add(metrics, m, doc)
		}
		for _, m := range docFlag.FindAllStringSubmatch(text, -1) {
			add(flags, m[1], doc)
		}
		for _, line := range strings.Split(codeOf(text), "\n") {
			for _, m := range docCommand.FindAllStringSubmatch(line, -1) {
				add(cmds, m[1], doc)
			}
		}
	}
	return metrics, flags, cmds
}

// nameCollector records the names of the metrics registered through it.
type nameCollector struct {
	prometheus.Registerer
	names map[string]bool
}

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (n *nameCollector) Register(c prometheus.Collector) error {
	if err := n.Registerer.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		if m := descName.FindStringSubmatch(d.String()); m != nil {
			n.names[m[1]] = true
		}
	}
	return nil
}

func (n *nameCollector) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := n.Register(c); err != nil {
			panic(err)
		}
	}
}

// registeredMetrics returns the qbroker_ metrics a broker registers, as
// qbroker serve registers them: a real broker's and the NATS bridge's
// (which registers its metrics without --nats-url too).
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := &nameCollector{Registerer: prometheus.NewRegistry(), names: map[string]bool{}}
	if err := natsbridge.RegisterDisabled(reg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, broker.Config{
		ZooKeeper:  []string{zktest.Addr(t)},
		Root:       zktest.Root(t),
		Registerer: reg,
	}, brokertest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Stop()
	out := map[string]bool{}
	for n := range reg.names {
		if strings.HasPrefix(n, "qbroker_") {
			out[n] = true
		}
	}
	if len(out) < 20 {
		t.Fatalf("the broker registered %d qbroker_ metrics, want many more: %v", len(out), out)
	}
	return out
}

// loadtestFlags returns the flags the load tester defines: the name of
// every fs.<Type>Var(..., "name", ...) and fs.<Type>("name", ...) call in
// loadtest/*.go (its FlagSet is a main package's, out of reach here).
func loadtestFlags(t *testing.T) map[string]bool {
	t.Helper()
	paths, err := filepath.Glob("../../loadtest/*.go")
	if err != nil {
		t.Fatal(err)
	}
	define := regexp.MustCompile(`^(String|Int|Int64|Uint|Uint64|Bool|Duration|Float64|Func|BoolFunc|TextVar)?(Var)?$`)
	out := map[string]bool{}
	fset := token.NewFileSet()
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !define.MatchString(sel.Sel.Name) || sel.Sel.Name == "" {
				return true
			}
			if recv, ok := sel.X.(*ast.Ident); !ok || recv.Name != "fs" {
				return true
			}
			for _, a := range call.Args {
				if lit, ok := a.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if name, err := strconv.Unquote(lit.Value); err == nil {
						out[name] = true
					}
					break
				}
			}
			return true
		})
	}
	if !out["spawn-brokers"] {
		t.Fatalf("found no --spawn-brokers among the load tester's flags %v", out)
	}
	return out
}

// serveFlagNames returns the flags of qbroker serve.
func serveFlagNames() map[string]bool {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	serveFlags(fs)
	out := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { out[f.Name] = true })
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestDocsMatchCode is the documentation check run by make test.
func TestDocsMatchCode(t *testing.T) {
	docs := readerDocs(t)
	docMetrics, docFlags, docCmds := documented(docs)

	t.Run("metrics", func(t *testing.T) {
		registered := registeredMetrics(t)
		for _, m := range sortedKeys(docMetrics) {
			if !registered[m] {
				t.Errorf("%s names metric %s, which the broker does not register", strings.Join(docMetrics[m], ", "), m)
			}
		}
		for _, m := range sortedKeys(registered) {
			if docMetrics[m] == nil {
				t.Errorf("metric %s is registered but documented nowhere (README.md, docs/*.md)", m)
			}
		}
		// The packages' own lists (broker/doc.go, internal/natsbridge/doc.go)
		// name every metric too.
		pkgDoc := map[string]bool{}
		for _, p := range []string{"../../broker/doc.go", "../../internal/natsbridge/doc.go"} {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range metricsIn(string(b)) {
				pkgDoc[m] = true
				if !registered[m] {
					t.Errorf("%s names metric %s, which the broker does not register", strings.TrimPrefix(p, "../../"), m)
				}
			}
		}
		for _, m := range sortedKeys(registered) {
			if !pkgDoc[m] {
				t.Errorf("metric %s is missing from the package docs' metric lists (broker/doc.go, internal/natsbridge/doc.go)", m)
			}
		}
	})

	t.Run("flags", func(t *testing.T) {
		known := loadtestFlags(t)
		for _, fl := range commandFlags() {
			for _, f := range fl {
				known[f.name] = true
			}
		}
		// Every FlagSet answers --help; runMain answers --version.
		known["help"], known["version"] = true, true
		for _, f := range sortedKeys(docFlags) {
			if !known[f] {
				t.Errorf("%s names flag --%s, which no qbroker command nor the load tester has", strings.Join(docFlags[f], ", "), f)
			}
		}
		for _, f := range sortedKeys(serveFlagNames()) {
			if docFlags[f] == nil {
				t.Errorf("qbroker serve's flag --%s is documented nowhere (README.md, docs/*.md)", f)
			}
		}
	})

	t.Run("commands", func(t *testing.T) {
		for _, c := range sortedKeys(docCmds) {
			if _, ok := commands[c]; !ok {
				t.Errorf("%s shows command qbroker %s, which does not exist", strings.Join(docCmds[c], ", "), c)
			}
		}
		for _, c := range sortedKeys(commands) {
			if docCmds[c] == nil {
				t.Errorf("command qbroker %s is documented nowhere (README.md, docs/*.md)", c)
			}
		}
	})
}
