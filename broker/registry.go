package broker

import (
	"context"
)

// Registrations.
//
// The broker keeps two kinds of EPHEMERAL nodes through session changes:
// brokers/<id> while the broker runs, with its zkutil.Keeper (b.keeper,
// which explains why a create and a delete are not enough), and one
// consumer registration in the queue's consumers/ while one of its
// Consume streams is open, with the queue's zkqueue.ConsumerGroup and the
// broker's zkqueue.Registry (b.registry, shared by all queues, so a
// handle opened anew knows the registrations made through the old one).
// The group counts the registrations (Stats) and ranks the brokers
// consuming the queue (the dispatcher's share split).

// registerConsumer records an open stream as an ephemeral node, so Stats
// counts consumers on all brokers and brokers split the queue. It returns
// the unregister func.
func (b *Broker) registerConsumer(ctx context.Context, q *queue) func() {
	g := b.metrics.consumers.WithLabelValues(q.label)
	g.Inc()
	r, err := q.consumers.Register(ctx)
	if err != nil {
		// The queue was deleted (its next call says so), or the stream
		// ended.
		b.log.Debug("consumer registration", "queue", q.name, "err", err)
	}
	return func() {
		g.Dec()
		if r != nil {
			_ = r.Close()
		}
	}
}

// countConsumers counts q's live Consume streams on all brokers.
func (b *Broker) countConsumers(q *queue) (int, error) {
	return q.consumers.Count(context.Background())
}
