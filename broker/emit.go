package broker

import (
	"time"

	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/zkqueue"
)

// Queue events go to Config.Events (the NATS bridge). Without a sink
// none is built: the message path checks b.ev.sink before it calls in
// here.

// emitter builds and emits the broker's events: those of queues here,
// those of the coordination services in coord.go and its neighbours.
type emitter struct {
	b    *Broker
	sink events.Sink // nil: no events
}

// emit emits an event for message m of q (member: of a sync group
// event).
func (em *emitter) emit(kind events.Kind, q *queue, m zkqueue.Message, member string) {
	em.emitSized(kind, q, m, len(m.Payload), member)
}

// emitSized emits an event for a message that may be known by its size
// only (an ack that did not read the message). It builds every event the
// broker emits.
func (em *emitter) emitSized(kind events.Kind, q *queue, m zkqueue.Message, size int, member string) {
	b := em.b
	if em.sink == nil {
		return // no sink
	}
	em.sink.Emit(events.Event{
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
