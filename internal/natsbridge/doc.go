// Package natsbridge is the optional NATS event bridge: it publishes the
// queue events a broker emits (internal/events) to NATS, or to a NATS
// JetStream stream, without ever blocking or failing the queue path.
//
// # Subjects
//
// Each event is one NATS message on
//
//	<prefix>.<queue>.<event>
//
// where prefix is Config.SubjectPrefix ("qbroker" by default; it may have
// several tokens, e.g. "qbroker.prod"), queue is the queue name and event is
// the event kind: published, delivered, acked, nacked, dead_lettered,
// sync_joined, sync_opened. Queue names ([A-Za-z0-9._-]) may contain '.',
// which would split the queue into several subject tokens; the bridge maps
// '.' to '~' in the subject token (see SubjectToken), so queue "orders.eu"
// publishes on "qbroker.orders~eu.published", queue "orders_eu" on
// "qbroker.orders_eu.published", and "qbroker.*.published" matches every
// queue. The mapping is one to one: two queues never share a subject.
//
// Coordination events (lock_granted, lock_released, leader_elected,
// leader_ended, semaphore_granted, semaphore_released) are on
// <prefix>.lock.<name>.<event>, <prefix>.election.<name>.<event> and
// <prefix>.semaphore.<name>.<event> (EventSubject): one token more than a
// queue's, so "qbroker.*.published" never matches them. Counter writes
// (counter_changed) are on <prefix>.counter.<name>.counter_changed.
// Barrier events (barrier_set, barrier_removed) are on
// <prefix>.barrier.<name>.<event>, double barrier events
// (double_barrier_entered, double_barrier_left, with the participant's
// key) on <prefix>.double_barrier.<name>.<event>.
//
// # Body
//
// The body is the JSON form of events.Event:
//
//	id              event id, broker independent (also Nats-Msg-Id in JetStream mode)
//	event           event kind, as in the subject
//	queue           queue name (exact)
//	message_id      message znode name; absent for group (sync) events
//	priority        message priority
//	size            payload size in bytes (always set, even when the payload is omitted)
//	delivery_count  deliveries so far
//	member          member id of sync events; absent otherwise
//	lock, election  the lock's or election's name (coordination events)
//	semaphore       the semaphore's name (semaphore events)
//	barrier, double_barrier  the barrier's name (barrier events)
//	key, token      the grant's or leadership's node name and fencing token
//	counter, value  the counter's name and its value after the write (counter
//	                events; value absent when 0)
//	broker          id of the emitting broker (Config.BrokerID when the event had none)
//	time            RFC 3339 time of the event
//	payload         base64 message body; only with Config.IncludePayload and at
//	                most Config.MaxPayload bytes (default 64 KiB), else absent
//	content_type    the message's content type; only with Config.IncludePayload
//	headers         the message's headers (a JSON object of strings); only with
//	                Config.IncludePayload, and left out with the payload when
//	                the body would exceed the server's max_payload
//
// # Delivery
//
// Delivery is best effort, at most once. Emit puts the event in a bounded
// buffer (Config.BufferSize, default 8192) and returns; one goroutine owned
// by the Bridge publishes from it. Events are dropped, and counted, when the
// buffer is full (NATS slow or down), when publishing fails, and when they
// are emitted after Close or are still unsent when Close's context ends.
//
// Core NATS mode publishes with nats.Conn.Publish. The connection
// reconnects forever (Config.ReconnectWait apart) and New succeeds even when
// NATS is down. While it knows itself disconnected, the publisher goroutine
// holds back: events wait in the bridge's own bounded buffer, are sent on
// reconnect, and overflow counted as buffer_full; Close drops (reason
// closed) what is still waiting then. nats.go's reconnect buffer
// (Config.ReconnectBufSize) only catches publishes that race with a
// disconnection. "Sent" means handed to nats.go: events in flight when the
// server dies are lost although counted as sent. Subscribers see events in publish order per
// bridge, never across brokers.
//
// JetStream mode (Config.JetStream) publishes asynchronously into
// Config.Stream and counts an event as sent when the stream acknowledges
// it. The stream is created when missing (subjects "<prefix>.>", file
// storage, limits retention, MaxAge Config.StreamMaxAge, duplicate window
// Config.DuplicateWindow); an existing stream is used unchanged. Each
// message carries the event id as Nats-Msg-Id, so the same event published
// again within the duplicate window (re-emitted by this or another broker,
// or retried by nats.go after a no-responders answer) is stored once. A
// publish whose ack fails or times out (Config.AckTimeout), or that was
// awaiting its ack when the connection dropped, is counted as dropped with
// reason publish_error even though the stream may have stored it. Events
// emitted before the very first connection are dropped in this mode
// (nats.go cannot send headers before the server said it supports them);
// after a later disconnection they wait in the reconnect buffer as in core
// mode. After every (re)connect the bridge looks the stream up again and
// recreates it if the server lost it.
//
// # Metrics
//
// Registered on Config.Registerer when it is not nil; a broker without the
// bridge registers the same series with RegisterDisabled, where they stay 0:
//
//	qbroker_events_published_total{event}   counter: events sent (JetStream: acked), by event kind
//	qbroker_events_dropped_total{reason}    counter: events dropped; reason is buffer_full
//	                                        (the buffer was full at Emit), publish_error
//	                                        (nats.go or the stream refused or did not ack)
//	                                        or closed (emitted after Close, or unsent when
//	                                        Close's context ended)
//	qbroker_nats_connected                  gauge: 1 when the NATS connection is up, else 0
//	qbroker_nats_reconnects_total           counter: reconnections to NATS
//
// Bridge.Stats returns the sent and dropped totals; after Close, sent plus
// dropped equals the number of Emit calls.
//
// # Lifecycle
//
// New connects and starts the publisher goroutine; Close stops accepting
// events, publishes what is buffered, waits for JetStream acks, drains the
// connection and stops the goroutine, all bounded by its context.
package natsbridge
