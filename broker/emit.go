package broker

import (
	"time"

	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/zkqueue"
)

// Queue events go to Config.Events (the NATS bridge). Without a sink
// none is built: the message path checks b.events before it calls in
// here.

// emit emits an event for message m of q (member: of a sync group
// event).
func (b *Broker) emit(kind events.Kind, q *queue, m zkqueue.Message, member string) {
	b.emitSized(kind, q, m, len(m.Payload), member)
}

// emitSized emits an event for a message that may be known by its size
// only (an ack that did not read the message). It builds every event the
// broker emits.
func (b *Broker) emitSized(kind events.Kind, q *queue, m zkqueue.Message, size int, member string) {
	if b.events == nil {
		return // no sink
	}
	b.events.Emit(events.Event{
		ID:        events.MakeID(q.name, m.ID, kind, m.Deliveries, member),
		Kind:      kind,
		Queue:     q.name,
		MessageID: m.ID,
		Priority:  m.Priority,
		Size:      size,
		// Events carry the payload, when known; the sink decides
		// whether to keep it.
		Payload:       m.Payload,
		ContentType:   m.ContentType,
		Headers:       m.Headers,
		DeliveryCount: m.Deliveries,
		Member:        member,
		Broker:        b.cfg.ID,
		Time:          time.Now(),
	})
}
