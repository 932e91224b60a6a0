package natsbridge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// streamRetryInterval bounds how often a failed stream lookup or
	// creation is retried (and logged).
	streamRetryInterval = 5 * time.Second
	// streamRequestTimeout bounds one stream lookup or creation.
	streamRequestTimeout = 5 * time.Second
)

// maybeEnsureStream looks up, or creates, the stream when NATS is up and,
// unless force is set, no attempt was made in the last
// streamRetryInterval. It runs on run's goroutine, which owns lastEnsure.
func (b *Bridge) maybeEnsureStream(force bool) {
	if !b.nc.IsConnected() {
		return
	}
	if !force && !b.lastEnsure.IsZero() && time.Since(b.lastEnsure) < streamRetryInterval {
		return
	}
	b.lastEnsure = time.Now()
	ctx, cancel := context.WithTimeout(b.stop, streamRequestTimeout)
	defer cancel()
	if err := b.ensureStream(ctx); err != nil {
		b.log.Error("jetstream stream unavailable, events may be dropped", "stream", b.cfg.Stream, "err", err)
		return
	}
	b.streamReady.Store(true)
}

// ensureStream creates the stream unless it exists; an existing stream is
// used as it is.
func (b *Bridge) ensureStream(ctx context.Context) error {
	_, err := b.js.Stream(ctx, b.cfg.Stream)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("natsbridge: stream %s: %w", b.cfg.Stream, err)
	}
	_, err = b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        b.cfg.Stream,
		Description: "qbroker queue events",
		Subjects:    []string{b.prefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     jetstream.FileStorage,
		MaxAge:      b.cfg.StreamMaxAge,
		Duplicates:  b.cfg.DuplicateWindow,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil // created meanwhile by another broker
	}
	if err != nil {
		return fmt.Errorf("natsbridge: create stream %s: %w", b.cfg.Stream, err)
	}
	b.log.Info("jetstream stream created", "stream", b.cfg.Stream, "subjects", b.prefix+".>")
	return nil
}

// onAck is nats.go's async ack handler: it must not block.
func (b *Bridge) onAck(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
	b.resolve(m, nil)
}

// onAckErr is nats.go's async publish error handler (ack error, ack
// timeout, disconnection while awaiting the ack).
func (b *Bridge) onAckErr(_ jetstream.JetStream, m *nats.Msg, err error) {
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		b.streamReady.Store(false) // the stream may have been deleted
	}
	b.resolve(m, err)
}

// resolve counts m as sent (err == nil) or dropped, once: a message already
// resolved, or dropped by Close, is ignored. Counting happens under
// inflightMu so that, once dropInflight has run, every message is counted.
func (b *Bridge) resolve(m *nats.Msg, err error) {
	b.inflightMu.Lock()
	kind, ok := b.inflight[m]
	if ok {
		delete(b.inflight, m)
		if err == nil {
			b.sent.Add(1)
			b.m.publishedInc(kind)
		} else {
			b.drop(ReasonPublishError)
		}
	}
	b.inflightMu.Unlock()
	if !ok {
		return
	}
	if err == nil {
		b.failing.Store(false)
		return
	}
	b.logFailure(kind, err)
}

// dropInflight counts the publishes still awaiting an ack, after the
// connection is closed, as dropped (reason closed).
func (b *Bridge) dropInflight() {
	b.inflightMu.Lock()
	defer b.inflightMu.Unlock()
	for m := range b.inflight {
		delete(b.inflight, m)
		b.drop(ReasonClosed)
	}
}
