package broker

import (
	"context"

	"github.com/qbroker/qbroker/zkqueue"
)

// Registrations.
//
// The broker keeps two kinds of EPHEMERAL nodes through session changes
// with its zkutil.Keeper (b.keeper, which explains why a create and a
// delete are not enough): brokers/<id> while the broker runs, and one
// consumer registration in queues/<q>/consumers (named by the queue's
// zkqueue.ConsumerGroup) while one of its Consume streams is open. The
// group counts the registrations (Stats) and ranks the brokers consuming
// the queue (the dispatcher's share split).

// consumerGroup returns the consumer registrations of the queue at p, as
// this broker sees them.
func (b *Broker) consumerGroup(p string) (*zkqueue.ConsumerGroup, error) {
	return zkqueue.NewConsumerGroup(b.conn, p+"/consumers", b.cfg.ID,
		zkqueue.ConsumerGroupConfig{Own: b.ownRegistration, ACL: b.acl})
}

// ownRegistration reports whether this broker's registration at p counts:
// only while its stream is open. One it does not know of (left by its
// previous process, whose session has not expired yet) is deleted.
func (b *Broker) ownRegistration(p string) bool {
	known, wanted := b.keeper.Tracked(p)
	if !known {
		b.keeper.Stray(p)
	}
	return wanted
}

// registerConsumer records an open stream as an ephemeral node, so Stats
// counts consumers on all brokers and brokers split the queue. It returns
// the unregister func.
func (b *Broker) registerConsumer(q *queue) func() {
	g := b.metrics.consumers.WithLabelValues(q.label)
	g.Inc()
	e := b.keeper.Keep(q.consumers.NewRegistrationPath(), nil)
	return func() {
		g.Dec()
		b.keeper.Drop(e)
	}
}

// countConsumers counts q's live Consume streams on all brokers.
func (b *Broker) countConsumers(q *queue) (int, error) {
	return q.consumers.Count(context.Background())
}
