// Package events defines the queue events a broker emits (published,
// delivered, acked, ...), its coordination events (lock granted and
// released, leader elected and ended, semaphore permits granted and
// released) and the sink interface that
// carries them out of the process, such as the NATS bridge.
package events

import (
	"fmt"
	"time"
)

// Kind is what happened to a message or a group.
type Kind string

// Event kinds. Each is the last token of the NATS subject
// <prefix>.<queue>.<kind>.
const (
	Published    Kind = "published"
	Delivered    Kind = "delivered"
	Acked        Kind = "acked"
	Nacked       Kind = "nacked"
	DeadLettered Kind = "dead_lettered"
	SyncJoined   Kind = "sync_joined"
	SyncOpened   Kind = "sync_opened"
)

// Coordination event kinds: a lock granted or released, a leadership won
// or ended, through the broker's Lock and Election services. Their NATS
// subject is <prefix>.lock.<name>.<kind> or <prefix>.election.<name>.<kind>.
const (
	LockGranted   Kind = "lock_granted"
	LockReleased  Kind = "lock_released"
	LeaderElected Kind = "leader_elected"
	LeaderEnded   Kind = "leader_ended"
)

// CounterChanged is a write of a counter through the broker's Counter
// service (Adds combined into one write: one event). Its NATS subject is
// <prefix>.counter.<name>.counter_changed.
const CounterChanged Kind = "counter_changed"

// Semaphore event kinds: permits granted or given back through the
// broker's Semaphore service. Their NATS subject is
// <prefix>.semaphore.<name>.<kind>.
const (
	SemaphoreGranted  Kind = "semaphore_granted"
	SemaphoreReleased Kind = "semaphore_released"
)

// Barrier event kinds, through the broker's Barrier and DoubleBarrier
// services: a barrier set or removed (NATS subject
// <prefix>.barrier.<name>.<kind>), a double barrier's participant entered
// or left (<prefix>.double_barrier.<name>.<kind>).
const (
	BarrierSet           Kind = "barrier_set"
	BarrierRemoved       Kind = "barrier_removed"
	DoubleBarrierEntered Kind = "double_barrier_entered"
	DoubleBarrierLeft    Kind = "double_barrier_left"
)

// Event is one queue event. Its JSON form is the body of a NATS message.
type Event struct {
	// ID identifies the event independently of the broker that emitted it:
	// the same event re-sent (by any broker) has the same ID, which
	// JetStream uses to deduplicate (Nats-Msg-Id).
	ID string `json:"id"`
	// Kind is what happened.
	Kind Kind `json:"event"`
	// Queue is the queue name.
	Queue string `json:"queue"`
	// MessageID is the message's znode name; empty for group events.
	MessageID string `json:"message_id,omitempty"`
	// Priority of the message (priority queues).
	Priority int `json:"priority"`
	// Size is the payload size in bytes.
	Size int `json:"size"`
	// DeliveryCount is the message's deliveries so far.
	DeliveryCount int `json:"delivery_count"`
	// Member is the member id of sync events.
	Member string `json:"member,omitempty"`
	// Lock is the lock's name (lock events).
	Lock string `json:"lock,omitempty"`
	// Election is the election's name (election events).
	Election string `json:"election,omitempty"`
	// Semaphore is the semaphore's name (semaphore events).
	Semaphore string `json:"semaphore,omitempty"`
	// Barrier is the barrier's name (barrier events).
	Barrier string `json:"barrier,omitempty"`
	// DoubleBarrier is the double barrier's name (double barrier events).
	DoubleBarrier string `json:"double_barrier,omitempty"`
	// Key is the grant's or the leadership's node name (coordination
	// events), or the double barrier participant's.
	Key string `json:"key,omitempty"`
	// Token is the grant's or the leadership's fencing token
	// (coordination events).
	Token int64 `json:"token,omitempty"`
	// Counter is the counter's name (counter events).
	Counter string `json:"counter,omitempty"`
	// Value is the counter's value after the write (counter events;
	// left out when 0).
	Value int64 `json:"value,omitempty"`
	// Broker is the id of the emitting broker.
	Broker string `json:"broker"`
	// Time is when it happened.
	Time time.Time `json:"time"`
	// Payload is the message body, when the sink asked for payloads and it
	// is within the sink's cap.
	Payload []byte `json:"payload,omitempty"`
	// ContentType and Headers are the message's attributes, kept or left
	// out by the sink together with the payload.
	ContentType string            `json:"content_type,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
}

// MakeID returns the broker-independent id of an event: the same message,
// kind and delivery count always give the same id.
func MakeID(queue, messageID string, kind Kind, deliveryCount int, member string) string {
	if member != "" {
		return fmt.Sprintf("%s/%s/%s", queue, kind, member)
	}
	return fmt.Sprintf("%s/%s/%s/%d", queue, messageID, kind, deliveryCount)
}

// Sink receives events. Emit must never block nor fail the caller: a sink
// that cannot keep up drops events and counts them.
type Sink interface {
	Emit(Event)
}
