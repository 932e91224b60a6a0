package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Message attributes on the command line (publish --header, the
// attribute fields of consume, dlq and peek) and the peek command.

var browseCommands = []clientCommand{
	{"peek", "show the ready messages at a queue's head without taking them", runPeek},
}

func init() {
	for _, c := range browseCommands {
		registerClient(c)
	}
}

// headerFlag collects repeated --header key=value flags.
type headerFlag map[string]string

func (h headerFlag) String() string { return "" }

func (h headerFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", v)
	}
	h[k] = val
	return nil
}

// attrFields returns a message's attributes as output fields, each
// preceded by a tab: "content-type=<type>", then "header.<key>=<value>" by
// key. A key or value holding '=', a tab or anything printable would
// misplace is Go-quoted.
func attrFields(m *qbroker.Message) string {
	var b strings.Builder
	if m.ContentType != "" {
		b.WriteString("\tcontent-type=" + field(m.ContentType))
	}
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		b.WriteString("\theader." + field(k) + "=" + field(m.Headers[k]))
	}
	return b.String()
}

func field(s string) string {
	if p := printable([]byte(s)); p != s || strings.ContainsAny(s, "=\t") || strings.HasPrefix(s, `"`) {
		return strconv.Quote(s)
	}
	return s
}

// printListed prints a listed (not delivered) message: dead letters and
// peeked ones.
func printListed(w io.Writer, m *qbroker.Message) {
	fmt.Fprintf(w, "%s\t%d\t%s\t%s%s\n", m.ID, m.DeliveryCount, m.PublishedAt.Local().Format(time.RFC3339), printable(m.Payload), attrFields(m))
}

// peekPage is how many messages `qbroker peek` asks for at a time.
const peekPage = 100

func runPeek(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("peek", "[flags] queue", `
Shows the ready messages at the head of a queue, in delivery order,
without taking them (no lease, delivery counts unchanged), one line each:
	<id> <tab> <delivery count> <tab> <published at> <tab> <payload> [<tab> <attribute>...]
(attributes as for consume). Messages in flight are not ready, so not
shown. The queue may change while it is listed: consumers may take
messages already shown.`, std)
	n := fs.Int("n", 10, "most messages to show; 0 means all")
	pos, err := parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	if *n < 0 {
		return usagef("-n %d: want 0 (all) or more", *n)
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	shown, token := 0, ""
	for {
		page := peekPage
		if *n > 0 {
			page = min(page, *n-shown)
		}
		ms, next, err := c.Browse(ctx, pos[0], token, page)
		if err != nil {
			return err
		}
		for _, m := range ms {
			printListed(std.out, m)
		}
		shown += len(ms)
		if token = next; token == "" || (*n > 0 && shown >= *n) {
			return nil
		}
	}
}
