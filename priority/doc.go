// Package priority is a distributed priority queue on Apache ZooKeeper:
// seed 001's "queue-YY" recipe, made production-grade. It is a library
// usable without the broker; it depends on go-zookeeper only.
//
// # Znode layout
//
//	<path>                      the queue (created with its parents by New)
//	<path>/p000-0000000007      one message of priority 0 (most urgent):
//	<path>/p007-0000000003      PERSISTENT_SEQUENTIAL, name = "p" + 3-digit
//	<path>/p255-0000000012      priority + "-" + ZooKeeper's sequence;
//	                            data = small header + payload
//
// The header holds a format version, the delivery count and the publish
// time (see package zkqueue). Children whose names do not parse as messages
// are skipped and logged once, never fatal. All priorities share the
// parent's one sequence counter.
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
// A consumer works from a sorted snapshot of the children. In a FIFO queue a
// stale snapshot is harmless, since new messages sort after it; here a new
// message may sort first. Seed 001 has the consumer call sync() after each
// message. This package instead builds its zkqueue.Queue WithPriorities: every
// snapshot is read together with a children watch, and a snapshot is
// dropped as soon as that watch has fired, i.e. as soon as anything was
// published or taken since the read. A claim's own delete fires the watch
// too, so in practice every claim starts from a fresh child list.
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
//   - Strict mode reads the child list once per claim, so a claim costs a
//     getData, a delete and a getChildren of the whole backlog: keep the
//     backlog of a priority queue well below the ~60,000-children bound of
//     a FIFO queue (getChildren takes ~1 ms at 10k children).
//   - The sequence counter is a signed 32-bit integer per queue node: it
//     wraps after 2^31 publishes, bounding a queue's lifetime.
//
// A Queue is safe for concurrent use.
package priority
