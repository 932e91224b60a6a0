package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Client commands: they talk to a running broker through clients/go.

// stdio is where a client command reads and writes; tests replace it.
type stdio struct {
	in       io.Reader
	out, err io.Writer
}

// clientCommand is a client subcommand: run parses args with its own
// FlagSet and returns flag.ErrHelp for --help.
type clientCommand struct {
	name  string
	usage string // one line, for 'qbroker help'
	run   func(ctx context.Context, std stdio, args []string) error
}

var clientCommands = []clientCommand{
	{"queues", "list queues", runQueues},
	{"create", "create a queue", runCreate},
	{"publish", "publish messages (arguments or stdin lines)", runPublish},
	{"consume", "consume messages and print them", runConsume},
	{"stats", "show queue counts", runStats},
	{"purge", "delete a queue's ready messages", runPurge},
	{"dlq", "list dead letters, or redrive them", runDLQ},
}

func init() {
	for _, c := range clientCommands {
		registerClient(c)
	}
}

// registerClient registers a client command, run with the process's
// standard streams.
func registerClient(c clientCommand) {
	register(command{name: c.name, usage: c.usage, run: func(args []string) error {
		// Ctrl-C cancels the command's context: consume stops cleanly.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return cliError(c.run(ctx, stdio{os.Stdin, os.Stdout, os.Stderr}, args))
	}})
}

// cliError drops the client package's "qbroker: " prefix: main already
// prints "qbroker <command>: ".
func cliError(err error) error {
	var ue usageError
	if err == nil || errors.Is(err, flag.ErrHelp) || errors.As(err, &ue) {
		return err
	}
	msg := err.Error()
	var tm *qbroker.TLSMismatchError
	if errors.As(err, &tm) {
		msg = strings.Replace(msg, tm.Error(), tlsHint(tm)+": "+tm.Err.Error(), 1)
	}
	if m, ok := strings.CutPrefix(msg, "qbroker: "); ok || msg != err.Error() {
		return errors.New(m)
	}
	return err
}

// clientFlags are the flags every client command takes.
type clientFlags struct {
	addr    string
	timeout time.Duration
	sec     clientSecurity // TLS and token (security.go)
}

// newFlagSet returns a command's FlagSet with --addr and --timeout and a
// Usage that prints synopsis, help and the flags (to std.out for --help,
// else to std.err: see parse).
func newFlagSet(name, synopsis, help string, std stdio) (*flag.FlagSet, *clientFlags) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(&helpWriter{out: std.out, err: std.err})
	cf := &clientFlags{}
	fs.StringVar(&cf.addr, "addr", env("ADDR", "127.0.0.1:7070"), "broker address host:port, or several comma-separated ($QBROKER_ADDR)")
	fs.DurationVar(&cf.timeout, "timeout", 10*time.Second, "bound of each request to the broker")
	cf.sec.define(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: qbroker %s %s\n\n%s\n\nflags:\n", name, synopsis, strings.TrimSpace(help))
		fs.PrintDefaults()
	}
	return fs, cf
}

// parse parses flags and positional arguments in any order ("--" ends
// the flags) and checks the number of positional arguments. It returns
// flag.ErrHelp after printing help, and a usageError after printing the
// usage for bad flags or arguments.
func parse(fs *flag.FlagSet, args []string, minArgs, maxArgs int) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	var err error
	switch {
	case len(pos) < minArgs:
		err = usagef("missing arguments")
	case maxArgs >= 0 && len(pos) > maxArgs:
		err = usagef("too many arguments: %q", pos[maxArgs:])
	default:
		return pos, nil
	}
	fs.Usage()
	if hw, ok := fs.Output().(*helpWriter); ok {
		hw.flush(false)
	}
	return nil, err
}

func (cf *clientFlags) dial(ctx context.Context) (*qbroker.Client, error) {
	if cf.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %v: want a positive duration", cf.timeout)
	}
	if cf.sec.tokenFile != "" || os.Getenv("QBROKER_TOKEN") != "" {
		if !cf.sec.tls && cf.sec.ca == "" && cf.sec.cert == "" {
			// Said here in flags: the client library's error names its options.
			return nil, usagef("a bearer token (--token-file or $QBROKER_TOKEN) needs TLS: give --tls-ca (or --tls); a token sent in the clear could be replayed by anyone who saw it")
		}
	}
	opts, err := cf.sec.options()
	if err != nil {
		return nil, err
	}
	return qbroker.Dial(ctx, cf.addr, append(opts, qbroker.WithCallTimeout(cf.timeout))...)
}

func runQueues(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("queues", "[flags]", `
Lists the queues with their configuration, sorted by name.`, std)
	prefix := fs.String("prefix", "", "only queues whose names start with this")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	qs, err := c.ListQueues(ctx, *prefix)
	if err != nil {
		return err
	}
	printQueues(std.out, qs)
	return nil
}

func printQueues(w io.Writer, qs []qbroker.QueueInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tMEMBERS\tVISIBILITY\tMAX-DELIVERIES\tDEAD-LETTER\tMAX-DEPTH\tMAX-BYTES\tTTL\tDEDUP-WINDOW\tRETRY-BACKOFF\tCREATED")
	for _, q := range qs {
		members := "-"
		if q.Kind == qbroker.KindSync {
			members = strconv.Itoa(q.SyncMembers)
		}
		maxDel := "unlimited"
		if q.MaxDeliveries > 0 {
			maxDel = strconv.Itoa(q.MaxDeliveries)
		}
		kind := q.Kind.String()
		if q.SingleActiveConsumer {
			kind += "+single-active" // one consumer at a time
		}
		if q.Packed {
			kind += "+packed" // many messages per node
		}
		ttl := "-"
		if q.MessageTTL > 0 {
			ttl = q.MessageTTL.String()
			if q.ExpireToDeadLetter {
				ttl += "+dead-letter" // expired messages become dead letters
			}
		}
		dedup := q.DedupWindow
		if dedup == 0 {
			dedup = defaultDedupWindow
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\t%v\t%s\t%s\t%s\t%v\t%s\t%s\n", q.Name, kind, members, q.VisibilityTimeout, maxDel,
			q.DeadLetter, quota(q.MaxDepth), quota(q.MaxBytes), ttl, dedup, backoffString(q.RetryBackoff), q.CreatedAt.Local().Format(time.DateTime))
	}
	tw.Flush()
}

// defaultDedupWindow is the window of a queue created without one.
const defaultDedupWindow = 5 * time.Minute

// quota prints a quota, "-" when there is none.
func quota[T int | int64](n T) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatInt(int64(n), 10)
}

func runCreate(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("create", "[flags] queue...", `
Creates queues. Creating a queue that exists with the same configuration
succeeds; with another, it fails. Names: [A-Za-z0-9._-]{1,200}.

Kinds: fifo delivers in publish order; priority by (priority, publish
order), 0 most urgent; sync is a FIFO queue that opens for consumers once
--members members have joined.`, std)
	var o qbroker.QueueOptions
	fs.TextVar(&o.Kind, "kind", qbroker.KindFIFO, "queue `kind`: fifo, priority or sync")
	fs.IntVar(&o.SyncMembers, "members", 0, "sync queues: members that open the queue (2..1000)")
	fs.DurationVar(&o.VisibilityTimeout, "visibility", 0, "lease of at-least-once deliveries; 0 means the broker's default (30s)")
	fs.IntVar(&o.MaxDeliveries, "max-deliveries", 0, "deliveries after which a message is dead-lettered (or dropped); 0 means unlimited")
	fs.BoolVar(&o.DeadLetter, "dead-letter", false, "keep messages past --max-deliveries as dead letters (see 'qbroker dlq')")
	fs.IntVar(&o.MaxDepth, "max-depth", 0, "quota: most ready messages; publishing beyond fails; 0 means none")
	fs.Int64Var(&o.MaxBytes, "max-bytes", 0, "quota: most bytes of message data the queue holds; publishing beyond fails; 0 means none")
	fs.DurationVar(&o.DedupWindow, "dedup-window", 0, "how long publishes' dedup ids are remembered (1s..1h); 0 means 5m")
	fs.DurationVar(&o.MessageTTL, "message-ttl", 0, "ready messages older than this (1s..336h) are removed instead of delivered; 0 means never")
	fs.BoolVar(&o.ExpireToDeadLetter, "expire-to-dead-letter", false, "keep messages past --message-ttl as dead letters instead of dropping them")
	fs.Var(backoffFlag{&o}, "retry-backoff", "redelivery `schedule` of nacks without a delay and expired leases: increasing waits (1s,5s,30s,5m; the last repeats) or exp:INITIAL[,MULTIPLIER[,MAX]]")
	fs.BoolVar(&o.SingleActiveConsumer, "single-active-consumer", false, "one Consume stream at a time, across brokers, receives messages; the others stand by (fifo and priority queues)")
	fs.StringVar(&o.Fairness.Key, "fairness-key", "", "fair dispatch: serve the messages' keys in weighted round robin; `key`: group (the message group) or header:<name>")
	weights := weightFlag{}
	fs.Var(weights, "fairness-weight", "with --fairness-key: a key's weight `key=n` (1..100, default 1); repeat for several")
	fs.BoolVar(&o.Packed, "packed", false, "packed storage: a publish's batch, and the concurrent publishes gathered with it, go into one ZooKeeper node; acks stay per message (fifo and priority queues, not with --fairness-key or --message-ttl)")
	names, err := parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	if len(weights) > 0 {
		o.Fairness.Weights = weights
	}
	if err := checkCreateFlags(o); err != nil {
		return err
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	var qs []qbroker.QueueInfo
	for _, n := range names {
		q, err := c.CreateQueue(ctx, n, o)
		if err != nil {
			return err
		}
		qs = append(qs, q)
	}
	printQueues(std.out, qs)
	return nil
}

// checkCreateFlags refuses what the broker would refuse anyway, naming
// the flag rather than the API field.
func checkCreateFlags(o qbroker.QueueOptions) error {
	for _, f := range []struct {
		name string
		neg  bool
	}{
		{"--members", o.SyncMembers < 0}, {"--visibility", o.VisibilityTimeout < 0},
		{"--max-deliveries", o.MaxDeliveries < 0}, {"--max-depth", o.MaxDepth < 0},
		{"--max-bytes", o.MaxBytes < 0}, {"--dedup-window", o.DedupWindow < 0}, {"--message-ttl", o.MessageTTL < 0},
	} {
		if f.neg {
			return usagef("%s: want 0 or more", f.name)
		}
	}
	if o.ExpireToDeadLetter && o.MessageTTL == 0 {
		return usagef("--expire-to-dead-letter needs --message-ttl")
	}
	if len(o.Fairness.Weights) > 0 && o.Fairness.Key == "" {
		return usagef("--fairness-weight needs --fairness-key")
	}
	switch {
	case o.Packed && o.Kind == qbroker.KindSync:
		return usagef("--packed is for fifo and priority queues, not sync")
	case o.Packed && o.Fairness.Key != "":
		return usagef("--packed does not combine with --fairness-key")
	case o.Packed && o.MessageTTL != 0:
		return usagef("--packed does not combine with --message-ttl")
	}
	return nil
}

func runPublish(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("publish", "[flags] queue [message...]", `
Publishes each message argument, or with --stdin each line of standard
input, and prints the message ids, one per line. With --batch, all
messages are published in one atomic batch: all or none. Without it, each
is published on its own, and a failure stops the command (the messages
before it stay published).

With --dedup-id, publishing is idempotent within the queue's dedup window:
the message (with several, the Nth gets <id>.N) is published once however
often the command runs, on whichever broker; a repeat prints the first
publish's id followed by a tab and "duplicate". A publish that fails
UNAVAILABLE is then retried. --header and --content-type apply to every
message.

With --group, the messages go into that message group: its messages are
delivered in publish order, one at a time, the next once the previous is
acked.`, std)
	priority := fs.Int("priority", 0, "priority of the messages (priority queues only): 0 most urgent .. 255")
	dedupID := fs.String("dedup-id", "", "deduplication `id`, [A-Za-z0-9._-]{1,128}")
	headers := headerFlag{}
	fs.Var(headers, "header", "a header `key=value` of the messages; repeat for several")
	contentType := fs.String("content-type", "", "content type of the messages (\"application/json\")")
	group := fs.String("group", "", "message `group`, [A-Za-z0-9._-]{1,128}: delivered in order, one at a time")
	stdin := fs.Bool("stdin", false, "read messages from standard input, one per line")
	batch := fs.Bool("batch", false, "publish all messages as one atomic batch")
	delay := fs.Duration("delay", 0, "deliver the messages after this delay (at most the broker's --max-delay, 15m by default)")
	pos, err := parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	queue, texts := pos[0], pos[1:]
	if *stdin && len(texts) > 0 {
		return usagef("give messages as arguments or with --stdin, not both")
	}
	if !*stdin && len(texts) == 0 {
		fs.Usage()
		fs.Output().(*helpWriter).flush(false)
		return usagef("no messages: give them as arguments or with --stdin")
	}
	payloads, err := messageTexts(std, texts, *stdin)
	if err != nil || len(payloads) == 0 {
		return err // nil for an empty stdin
	}
	msgs := make([]qbroker.OutMessage, len(payloads))
	for i, p := range payloads {
		msgs[i] = qbroker.OutMessage{Payload: p, Priority: *priority, ContentType: *contentType, Delay: *delay, Group: *group}
		if len(headers) > 0 {
			msgs[i].Headers = headers
		}
		switch {
		case *dedupID == "":
		case len(msgs) == 1:
			msgs[i].DedupID = *dedupID
		default:
			msgs[i].DedupID = fmt.Sprintf("%s.%d", *dedupID, i+1)
		}
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if *batch {
		return publishPrinting(ctx, std, c, queue, msgs)
	}
	for _, m := range msgs {
		if err := publishPrinting(ctx, std, c, queue, []qbroker.OutMessage{m}); err != nil {
			return err
		}
	}
	return nil
}

// messageTexts returns the messages of `qbroker publish`: the arguments,
// or with stdin each line of standard input.
func messageTexts(std stdio, args []string, stdin bool) ([][]byte, error) {
	if !stdin {
		out := make([][]byte, len(args))
		for i, a := range args {
			out[i] = []byte(a)
		}
		return out, nil
	}
	var out [][]byte
	sc := bufio.NewScanner(std.in)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		out = append(out, append([]byte(nil), sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading stdin: %w", err)
	}
	return out, nil
}

// publishPrinting publishes msgs as one batch and prints their ids, one
// per line, a duplicate's followed by a tab and "duplicate".
func publishPrinting(ctx context.Context, std stdio, c *qbroker.Client, queue string, msgs []qbroker.OutMessage) error {
	rs, err := c.PublishReceipts(ctx, queue, msgs)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if r.Duplicate {
			fmt.Fprintf(std.out, "%s\tduplicate\n", r.ID)
		} else {
			fmt.Fprintln(std.out, r.ID)
		}
	}
	return nil
}

func runConsume(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("consume", "[flags] queue", `
Consumes messages and prints one line per message:
	<id> <tab> <delivery count> <tab> <payload> [<tab> <attribute>...]
(a payload that is not one line of UTF-8 is printed Go-quoted). A
message's content type and headers follow, one field each:
	content-type=<type> <tab> header.<key>=<value> ...
(keys and values quoted like payloads when they hold '=' or a tab). At
least once, the delivery's fencing token comes last:
	fencing-token=<token>
greater for every later delivery of the same message.

By default it streams until -n messages (0: until Ctrl-C). With --wait it
long-polls instead, and ends when a poll waited that long for nothing.

At most once (the default), a message is deleted as it is delivered, and
--no-ack changes nothing. At least once, each printed message is acked,
unless --no-ack. Then it is redelivered: streaming, when the command ends
(the stream's leases are released), or before if its lease (--visibility)
runs out first; with --wait, only once its lease runs out, even long after
the command ended (a poll's leases outlive it).
The broker streams at most --prefetch messages not yet acked, so
streaming with --no-ack needs -n (1..1000) and --prefetch defaults to it
(a smaller --prefetch is refused: the stream would stop there).
At most once, stopping with Ctrl-C loses the messages already delivered
but not printed: up to --prefetch streaming, up to one poll's (at most
100) with --wait; -n never loses any.`, std)
	var mode qbroker.DeliveryMode
	fs.TextVar(&mode, "mode", qbroker.AtMostOnce, "delivery `mode`: at-most-once or at-least-once")
	n := fs.Int("n", 0, "stop after this many messages; 0 means until Ctrl-C (or, with --wait, until the queue is empty)")
	prefetch := fs.Int("prefetch", 1, "messages the broker may send ahead (1..1000)")
	wait := fs.Duration("wait", 0, "long-poll with Receive, waiting this long for a message (at most 60s)")
	visibility := fs.Duration("visibility", 0, "at-least-once lease; 0 means the queue's")
	noAck := fs.Bool("no-ack", false, "at least once: do not ack")
	priority := fs.Int("priority", 0, "stream priority (-1000..1000): a broker sends to a stream only while none of higher priority has credit")
	pos, err := parse(fs, args, 1, 1)
	if err != nil {
		return err
	}
	queue := pos[0]
	if *n < 0 {
		return usagef("-n %d: want 0 or more", *n)
	}
	if *priority < qbroker.MinConsumerPriority || *priority > qbroker.MaxConsumerPriority {
		return usagef("--priority %d: want %d..%d", *priority, qbroker.MinConsumerPriority, qbroker.MaxConsumerPriority)
	}
	if *priority != 0 && *wait > 0 {
		return usagef("--priority is for streams, not --wait")
	}
	if mode == qbroker.AtLeastOnce && *noAck && *wait == 0 {
		if err := noAckPrefetch(fs, *n, prefetch); err != nil {
			return err
		}
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	ack := mode == qbroker.AtLeastOnce && !*noAck
	handle := func(m *qbroker.Message) error {
		fmt.Fprintf(std.out, "%s\t%d\t%s%s%s\n", m.ID, m.DeliveryCount, printable(m.Payload), attrFields(m), fenceField(m))
		if ack {
			// Not cancelled by Ctrl-C: a printed message is acked.
			return m.Ack(context.WithoutCancel(ctx))
		}
		return nil
	}
	if *wait > 0 {
		return receiveLoop(ctx, c, queue, qbroker.ReceiveOptions{Wait: *wait, Mode: mode, Visibility: *visibility}, *n, handle)
	}
	// The consumer ends with Close, not with ctx, so that Ctrl-C ends
	// the stream gracefully: acks already sent are applied.
	k, err := c.Consume(context.WithoutCancel(ctx), queue, qbroker.ConsumeOptions{Mode: mode, Prefetch: *prefetch, Visibility: *visibility, Max: *n, Priority: *priority})
	if err != nil {
		return err
	}
	for {
		select {
		case m, ok := <-k.Messages():
			if !ok {
				return k.Close()
			}
			if err := handle(m); err != nil {
				k.Close()
				return err
			}
		case <-ctx.Done():
			return k.Close()
		}
	}
}

// maxPrefetch is the broker's bound on a stream's credit.
const maxPrefetch = 1000

// noAckPrefetch sizes the prefetch of a streaming at-least-once consume
// that does not ack. The broker sends a stream at most its prefetch of
// unsettled messages, and an unacked message stays unsettled until the
// command ends: the stream would stop after --prefetch messages. So -n is
// required, and the prefetch defaults to it.
func noAckPrefetch(fs *flag.FlagSet, n int, prefetch *int) error {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "prefetch" })
	switch {
	case n == 0 || n > maxPrefetch:
		return usagef("--no-ack at least once needs -n (1..%d) when streaming: an unacked message holds its --prefetch place until the command ends; use --wait to read more without acking", maxPrefetch)
	case !set:
		*prefetch = n
	case *prefetch < n:
		return usagef("--no-ack with --prefetch %d would stop after %d of -n %d messages (an unacked message holds its place until the command ends): give --prefetch %d, or leave --prefetch out", *prefetch, *prefetch, n, n)
	}
	return nil
}

// receiveLoop long-polls until n messages (0: no limit) or a poll that
// returns nothing.
func receiveLoop(ctx context.Context, c *qbroker.Client, queue string, o qbroker.ReceiveOptions, n int, handle func(*qbroker.Message) error) error {
	for got := 0; n == 0 || got < n; {
		o.Max = 100
		if n > 0 {
			o.Max = min(n-got, 100)
		}
		ms, err := c.Receive(ctx, queue, o)
		if err != nil {
			return ignoreCanceled(err)
		}
		if len(ms) == 0 {
			return nil
		}
		for _, m := range ms {
			if err := handle(m); err != nil {
				return err
			}
		}
		got += len(ms)
	}
	return nil
}

// ignoreCanceled treats Ctrl-C as a clean end.
func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// printable returns a payload as one line.
func printable(p []byte) string {
	if utf8.Valid(p) && !strings.ContainsAny(string(p), "\n\r") {
		return string(p)
	}
	return strconv.Quote(string(p))
}

func runStats(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("stats", "[flags] [queue...]", `
Shows the counts of the given queues, or of all queues: messages ready,
in flight (at-least-once deliveries not yet acked), dead letters, the age
of the oldest ready message, open consumers, and for sync queues the
members joined and whether the queue is open.`, std)
	prefix := fs.String("prefix", "", "without queue arguments: only queues whose names start with this")
	names, err := parse(fs, args, 0, -1)
	if err != nil {
		return err
	}
	listed := len(names) == 0
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if listed {
		qs, err := c.ListQueues(ctx, *prefix)
		if err != nil {
			return err
		}
		for _, q := range qs {
			names = append(names, q.Name)
		}
	}
	// Every row is fetched before any is printed: on an error the
	// command prints nothing but the error.
	var rows []string
	for _, n := range names {
		st, err := c.Stats(ctx, n)
		if errors.Is(err, qbroker.ErrNotFound) && listed {
			continue // deleted since listed
		}
		if err != nil {
			return err
		}
		q, err := c.GetQueue(ctx, n)
		if err != nil && !errors.Is(err, qbroker.ErrNotFound) {
			return err
		}
		sync := "-"
		if q.Kind == qbroker.KindSync {
			sync = fmt.Sprintf("%d/%d", st.SyncJoined, q.SyncMembers)
			if st.SyncOpen {
				sync += " open"
			}
		}
		rows = append(rows, fmt.Sprintf("%s\t%d\t%d\t%d\t%v\t%d\t%s\n", st.Name, st.Ready, st.InFlight, st.Dead,
			st.OldestAge.Round(time.Millisecond), st.Consumers, sync))
	}
	tw := tabwriter.NewWriter(std.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tREADY\tIN-FLIGHT\tDEAD\tOLDEST\tCONSUMERS\tSYNC")
	for _, r := range rows {
		fmt.Fprint(tw, r)
	}
	return tw.Flush()
}

func runPurge(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("purge", "[flags] queue...", `
Deletes the ready messages of queues and prints how many per queue.
In-flight messages and dead letters stay. It shows how many messages each
queue holds and asks for confirmation on standard input, unless --yes (or
-f) is given, as a script must.`, std)
	var yes bool
	fs.BoolVar(&yes, "yes", false, "purge without asking")
	fs.BoolVar(&yes, "f", false, "same as --yes")
	names, err := parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if !yes {
		err := confirm(ctx, std, c, "purge", names, func(n string, st qbroker.Stats) string {
			return fmt.Sprintf("%s (%d ready messages)", n, st.Ready)
		})
		if err != nil {
			return err
		}
	}
	for _, n := range names {
		k, err := c.Purge(ctx, n)
		if err != nil {
			return err
		}
		fmt.Fprintf(std.out, "%s: purged %d\n", n, k)
	}
	return nil
}

func runDLQ(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("dlq", "[flags] queue [id...]", `
Lists a queue's dead letters, oldest first, one line each:
	<id> <tab> <delivery count> <tab> <published at> <tab> <payload> [<tab> <attribute>...]
(attributes as for consume).
It lists all of them (or --limit), fetching them a page at a time.
With --redrive, moves the dead letters with the given ids (all when none
are given) back to the queue with a fresh delivery count, and prints how
many moved.`, std)
	redrive := fs.Bool("redrive", false, "move dead letters back to the queue")
	limit := fs.Int("limit", 0, "most dead letters to list (0: all)")
	pos, err := parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	if *limit < 0 {
		return fmt.Errorf("--limit %d: want 0 (all) or more", *limit)
	}
	queue, ids := pos[0], pos[1:]
	if !*redrive && len(ids) > 0 {
		return errors.New("message ids are for --redrive")
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if *redrive {
		n, err := c.Redrive(ctx, queue, ids...)
		if err != nil {
			return err
		}
		fmt.Fprintf(std.out, "%s: redriven %d\n", queue, n)
		return nil
	}
	// Page by page, printed as they come: the list may not fit in one
	// answer, nor in memory.
	listed, token := 0, ""
	for {
		page := dlqPage
		if *limit > 0 {
			page = min(page, *limit-listed)
		}
		ms, next, err := c.DeadLettersPage(ctx, queue, token, page)
		if err != nil {
			return err
		}
		for _, m := range ms {
			printListed(std.out, m)
		}
		listed += len(ms)
		if token = next; token == "" || (*limit > 0 && listed >= *limit) {
			return nil
		}
	}
}

// dlqPage is how many dead letters `qbroker dlq` asks for at a time.
const dlqPage = 100
