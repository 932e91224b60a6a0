// Package zkqueue is qbroker's queue engine on Apache ZooKeeper: the seeds'
// DistributedQueue recipe, made production-grade, with everything the
// broker builds on. It is a library usable without the broker; it depends
// on go-zookeeper only. Packages priority and syncqueue are thin layers over
// it, and the broker (package broker) maps gRPC calls onto it.
//
// # Where each algorithm lives
//
//	options.go   Option, Limits: defaults and validation, in one place
//	queue.go     Queue: publish, batch, take (at-most-once), dequeue, peek, len, purge
//	dispatch.go  the head algorithm: snapshot, listing, share split, take loop, byte room
//	leases.go    Leases: at-least-once claim with lease, ack, nack (delay), extend,
//	             release, unclaim, dead letters, redrive
//	sweep.go     LeaseSweeper: releases expired leases, watch-driven
//	commit.go    Committer: group commit of concurrent writes into one Multi
//	consumers.go ConsumerGroup: the processes consuming a queue, their rank (share)
//	catalog.go   Catalog: named queues under one parent: create, two-step guarded
//	             delete, list, load with a watch; spec.go: a queue's stored Spec
//	names.go     node names and their order; codec.go: message and lease encodings
//	budget.go    Budget: memory of messages published here, for read-free claims
//	baddata.go   skipping message nodes whose data does not decode
//	observe.go   Observer: per-request latency for metrics
//	errors.go    sentinel errors, all prefixed "zkqueue: "
//
// # Znode layout
//
//	<path>                      the queue (created with its parents by New)
//	<path>/qn-0000000000        one message: PERSISTENT_SEQUENTIAL,
//	<path>/qn-0000000001        data = small header + payload
//	<path>/p007-0000000002      a message of priority 7 (WithPriorities)
//	<path>/qn-0000000000.1f2e3d4c  a message put back after a lease ended
//
// Leases and dead letters (NewLeases) live under two more parents of the
// caller's choice: <leases>/<item>~<16 hex> holds a claimed message with
// its deadline, <dead>/<item> a dead letter. The header of a message holds
// a format version, the delivery count and the publish time (codec.go).
// Children whose names do not parse as messages are skipped and logged
// once, never fatal; so are messages whose data lacks the header or does
// not decode (baddata.go): never delivered, reported once through
// WithBadDataHook, deleted by Purge.
//
// Every node is created with the ACL of WithACL (CatalogConfig.ACL,
// ConsumerGroupConfig.ACL, SweeperConfig.ACL), open to anyone by default.
// With zk.DigestACL of the processes' identity only they can change the
// queue.
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
// race each other. Dequeue and blocking takes wait on a children watch,
// never poll. Processes consuming one queue split each snapshot by
// sequence number (WithShare) and take their own share first.
//
// While a Queue is being consumed, it remembers the data of the messages
// it publishes (up to 4 MiB by default, WithMemory) until they are
// claimed: a message node never changes after its creation, so the claim
// of one of those is delete(version 0) without the read, the same claim
// one round trip shorter.
//
// # Guarantees
//
// Queue.Take and Dequeue deliver at most once: a message is never
// delivered twice. A consumer that dies after its claim (or whose delete
// succeeds while the connection drops before the answer) loses that
// message. Leases.Take delivers at least once: the claim moves the message
// into a lease (one Multi); until it is acked, a nack, an expiry (released
// by a LeaseSweeper) or a release puts it back at its place in the queue,
// under its original sequence number. A lease is a persistent node, so a
// consumer's crash delays its redelivery until the deadline, never loses it.
//
// Order is FIFO by publish (sequence) order, by (priority, sequence) with
// WithPriorities: a producer's messages are delivered in the order it
// published them; concurrent consumers may of course finish handling them
// in any order. A message put back at the head is taken next by the Queue
// that put it back; other processes' Queues see it at their next listing
// (a FIFO snapshot is walked to its end first).
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
// A Queue, Leases, a Committer, a ConsumerGroup and a Catalog are safe for
// concurrent use.
package zkqueue
