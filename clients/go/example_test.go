package qbroker_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/zktest"
)

// exampleBroker starts an in-process broker on the test package's
// ZooKeeper and returns its address and a func that stops it. Outside
// examples, a broker runs as `qbroker serve` (or `qbroker dev`).
func exampleBroker() (addr string, stop func()) {
	zk, err := zktest.ServerAddr()
	if err != nil {
		log.Fatal(err)
	}
	tb, err := newBroker(zk, randomRoot(), "")
	if err != nil {
		log.Fatal(err)
	}
	return tb.addr, tb.stop
}

// Publish messages, then consume them at least once: each is acked after
// it was handled, or it would be redelivered.
func Example() {
	addr, stop := exampleBroker()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := qbroker.Dial(ctx, addr)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateQueue(ctx, "orders", qbroker.QueueOptions{VisibilityTimeout: time.Minute}); err != nil {
		log.Fatal(err)
	}
	for _, p := range []string{"apples", "pears", "plums"} {
		if _, err := c.Publish(ctx, "orders", []byte(p)); err != nil {
			log.Fatal(err)
		}
	}

	cons, err := c.Consume(ctx, "orders", qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce, Prefetch: 2})
	if err != nil {
		log.Fatal(err)
	}
	defer cons.Close()
	for range 3 {
		m, err := cons.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s (delivery %d)\n", m.Payload, m.DeliveryCount)
		if err := m.Ack(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// apples (delivery 1)
	// pears (delivery 1)
	// plums (delivery 1)
}

// A priority queue delivers the most urgent message first; Receive takes
// a batch in one call.
func ExampleClient_Receive() {
	addr, stop := exampleBroker()
	defer stop()
	ctx := context.Background()
	c, err := qbroker.Dial(ctx, addr, qbroker.WithCallTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateQueue(ctx, "alerts", qbroker.QueueOptions{Kind: qbroker.KindPriority}); err != nil {
		log.Fatal(err)
	}
	for _, a := range []struct {
		text     string
		priority int
	}{{"disk 80%", 5}, {"disk full", 0}, {"disk 90%", 2}} {
		if _, err := c.Publish(ctx, "alerts", []byte(a.text), qbroker.WithPriority(a.priority)); err != nil {
			log.Fatal(err)
		}
	}
	ms, err := c.Receive(ctx, "alerts", qbroker.ReceiveOptions{Max: 10, Wait: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range ms {
		fmt.Println(m.Priority, string(m.Payload))
	}
	// Output:
	// 0 disk full
	// 2 disk 90%
	// 5 disk 80%
}

// Broker errors match sentinels with errors.Is.
func ExampleError() {
	addr, stop := exampleBroker()
	defer stop()
	ctx := context.Background()
	c, err := qbroker.Dial(ctx, addr, qbroker.WithCallTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	_, err = c.Publish(ctx, "no-such-queue", []byte("x"))
	fmt.Println(errors.Is(err, qbroker.ErrNotFound))
	var e *qbroker.Error
	if errors.As(err, &e) {
		fmt.Println(e.Code)
	}
	// Output:
	// true
	// NotFound
}
