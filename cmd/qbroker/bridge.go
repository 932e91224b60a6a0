package main

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/internal/natsbridge"
)

// newEventBridge connects the NATS event bridge when --nats-url is set. It
// starts even when NATS is down: events are dropped and counted until it is
// reachable. Without --nats-url there is no sink, and the bridge's metrics
// are registered anyway, at 0, so dashboards need not know how the broker
// was started.
func newEventBridge(o *serveOptions, reg prometheus.Registerer, log *slog.Logger) (events.Sink, func(context.Context), error) {
	if o.nats.url == "" {
		return nil, nil, natsbridge.RegisterDisabled(reg)
	}
	auth, err := o.nats.auth.auth()
	if err != nil {
		return nil, nil, err
	}
	b, err := natsbridge.New(natsbridge.Config{
		URL:            o.nats.url,
		Auth:           auth,
		SubjectPrefix:  o.nats.prefix,
		BufferSize:     o.nats.buffer,
		IncludePayload: o.nats.payload,
		MaxPayload:     o.nats.maxPayload,
		JetStream:      o.nats.jetstream,
		Stream:         o.nats.stream,
		BrokerID:       o.id,
		Registerer:     reg,
		Logger:         log.With("component", "natsbridge"),
	})
	if err != nil {
		return nil, nil, err
	}
	return b, func(ctx context.Context) {
		if err := b.Close(ctx); err != nil {
			log.Warn("event bridge close", "err", err)
		}
	}, nil
}
