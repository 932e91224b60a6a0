package faults

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Row is one line of the results table: a scenario under one delivery
// mode.
type Row struct {
	Scenario string
	Result   Result
}

// WriteTable writes rows as a Markdown table, followed by the problems of
// the rows that failed.
func WriteTable(w io.Writer, rows []Row) error {
	var b strings.Builder
	b.WriteString("| scenario | mode | published | uncertain | delivered | redelivered | lost | in doubt | duplicates | uncounted | recover (fault) | recover (heal) | verdict |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, row := range rows {
		r := row.Result
		dup, unc, doubt := "-", "-", "-"
		if r.Mode == qbroker.AtMostOnce {
			dup, doubt = fmt.Sprint(r.Duplicates), fmt.Sprint(r.InDoubt)
		} else {
			unc = fmt.Sprint(r.Uncounted)
		}
		verdict := "pass"
		if !r.OK {
			verdict = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %s | %s | %s | %s | %s | %s |\n",
			row.Scenario, r.Mode, r.Published, r.Uncertain, r.Delivered, r.Redelivered, r.Lost, doubt, dup, unc,
			duration(r.RecoverFault), duration(r.RecoverHeal), verdict)
	}
	for _, row := range rows {
		if row.Result.OK {
			continue
		}
		fmt.Fprintf(&b, "\n%s, %s:\n", row.Scenario, row.Result.Mode)
		for _, p := range row.Result.Problems {
			indent := ""
			if strings.HasPrefix(p, "  ") {
				indent = "  " // a sample of the problem above
			}
			fmt.Fprintf(&b, "%s- %s\n", indent, strings.TrimSpace(p))
		}
	}
	header := false
	for _, row := range rows {
		if len(row.Result.Errors) == 0 {
			continue
		}
		if !header {
			b.WriteString("\nFailed calls (by operation and code):\n\n")
			header = true
		}
		fmt.Fprintf(&b, "- %s, %s: %s\n", row.Scenario, row.Result.Mode, row.Result.ErrorSummary())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ErrorSummary formats a result's failed calls, sorted, for a log line.
func (r Result) ErrorSummary() string {
	keys := make([]string, 0, len(r.Errors))
	for k := range r.Errors {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, r.Errors[k])
	}
	return strings.Join(parts, ", ")
}

func duration(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}
