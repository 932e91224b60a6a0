// Command fencing is a consumer whose effect is a row in a SQLite table,
// fenced by the deliveries' fencing tokens: it receives one message at
// least once, writes its effect with the delivery's token (Sink.Write
// refuses a token not greater than the stored one), and acks.
//
//	fencing -addr 127.0.0.1:7070 -queue jobs -db effects.db -name worker-1
//	fencing -db effects.db -dump
//
// With -hold it stops between receiving and writing until a line arrives
// on its standard input: a consumer paused (a GC pause, SIGSTOP, a slow
// call) while its lease runs out. Meanwhile the message is delivered
// again, to another consumer, with a greater token; when the paused one
// goes on, its write is refused and its ack fails. See docs/fencing.md.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7070", "broker address")
	queue := flag.String("queue", "jobs", "queue to consume")
	db := flag.String("db", "effects.db", "SQLite database file")
	name := flag.String("name", "worker", "this consumer's name, written with its effects")
	hold := flag.Bool("hold", false, "wait for a line on standard input between receiving and writing")
	wait := flag.Duration("wait", 30*time.Second, "how long to wait for a message")
	dump := flag.Bool("dump", false, "print the table's rows and exit")
	flag.Parse()
	o := options{addr: *addr, queue: *queue, db: *db, name: *name, hold: *hold, wait: *wait, dump: *dump}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "fencing:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	addr, queue, db, name string
	hold                  bool
	wait                  time.Duration
	dump                  bool
}

func run(o options) error {
	ctx := context.Background()
	sink, err := OpenSink(o.db)
	if err != nil {
		return err
	}
	defer sink.Close()
	if o.dump {
		rows, err := sink.Rows(ctx)
		if err != nil {
			return err
		}
		for _, r := range rows {
			fmt.Printf("row %s fence=%d value=%q\n", r.Key, r.Fence, r.Value)
		}
		return nil
	}

	c, err := qbroker.Dial(ctx, o.addr)
	if err != nil {
		return err
	}
	defer c.Close()
	ms, err := c.Receive(ctx, o.queue, qbroker.ReceiveOptions{Mode: qbroker.AtLeastOnce, Wait: o.wait})
	if err != nil {
		return err
	}
	if len(ms) == 0 {
		return fmt.Errorf("no message within %v", o.wait)
	}
	m := ms[0]
	fmt.Printf("received %s delivery=%d token=%d\n", m.ID, m.DeliveryCount, m.FencingToken)
	if o.hold {
		fmt.Println("holding")
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return fmt.Errorf("waiting on standard input: %w", err)
		}
	}
	// The effect: whatever handling the message produced, keyed by the
	// message, stored with the delivery's token.
	err = sink.Write(ctx, m.ID, fmt.Sprintf("%s handled by %s", m.Payload, o.name), m.FencingToken)
	switch {
	case errors.Is(err, ErrStale):
		fmt.Printf("refused %s token=%d: %v\n", m.ID, m.FencingToken, err)
		return nil // superseded: nothing to ack
	case err != nil:
		return err
	}
	fmt.Printf("wrote %s token=%d\n", m.ID, m.FencingToken)
	if err := m.Ack(ctx); err != nil {
		fmt.Printf("ack failed: %v\n", err)
		return nil
	}
	fmt.Println("acked")
	return nil
}
