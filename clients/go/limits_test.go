package qbroker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/zktest"
)

// startOneStreamBroker starts a broker that allows one stream at a time.
func startOneStreamBroker(t *testing.T, reg prometheus.Registerer) *testBroker {
	t.Helper()
	tb, err := serveBroker(broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t),
		SessionTimeout: 4 * time.Second, MaxStreams: 1, Registerer: reg}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tb.stop)
	return tb
}

// A consumer the brokers keep refusing with ResourceExhausted (their
// stream limit) ends with ErrResourceExhausted after ExhaustedTimeout
// instead of retrying forever; one whose stream is admitted within it
// consumes normally.
func TestConsumerGivesUpWhenExhausted(t *testing.T) {
	reg := prometheus.NewRegistry()
	tb := startOneStreamBroker(t, reg)
	c := dial(t, tb.addr)
	ctx := testCtx(t)
	createQueue(t, c, "q", qbroker.QueueOptions{})
	if _, err := c.Publish(ctx, "q", []byte("m")); err != nil {
		t.Fatal(err)
	}

	// One consumer takes the broker's only stream.
	holder, err := c.Consume(ctx, "q", qbroker.ConsumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m := next(t, holder); string(m.Payload) != "m" {
		t.Fatalf("holder got %q", m.Payload)
	}

	k, err := c.Consume(ctx, "q", qbroker.ConsumeOptions{ExhaustedTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = k.Next(wctx)
	if !errors.Is(err, qbroker.ErrResourceExhausted) {
		t.Fatalf("Next of a consumer refused for its timeout: %v, want ErrResourceExhausted", err)
	}
	if err := k.Close(); !errors.Is(err, qbroker.ErrResourceExhausted) {
		t.Fatalf("Close: %v, want ErrResourceExhausted", err)
	}

	// Refused at first, then admitted once the holder leaves: it goes on.
	before := refusals(reg)
	k2, err := c.Consume(ctx, "q", qbroker.ConsumeOptions{ExhaustedTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer k2.Close()
	eventually(t, "the second consumer refused", func() (bool, error) {
		return refusals(reg) > before, nil
	})
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "q", []byte("n")); err != nil {
		t.Fatal(err)
	}
	if m := next(t, k2); string(m.Payload) != "n" {
		t.Fatalf("got %q", m.Payload)
	}
}

// refusals is the broker's count of streams refused at its limit.
func refusals(reg *prometheus.Registry) float64 {
	fams, err := reg.Gather()
	if err != nil {
		return -1
	}
	for _, f := range fams {
		if f.GetName() != "qbroker_streams_refused_total" {
			continue
		}
		n := 0.0
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == "max_streams" {
					n += m.GetCounter().GetValue()
				}
			}
		}
		return n
	}
	return 0
}

// A refusal the client makes itself says "qbroker:" once.
func TestClientRefusalSaysPrefixOnce(t *testing.T) {
	_, c := setup(t)
	_, err := c.CreateQueue(testCtx(t), "q", qbroker.QueueOptions{MaxDeliveries: -1})
	if !errors.Is(err, qbroker.ErrInvalidArgument) || strings.Count(err.Error(), "qbroker:") != 1 {
		t.Fatalf("CreateQueue with a negative option: got %v, want ErrInvalidArgument saying qbroker: once", err)
	}
}
