package main

import (
	"context"
	"fmt"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// consumer runs one Consume stream and reports every delivery to the
// checker. At least once, it nacks the first delivery of the messages
// shouldNack picks and acks everything else.
type consumer struct {
	*shared
	id     int
	client *qbroker.Client
	hist   *hdrhistogram.Histogram // end-to-end latency; read once run returned
	// unsettled: when the consumer took the earliest delivery whose
	// settlement failed; with --single-active it is held until the
	// stream ends. Zero if none.
	unsettled time.Time
}

// maxReceive is the most messages one Receive call returns.
const maxReceive = 100

// receiveWait bounds a Receive that finds the queue empty.
const receiveWait = time.Second

// run consumes until stop is closed or ctx ends; it returns the error
// that ended the stream otherwise (or failed to open it).
func (c *consumer) run(ctx context.Context, stop <-chan struct{}) error {
	if c.cfg.ConfirmAcks {
		return c.receive(ctx, stop)
	}
	defer c.streamEnded() // after Close: the stream's end
	cons, err := c.client.Consume(ctx, c.cfg.Queue, qbroker.ConsumeOptions{Mode: c.cfg.Mode, Prefetch: c.cfg.Prefetch, Confirm: c.cfg.ConfirmOnStream})
	if err != nil {
		c.errs.add("consume", err)
		return fmt.Errorf("consumer %d: %w", c.id, err)
	}
	defer cons.Close()
	for {
		select {
		case m, ok := <-cons.Messages():
			if !ok {
				if err := cons.Err(); err != nil && ctx.Err() == nil {
					c.errs.add("consume", err)
					return fmt.Errorf("consumer %d: %w", c.id, err)
				}
				return nil
			}
			c.handle(ctx, m)
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// receive takes up to cfg.Prefetch messages a call with Receive (at
// least once) and handles them one by one: their acks are Ack calls,
// each returning once committed. It runs until stop is closed or ctx
// ends; a failed Receive is counted and tried again.
func (c *consumer) receive(ctx context.Context, stop <-chan struct{}) error {
	rctx, cancel := context.WithCancel(ctx)
	watched := make(chan struct{})
	defer func() {
		cancel()
		<-watched
	}()
	go func() {
		defer close(watched)
		select {
		case <-stop:
			cancel()
		case <-rctx.Done():
		}
	}()
	for rctx.Err() == nil {
		ms, err := c.client.Receive(rctx, c.cfg.Queue, qbroker.ReceiveOptions{Max: c.cfg.Prefetch, Wait: receiveWait, Mode: qbroker.AtLeastOnce})
		if err != nil {
			if rctx.Err() == nil {
				c.errs.add("receive", err)
				sleepUntil(rctx, time.Now().Add(10*time.Millisecond))
			}
			continue
		}
		for _, m := range ms {
			c.handle(rctx, m)
		}
	}
	return nil
}

func (c *consumer) handle(ctx context.Context, m *qbroker.Message) {
	now := time.Now()
	c.live.deliveries.Add(1)
	ackMode := c.cfg.Mode == qbroker.AtLeastOnce
	h, err := decodePayload(m.Payload)
	if err != nil {
		c.checker.Corrupt(m.ID, err)
		if ackMode {
			c.held(now, c.settle(ctx, m, false)) // out of the way
		}
		return
	}
	first := m.DeliveryCount <= 1
	if first {
		record(c.hist, now.Sub(h.Sent))
		if c.tenants != nil {
			c.tenants.record(tenantOf(c.cfg, h.msgKey.Producer), now.Sub(h.Sent))
		}
	}
	if c.cfg.Work > 0 {
		sleepUntil(ctx, time.Now().Add(c.cfg.Work))
	}
	c.checker.Delivered(c.id, h.msgKey, m.Priority, m.ID, m.DeliveryCount)
	if !ackMode {
		c.held(now, true)
		return
	}
	nack := first && shouldNack(h.msgKey, c.cfg.NackRate)
	ok := c.settle(ctx, m, nack)
	c.held(now, ok)
	if ok && !nack {
		c.checker.Acked(h.msgKey, c.id)
	}
}

// held reports a delivery taken at from as held until now when settled,
// else until the stream ends (--single-active).
func (c *consumer) held(from time.Time, settled bool) {
	if settled {
		c.checker.Held(c.id, from, time.Now())
	} else if c.unsettled.IsZero() {
		c.unsettled = from
	}
}

// streamEnded reports a delivery whose settlement failed as held until
// now, the end of the stream.
func (c *consumer) streamEnded() {
	if !c.unsettled.IsZero() {
		c.checker.Held(c.id, c.unsettled, time.Now())
	}
}

// settle acks or nacks m and reports whether that succeeded.
func (c *consumer) settle(ctx context.Context, m *qbroker.Message, nack bool) bool {
	var err error
	op := "ack"
	if nack {
		op = "nack"
		err = m.Nack(ctx, 0)
	} else {
		err = m.Ack(ctx)
	}
	if err != nil {
		if ctx.Err() == nil {
			c.errs.add(op, err)
		}
		return false
	}
	if !nack {
		c.live.acked.Add(1)
	}
	return true
}
