// Package priority is a distributed priority queue on Apache ZooKeeper:
// seed 001's "queue-YY" recipe, made production-grade. It is a library
// usable without the broker; it depends on go-zookeeper only.
//
// # Znode layout
//
//	<path>                                      the queue (created with its parents by New)
//	<path>/p000-s0000000000000000001            segment 1 of priority 0's chain
//	<path>/p000-s0000000000000000001/p000-1-0000000007   one message of priority 0 (most
//	                                            urgent): PERSISTENT_SEQUENTIAL, name = "p" +
//	                                            3-digit priority + segment + ZooKeeper's sequence;
//	                                            data = small header + payload
//	<path>/p007-s0000000000000000004/p007-4-0000000003   one message of priority 7
//
// Each priority level is a chain of segments of zkqueue's segment size
// (zkqueue's node.go), each with its own sequence counter. The header
// holds a format version, the delivery count and the publish time (see
// package zkqueue). Children whose names do not parse as messages are
// skipped and logged once, never fatal.
//
// # Ordering
//
// Priorities run from 0 (most urgent) to MaxPriority (255); anything else
// is rejected with ErrBadPriority before anything is written. Messages are
// delivered in (priority, sequence) order, both compared numerically: the
// most urgent first and, within one priority, in publish order (FIFO). A
// PublishBatch keeps the order of its items of equal priority.
//
// # Seeing newly published urgent messages
//
// A consumer works from a sorted snapshot of the head segments of the most
// urgent levels that hold messages. In a FIFO queue a stale snapshot is
// harmless, since new messages sort after it; here a new message may sort
// first. Seed 001 has the consumer call sync() after each message. This
// package instead builds its zkqueue.Queue WithPriorities: every snapshot
// is read together with children watches (on the head, on the empty tails
// of the more urgent levels and on the parent, where new levels appear),
// and a snapshot is dropped as soon as one has fired, i.e. as soon as
// anything was published there or taken since the read. A claim's own
// delete fires the watch too, so in practice every claim starts from a
// fresh listing of its head segment.
//
// ZooKeeper delivers a session's watch notification before the answer to
// any later request of that session. Hence the guarantee: if a message A
// was published (its Publish returned) before a consumer started its
// previous Dequeue, that consumer does not deliver a less urgent message
// while A is still queued. Tests check exactly this.
//
// The in-flight window. A consumer that already holds a candidate from the
// snapshot taken before A became visible to its session finishes claiming
// that candidate, so one less urgent message may be delivered after A was
// published: at most one per concurrent consumer (one per goroutine
// sharing a Queue, and one per process or session). The next claim of each
// of them sees A. Sessions on different servers of an ensemble see a
// publish when their server has applied it, a few milliseconds apart at
// most; that lag is part of the same window (sync() would close it at the
// cost of one more round trip per message).
//
// # Guarantees
//
// Delivery is at-most-once, as in package zkqueue: whoever deletes the
// node owns the message; a consumer that dies after its claim loses it.
// Acknowledged delivery is the broker's.
//
// # Limits and costs
//
//   - Priority: 0..255 (MaxPriority), checked before anything is written.
//   - Payload: 512 KiB by default (WithMaxPayload), below jute.maxbuffer.
//   - Batch: 1,000 messages and 900 KiB by default (one Multi must stay
//     under jute.maxbuffer); larger batches are rejected unwritten.
//   - A claim costs a getData, a delete and a getChildren of the head
//     segment (up to the segment size, zkqueue.WithSegmentSize): smaller
//     segments make priority claims cheaper (figures at
//     zkqueue.DefaultSegmentSize). The backlog and the queue's lifetime
//     are not bounded by a listing or a sequence counter (zkqueue's Limits).
//
// A Queue is safe for concurrent use.
package priority
