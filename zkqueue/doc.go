// Package zkqueue is a distributed FIFO queue on Apache ZooKeeper: the
// seeds' DistributedQueue recipe, made production-grade. It is a library
// usable without the broker; it depends on go-zookeeper only.
//
// # Znode layout
//
//	<path>                      the queue (created with its parents by New)
//	<path>/qn-0000000000        one message: PERSISTENT_SEQUENTIAL,
//	<path>/qn-0000000001        data = small header + payload
//
// The header holds a format version, the delivery count and the publish
// time (see internal/qcore). Children whose names do not parse as messages
// are skipped and logged once, never fatal.
//
// # Consuming
//
// A consumer lists the children, sorts them by their sequence suffix
// (parsed as a signed integer, compared numerically, never as strings) and
// claims the head with getData + delete(version): whoever deletes the node
// owns the message. On NoNode another consumer won, so the next child of
// the same snapshot is tried; the children are listed again only when the
// snapshot is used up. All goroutines of one process that share a Queue
// share one snapshot and take distinct children from it, so they never
// race each other. Dequeue waits on a children watch, never polls.
//
// While a Queue is being consumed, it remembers the data of the messages
// it publishes (up to 4 MiB) until they are claimed: a message node never
// changes after its creation, so the claim of one of those is
// delete(version 0) without the read, the same claim one round trip
// shorter.
//
// # Guarantees
//
// Delivery is at-most-once: a message is never delivered twice. A consumer
// that dies after its claim (or whose delete succeeds while the connection
// drops before the answer) loses that message. Acknowledged, at-least-once
// delivery is the broker's (package broker): it moves a claimed message to
// a lease instead of deleting it.
//
// Order is FIFO by publish (sequence) order: a producer's messages are
// delivered in the order it published them; concurrent consumers may of
// course finish handling them in any order.
//
// # Limits
//
//   - Payload: 512 KiB by default (WithMaxPayload), below ZooKeeper's
//     jute.maxbuffer (1 MiB) with room for the header.
//   - Batch: 1,000 messages and 900 KiB by default, so one Multi stays under
//     jute.maxbuffer. Larger batches are rejected before anything is
//     written.
//   - The sequence counter is a signed 32-bit integer per parent node:
//     after 2^31 messages it wraps to negative numbers, which sort before
//     the positive ones, so a queue's lifetime is bounded by 2^31 publishes.
//     getChildren returns the whole child list in one packet, which bounds
//     the backlog to about 60,000 messages with the default 1 MiB
//     jute.maxbuffer on the server.
//
// A Queue is safe for concurrent use.
package zkqueue
