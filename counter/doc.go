// Package counter is a distributed 64-bit signed counter on Apache
// ZooKeeper: Add, CompareAndSet, Get and Set, linearizable, and safe past
// the 32-bit data version of ZooKeeper's nodes. It is shaped like
// Curator's DistributedAtomicLong and SharedCount. It is a library
// usable without the broker; it depends on go-zookeeper only.
//
// # Znode layout
//
//	<path>                        the counter (created with its parents by the first write);
//	                              its data version counts the value nodes made from nothing
//	<path>/v-<epoch>-<nonce>      the value node: the value in decimal; one at a time
//
// <epoch> is 20 decimal digits, 0 for the first value node and one more
// for each next; <nonce> is 16 random hex digits.
//
// # Algorithm (files)
//
//   - counter.go: every operation reads the value node (Get of its data
//     and version; the node's name is listed when unknown), decides from
//     the value, and makes its outcome hold on exactly that state: a
//     write is setData at the version read; an answer that writes nothing
//     (Get, a CompareAndSet that fails, an Add of 0) is confirmed by a
//     version check in a multi transaction. A refused write or check
//     (BadVersion, NoNode) means the counter changed: read again and
//     retry, with a random backoff after the second conflict in a row.
//     A Counter remembers the last state it saw and tries it first, so an
//     uncontended operation is one round trip.
//   - combine.go: concurrent Adds through one Counter are combined into
//     one write of their sum (each gets its own result), because writes
//     of one node are serial.
//   - node.go: the value node's name, data and the three kinds of write:
//     setData at the version read; the first value node, made in a multi
//     with a versioned setData of <path> (so of writers that saw no value
//     node only one makes one, and a writer that saw none long ago makes
//     none beside a later one); and rollover (below).
//
// # Guarantees
//
//   - Linearizable, reads too. Every operation takes effect at a
//     ZooKeeper transaction during the call, on the state it read: the
//     versioned write, or the version check. ZooKeeper's reads alone are
//     only sequentially consistent: a server may answer from a state
//     behind the leader's, and a Get or a failing CompareAndSet on it
//     would miss a write that completed before the call. The usual
//     remedy, sync() then getData on the same session, still leaves a
//     window at a change of leader (sync is not a quorum operation:
//     ZOOKEEPER-1675); the check is a quorum transaction, without that
//     window, at the cost of a write to the transaction log per Get.
//   - An operation that returns an error other than one wrapping
//     ErrUnknownOutcome changed nothing.
//   - Safe past the version's wrap. ZooKeeper's data version is an int32
//     that wraps from 2^31-1 to -2^31 and on to -1, which setData reads
//     as "any version": a conditional write of a node at version -1 is
//     unconditional, and a version read 2^32 writes ago matches again.
//     Curator's SharedCount broke at the wrap (CURATOR-688). Here a
//     value node never passes version maxVersion (2^30): the write that
//     finds it there moves the value to a node of the next epoch, in one
//     multi with the versioned delete of the old node (rollover). So a
//     version seen here is never near the wrap, and a (node name,
//     version) pair names one state in the counter's life: names are never
//     reused (the epoch grows, and the nonce differs for a counter
//     deleted and made again), and versions of one node only grow. A
//     write conditioned on a state therefore succeeds only on that very
//     state: no ABA, even for a Counter that tries a state it saw long
//     ago. A scheme that makes the same node again (delete and create at
//     version 0) would not be safe: a state remembered from before the
//     rollover could match a later one at the same version (the tests
//     stage it).
//
// # Exactly once
//
// An Add whose answer is lost (the connection drops while the write is on
// its way; or ctx ends then) returns an error wrapping ErrUnknownOutcome:
// it may or may not have been applied, and retrying it may add twice. To
// count exactly once, read the value v (Get), then CompareAndSet(v, v+d);
// when its outcome is unknown, Get again: the value still v means it was
// not applied (retry with the same v); anything else means this or
// another writer's change was, so start over from the new value. With
// several writers, give each a share of the counter it alone moves, or
// accept at most once (skip on doubt) instead of at least once.
//
// # Limits
//
//   - One node takes all the writes of a counter: ZooKeeper applies them
//     one after another, each a round trip from its writer (a few
//     milliseconds with a log on disk). Combining helps writers that share
//     a Counter; writers with a Counter each retry on conflicts.
//   - Deleting the counter's nodes while it is in use resets it to 0.
//
// Counter is safe for concurrent use. Its combiner goroutine runs only
// while Adds are queued and ends when none is.
package counter
