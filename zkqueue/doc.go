// Package zkqueue is qbroker's queue engine on Apache ZooKeeper: the seeds'
// DistributedQueue recipe, made production-grade, with everything the
// broker builds on. It is a library usable without the broker; it depends
// on go-zookeeper only. Packages priority and syncqueue are thin layers over
// it, and the broker (package broker) maps gRPC calls onto it.
//
// # Where each algorithm lives
//
//	options.go   Option, Limits: defaults and validation, in one place
//	queue.go     Queue: the public face; wires the parts below; checks drafts
//	             (Check, CheckDraft), publish, batch, take (at-most-once),
//	             dequeue; Catalog.Open: a queue's parts (Handles) at their
//	             nodes, Handles.Run: the delay mover and TTL expiry of a
//	             process; the connection: per-request latency for metrics
//	             (Observer) and group reads of concurrent claims, reading ahead
//	node.go      a message's node: names and their order (segments, layout,
//	             redelivery into a removed segment, messages), and the
//	             message and lease encodings
//	producer.go  the producer part: encoding, the tail segment, the version
//	             check, the roll; Budget: memory of messages published here,
//	             for read-free claims
//	commit.go    Committer: group commit of concurrent writes into one Multi
//	dispatch.go  the dispatcher part: snapshot, listing, share split, take
//	             loop, byte room; the chain: listing a queue by its heads,
//	             removing drained segments; claims: reading a candidate and
//	             deciding on it, at-most-once take
//	leases.go    Leases: at-least-once claim with lease (and fencing token), ack,
//	             nack (delay), extend, release, unclaim, dead letters, redrive
//	consumers.go ConsumerGroup: the processes consuming a queue, their rank
//	             (share); Registry: a process's registrations, kept through
//	             session expiry
//	inspect.go   the inspector part: Peek, Len (cheap on deep queues), Purge
//	browse.go    Browse: the ready messages from the head, paged, unclaimed
//	backoff.go   retry backoff part (Spec.Backoff): nacks without a delay and
//	             expiries held back for their step
//	release.go   releasing a lease (requeue, dead letter, drop), for Leases and LeaseSweeper
//	sweep.go     LeaseSweeper: releases expired leases, watch-driven
//	delay.go     Scheduled: delayed messages until due, and their mover (one
//	             watch, one timer per queue)
//	ttl.go       message TTL part: expiry at claim and by one timer per queue
//	fairness.go  fair dispatch by key (WithFairness): key tags in names, weighted
//	             round robin over a snapshot's keys
//	catalog.go   Catalog: named queues under one parent, and a queue's layout:
//	             create, two-step guarded delete, list, load with a watch;
//	             spec.go: a queue's stored Spec
//	maintain.go  Catalog.Maintain: one process's upkeep of all queues (expired
//	             leases, abandoned deletions, dedup buckets), watch-driven
//	dedup.go     idempotent publish part (WithDedup): dedup records in time
//	             buckets, created in the message's transaction; ExpireDedup
//	groups.go    message groups part (WithGroups): per-group order by sequential
//	             entries created with the message, one in flight per group
//	baddata.go   skipping message nodes whose data does not decode
//	pack.go      packed storage (WithPacking): many messages per node, the
//	             packer gathering publishes; packbuf.go: what a claim took
//	             beyond the take, for the next takes; packlease.go: a pack's
//	             lease, settlements coalesced per lease, partial put-back
//	active.go    single active consumer (Spec.SingleActive): the active/ election
//	             node, and Revoke, which ends the previous consumer's leases
//	errors.go    sentinel errors, all prefixed "zkqueue: "
//
// # Znode layout
//
//	<path>                                 the queue (created with its parents by New)
//	<path>/s0000000000000000007            segment 7: a parent of up to ~S messages
//	<path>/s0000000000000000007/qn-7-0000000042   one message: PERSISTENT_SEQUENTIAL,
//	                                       data = small header + payload
//	<path>/p003-s0000000000000000002/p003-2-0000000005   priority 3 (WithPriorities)
//	<path>/s0000000000000000007/qn-7-0000000042.1f2e3d4c a message put back after a lease ended
//	<path>/s0000000000000000007/qn-7-3fa0-0000000043     published by a consumer of the queue
//	                                       with publisher tag 3fa0 (WithPublisher)
//	<path>/s0000000000000000007/qn-7-n64-0000000044      a pack of 64 messages (WithPacking),
//	                                       ids qn-7-0000000044#1 .. #64 (pack.go)
//
// A queue is a chain of segments (one chain per priority level), each a
// parent node holding up to about S messages (WithSegmentSize, default
// 10,000). A segment node's name carries its number zero-padded to 19
// digits (string order is numeric order); a message's name carries its
// segment's number, so a message id names its segment. A segment node's
// version is its state: 0 while it is the tail (producers append to it),
// 1 once sealed.
//
// With WithDedup, a publish's dedup id is recorded as <dedup>/<bucket>/<id>
// (dedup.go), under a parent of the caller's choice.
//
// With WithGroups, a grouped message's entry <groups>/<g>/e-<token>-<seq>
// is created with it, and <groups>/<g>/inflight while one of the group is
// leased (groups.go).
//
// Leases and dead letters (NewLeases) live under two more parents of the
// caller's choice: <leases>/<item>~<16 hex> holds a claimed message with
// its deadline, <dead>/<item> a dead letter. The header of a message holds
// a format version, the delivery count and the publish time (node.go).
// Children whose names do not parse as messages or segments are skipped
// and logged once, never fatal; so are messages whose data lacks the
// header or does not decode (baddata.go): never delivered, reported once
// through WithBadDataHook, deleted by Purge.
//
// Every node (messages, segments, leases, dead letters) is created with
// the ACL of WithACL (CatalogConfig.ACL, ConsumerGroupConfig.ACL,
// RegistryConfig.ACL, SweeperConfig.ACL), open to anyone by default. With zk.DigestACL of the
// processes' identity only they can change the queue.
//
// # Producing: the roll
//
// A publish transaction (one Multi, group-committed with others by a
// Committer) is a version check of the tail segment at version 0 plus the
// message creates. The publish whose sequence number reaches S-1 rolls:
// one transaction seals the segment (setData at version 0) and creates its
// successor, whose name is computed from the segment's, so producers
// rolling at once create one successor (the others fail on the version).
// A publish whose check fails (the segment was sealed) moves to the
// successor and is retried there whole: a batch is never split across
// segments. So FIFO order is linearizable across a roll: a publish that
// returned committed before the seal, and any publish started after it
// commits later in the same segment or in a later one. A Committer whose
// combined Multi fails on such a check answers every transaction carrying
// that check at once and commits the others together (two Multis for a
// batch straddling a seal, not one per transaction).
//
// A segment holds at most S messages plus those of the publish
// transactions in flight when the seal committed (each at most
// MaxBatchCount messages), plus messages redelivered into it.
//
// # Consuming
//
// A consumer lists the queue's parent (the segments, a short list: one
// name per S messages), watched, then only the head segment of a level:
// it sorts the children by their sequence suffix (parsed as a signed
// integer, compared numerically, never as strings) and claims the head
// with getData + delete(version): whoever deletes the node owns the
// message. On NoNode another consumer won, so the next child of the same
// snapshot is tried; the head segment is listed again only when the
// snapshot is used up. A head that is sealed and empty is drained: it is
// deleted (ZooKeeper refuses to delete a node with children, so a message
// put back meanwhile is not lost) and its successor is the head. An empty
// tail means an empty level; the consumer waits on its watch. All
// goroutines of one process that share a Queue share one snapshot and
// take distinct children from it, so they never race each other. Dequeue
// and blocking takes wait on the watches (parent and head), never poll.
// Processes consuming one queue split each snapshot, a message published
// by one of them (its name carries the publisher's tag, WithPublisher) to
// that process, any other by sequence number (WithOwners, WithShare), and
// take their own share first.
//
// Claims read the messages this process does not remember from
// publishing them together: concurrent reads of a Queue share multiRead
// requests of up to 16 paths (group read, queue.go; ZooKeeper 3.6 or
// later and a client with multiRead, see The ZooKeeper client below; else
// one getData each), because ZooKeeper's cost is per request:
// a deep backlog, read back by a broker that did not publish it, drains at
// the rate ZooKeeper answers reads. The claims then delete (or lease) at
// the versions read, their writes sharing the group commit's transactions.
//
// A priority queue serves the most urgent levels whose heads hold
// messages (the heads of up to 8 non-empty levels merged into one sorted
// snapshot, up to 1,000 messages, so a take of several gets them across
// levels). It keeps a watch on the empty tails of the more urgent levels
// (listed once, then only when their watch fires), and drops its snapshot
// when any of the watches fires, so a more urgent message is the next one
// claimed once visible.
//
// A redelivered message (nack, lease expiry, release, redrive) goes back
// into its own segment under a new incarnation. If the segment was
// drained and removed, the same transaction re-creates it, sealed; it
// sorts before the tail, so it is consumed first. Consumers notice it by
// their watch on the parent; the Queue that put it back rescans at once.
//
// While a Queue is being consumed, it remembers the data of the messages
// it publishes (up to 4 MiB by default, WithMemory) until they are
// claimed: a message node never changes after its creation, so the claim
// of one of those is delete(version 0) without the read, the same claim
// one round trip shorter. A listing can show such a message before its
// publish has returned here (the watch and the create's answer come on
// different sessions): its claim waits for the publishes under way rather
// than reading it.
//
// Len lists the parent and reads the NumChildren of each level's head and
// tail; the counts of the sealed segments between them, which nobody
// consumes from or publishes into, are cached: one listing and two stats
// per level per call however deep the queue.
//
// # Upgrade from the single-parent layout
//
// Messages written before segments (<path>/qn-0000000042, no segment
// number) are consumed in place, not migrated: they form the legacy
// segment of their level, which sorts before every segment, and are
// delivered first, in their order. New messages always go into segments.
// Leases and dead letters of legacy messages are put back where they came
// from. A process of the single-parent layout neither sees segments nor
// writes into them: upgrade every process of a queue together.
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
// Each lease carries a fencing token (Lease.FencingToken, the lease node's
// creation zxid), greater than that of every earlier delivery of the same
// message, for sinks that refuse a stale consumer's write. With a
// Policy's Backoff, a nack without a delay and an expiry hold the message
// back for the schedule's step first (backoff.go).
//
// Order is FIFO by publish (sequence) order, by (priority, sequence) with
// WithPriorities: a producer's messages are delivered in the order it
// published them; concurrent consumers may of course finish handling them
// in any order. A message put back at the head is taken next by the Queue
// that put it back; other processes' Queues see it at their next listing
// (a FIFO snapshot is walked to its end first). Leases.TakeOrdered lets a
// caller keep several takes under way and still hand their messages out
// in queue order (each chooses its messages before the next begins).
//
// Message groups (WithGroups, groups.go) narrow that: the messages of one
// group are delivered in publish order and one at a time, across
// processes. A group is ordered by sequential entries created in its
// messages' publish transactions, not by a counter node that publishers
// would update with a version check: sequential creates never conflict,
// so publishers of one group do not retry against each other, and a
// group's state changes only in the transactions that move its messages
// (claim, ack, release), so no crash leaves a group blocked. Each
// process's share of a snapshot does not order a group by itself: a
// process may find a group's next message in its share while the one
// before it waits in another's; the entry order decides.
//
// # Limits
//
//   - Payload: 512 KiB by default (WithMaxPayload), below ZooKeeper's
//     jute.maxbuffer (1 MiB) with room for the header.
//   - Batch: 1,000 messages and 900 KiB by default, so one Multi stays under
//     jute.maxbuffer. Larger batches are rejected before anything is
//     written.
//   - Depth: no bound of the engine's. A listing holds one segment (at
//     most about S messages plus those in flight at its seal) or the
//     parent (one name per S messages), and each segment's sequence
//     counter serves S creates of its 2^31, so neither the listing packet
//     nor the counter bounds a queue's depth or lifetime; ZooKeeper's
//     memory (it holds every node in its heap) does.
//   - Segment size: WithSegmentSize, 2 to 50,000, default 10,000 (see
//     MaxSegmentSize and DefaultSegmentSize for the measurement). Every
//     process publishing to a queue should use the same size: a segment
//     is sealed by the first publish past its producer's size.
//   - Legacy layout: a queue's legacy messages are listed with the
//     parent, so their number is bounded as before (about 60,000).
//   - Dead letters are segmented like the items (dead.go): a message of
//     items segment k dies into dead segment k, so a dead segment holds at
//     most about S letters, and paging lists only the segments it reads.
//     The dead parent holds one name per dead segment. Leases are one
//     flat parent, bounded by the consumers' prefetch.
//
// # The ZooKeeper client
//
// The recipe packages (zkqueue, priority, syncqueue, lock, election and
// twophase) take the *zk.Conn of github.com/go-zookeeper/zk and build with
// its release (v1.0.4): `go get github.com/qbroker/qbroker`, then pass the
// connection your program already has. qbroker's own build uses a patched
// copy of that client (third_party/go-zookeeper: the release plus
// ZooKeeper's multiRead request and a data-race fix), put in place of the
// release by a replace in its go.mod; a replace applies only to the module
// that declares it, so your program gets the release unless it replaces
// go-zookeeper too. With the release everything works the same (order,
// delivery, leases), but a Queue's claims read each message they did not
// publish with a getData of its own; with the patched client they read in
// multiRead requests of up to 16 messages, and ZooKeeper's cost is per
// request (a getData costs the server 110-185 µs of CPU, a read within a
// multiRead of 8 paths 24 µs), so draining a backlog another process
// published costs the ensemble several times less. To have it, copy
// third_party/go-zookeeper from a qbroker checkout into your module and add
//
//	replace github.com/go-zookeeper/zk => ./third_party/go-zookeeper
//
// to your go.mod; no code changes, the Queue finds the method at run time.
// multiRead needs ZooKeeper 3.6 or later; on an older server a Queue falls
// back to a getData each by itself. examples/outside is such a program.
//
// # A process's upkeep
//
// A process serving many queues opens each through its Catalog (Open),
// which knows where every part lives, and runs two kinds of jobs: per
// open queue, Handles.Run (the delay mover and the TTL expiry timer; any
// number of processes may run them for one queue), and, in one process
// at a time (the brokers' leader), Catalog.Maintain (expired leases of
// every queue, abandoned deletions, dedup buckets of past windows), which
// makes no request while nothing changes. One Registry per process keeps
// its consumer registrations through session expiry.
//
// A Queue, Leases, a Committer, a ConsumerGroup, a Registry, Handles and a
// Catalog are safe for concurrent use.
package zkqueue
