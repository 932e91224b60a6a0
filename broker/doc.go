// Package broker is qbroker's gRPC service (qbroker.v1.Queue, api/queue.proto)
// over queues whose only state is in ZooKeeper, and its coordination
// services (qbroker.v1.Election, qbroker.v1.Lock, qbroker.v1.Counter and
// qbroker.v1.Semaphore, api/coord.proto; see coord.go) over the election,
// lock, counter and semaphore recipes, and its barriers
// (qbroker.v1.Barrier and qbroker.v1.DoubleBarrier, coord_barrier.go) over
// syncqueue's. A Broker keeps no state of
// its own: any number of brokers can serve the same queues under the same
// root, and any broker settles what another delivered.
//
// # Layout
//
//	/<root>/queues/<name>                      metadata (JSON, "v":1): kind, sync members,
//	                                           visibility, max deliveries, dead letter, created;
//	                                           "deleting":true while DeleteQueue removes the queue
//	/<root>/queues/<name>/items/<segment>/qn-<k>-<tag>-NNNNNNNNNN  ready messages, in segments
//	                                           of Config.SegmentSize (zkqueue's node.go; pNNN-...
//	                                           for priority queues; <tag>, the publishing broker's
//	                                           while it consumes the queue, else none; ".<hex>"
//	                                           incarnation suffix after a redelivery)
//	/<root>/queues/<name>/leases/<item>~<hex>  at-least-once deliveries in flight
//	/<root>/queues/<name>/dead/<item>          dead letters
//	/<root>/queues/<name>/consumers/<id>~<hex> EPHEMERAL, one per open Consume stream
//	/<root>/queues/<name>/members/<member>     EPHEMERAL, sync queue members
//	/<root>/queues/<name>/start                sync queue opened
//	/<root>/brokers/<id>                       EPHEMERAL, live brokers
//	/<root>/election/n-NNNNNNNNNN              EPHEMERAL_SEQUENTIAL, leader election
//	/<root>/elections/<name>/n-NNNNNNNNNN      EPHEMERAL_SEQUENTIAL, Election service candidates
//	/<root>/locks/<name>/lock-<nonce>-NNNNNNNNNN  EPHEMERAL_SEQUENTIAL, Lock service contenders
//	                                           (<name> deleted by the leader once idle)
//	/<root>/counters/<name>/v-<epoch>-<nonce>  the Counter service's counters: the value
//	                                           (package counter), kept until deleted
//	/<root>/semaphores/<name>                  Semaphore service: data its limit; queue/wait-<nonce>-NNNNNNNNNN
//	                                           EPHEMERAL_SEQUENTIAL waiters, leases/lease-<n>-<nonce> EPHEMERAL
//	                                           leases (coord_semaphore.go; deleted by the leader once idle)
//	/<root>/barriers/<name>                    Barrier service: set while it exists
//	/<root>/doublebarriers/<name>/p@NNNNNNNNNN EPHEMERAL_SEQUENTIAL, DoubleBarrier participants;
//	                                           .../ready once count arrived (<name> deleted by
//	                                           the leader once idle)
//	/<root>/token-key                          random key signing ack tokens, created by
//	                                           the first broker, read by all
//
// A queue's node also holds delayed/, expired, dedup/ and groups/ (see
// zkqueue.Catalog). The broker builds no path itself: the root's layout is
// package internal/layout's, a queue's is zkqueue.Catalog's (Open returns
// its parts), and the broker makes ZooKeeper requests only through them
// and the recipes.
//
// # Parts
//
// The Broker serves the gRPC methods and owns the sessions; what it keeps
// is held by its parts, each a type of its own:
//
//	gate        calls.go     every call's way in: authentication and authorization,
//	                         streams and connections per client (limits.go), the
//	                         audit log (audit.go), open streams re-checked (authstreams.go)
//	membership  leader.go    the session's state (health, metrics), the leadership
//	handles     broker.go    the handles of the queues in use, their stats, consumer
//	                         registrations (consume.go), quotas (quota.go), claim-ahead
//	                         buffers (ahead.go)
//	claims      consume.go   claiming messages for Consume streams and Receive calls
//	consumer    consume.go   one Consume stream: credit, deliveries, settlements
//	acks        messages.go  settling deliveries by ack token
//	emitter     emit.go      events to the NATS bridge
//	schedulers  schedule.go  the queues' delayed moves and TTL expiry
//	activeGates active.go    single-active queues' lines of streams
//
// The coordination services are types of their own too (electionServer,
// lockServer, ...: coord_*.go).
//
// # Upkeep
//
// The elected leader runs zkqueue.Catalog.Maintain while it has a session
// (leader.go): every SweepInterval it releases expired leases, finishes
// abandoned deletions and deletes dedup buckets of past windows, visiting
// only the queues where something changed or a known deadline passed, so
// idle queues cost it no request; it also reaps idle locks and elections.
// Every broker runs the jobs of the queues it has open
// (zkqueue.Handles.Run: the delay mover and the TTL expiry timer) until
// the queue's handle goes stale or the broker shuts down (schedule.go), and
// keeps its consumer registrations through session expiry with one
// zkqueue.Registry (consume.go). A single-active queue's streams wait in
// line per broker, the broker campaigning for the queue in its active/
// election (active.go); stream priorities order a queue's streams on one
// broker (consume.go).
//
// # Dispatch
//
// A broker holds one zkqueue.Queue per queue, shared by all its local
// consumers: one sorted snapshot and one children watch, from which each
// consumer takes distinct candidates (no local races; no goroutine and no
// ZooKeeper traffic for an idle queue). Brokers with consumers on the same
// queue split it by sequence number modulo their count and take their own
// share first. Writes (claims, acks, releases, publishes) of concurrent
// callers share Multi transactions through one zkqueue.Committer per broker.
// The broker opens Config.ZKSessions sessions: the first for watches,
// scans and ephemeral nodes, the others split between group-commit writes
// and claims' reads (ZooKeeper answers a session's read only after its
// earlier writes commit).
//
// # Delivery
//
// At-most-once claims delete the message (getData + delete; without the
// read for messages this broker published, whose data it still holds: a
// message node never changes once created). At-least-once
// claims move it into a lease (one Multi); Ack deletes the lease; Nack,
// expiry (released by the elected leader every SweepInterval) or the end of
// the Consume stream put it back in its place; past max deliveries it moves
// to the dead letters. Leases are persistent nodes, independent of any
// broker's session. An ack token carries the lease's deadline, signed with
// the root's token key: an ack of a token whose signature verifies, before
// that deadline, deletes the lease without reading it; any other token is
// settled after reading the lease's real deadline. A delayed Nack settles
// the delivery too: the lease moves to a new name, so the token no longer
// names it.
//
// No answer is larger than MaxResponseBytes: Receive claims no message
// that would not fit (it stays in the queue, unclaimed), and list calls
// page. An at-least-once delivery is checked just before it is sent: one
// whose lease has less than a safety margin left, or claimed before the
// broker lost its ZooKeeper session, is given back unsent. A Consume
// stream claims about one stream window at a time, each batch once the
// previous was sent, and ends when a send held up by flow control would
// outlast its lease. Settlements sent on a Consume stream are applied
// concurrently, in no particular order; those sent before the client
// half-closed are all applied before the stream ends and releases its
// unsettled leases.
//
// A stream's goroutines end before its handler returns, except the two
// that wait in gRPC's Recv and Send (consume.go's receiver and outbox, which
// every streaming RPC reads and sends through), which gRPC ends right
// after the handler returns; the Broker's Shutdown waits for those as
// well.
//
// # Errors
//
// One function, toStatus, maps errors to gRPC codes: InvalidArgument,
// NotFound, AlreadyExists, FailedPrecondition, ResourceExhausted,
// Unavailable, Aborted, Canceled, DeadlineExceeded, PermissionDenied;
// anything else is Internal with a generic message, the details going to
// the log. It also says the engines' refusals (a message CheckDraft
// refuses, a sync member, a lock or election node of another identity)
// in the broker's words, naming the message, member or name, never a
// ZooKeeper path. A published message is checked once, by the engine's
// CheckDraft; the broker adds only the rules of its queue kinds.
//
// # Metrics
//
// Registered on Config.Registerer:
//
//	qbroker_messages_published_total{queue}        counter
//	qbroker_messages_duplicate_total{queue}        counter: repeats of a dedup id, not published
//	qbroker_messages_delivered_total{queue,mode}   counter (mode at_most_once|at_least_once)
//	qbroker_messages_acked_total{queue}            counter
//	qbroker_messages_nacked_total{queue}           counter
//	qbroker_messages_redelivered_total{queue}      counter: deliveries with count > 1
//	qbroker_messages_dead_lettered_total{queue}    counter
//	qbroker_claim_conflicts_total{queue}           counter: claims lost to another consumer
//	qbroker_bad_message_nodes_total{queue}         counter: message nodes whose data does not decode, never delivered
//	qbroker_messages_expired_total{queue}          counter: removed by the queue's message TTL
//	qbroker_deliveries_expired_unsent_total{queue} counter: at-least-once claims given back unsent
//	qbroker_message_queue_seconds{queue}           histogram: publish to delivery
//	qbroker_pack_messages{queue}                   histogram: messages per pack written (packed queues)
//	qbroker_zk_request_duration_seconds{op,result} histogram
//	qbroker_zk_commit_seconds{result}              histogram: a write through group commit, its wait included
//	qbroker_zk_session_state                       gauge: 1 with a session
//	qbroker_zk_reconnects_total                    counter
//	qbroker_zk_data_bytes                          gauge: ZooKeeper's data as the data budget counts it; -1 while unknown
//	qbroker_zk_data_budget_bytes                   gauge: the data budget (ZKDataBudget); 0 when none
//	qbroker_queue_depth{queue}                     gauge, refreshed every StatsInterval
//	qbroker_queue_in_flight{queue}                 gauge
//	qbroker_queue_dead{queue}                      gauge: dead letters
//	qbroker_queue_oldest_age_seconds{queue}        gauge
//	qbroker_consumers{queue}                       gauge: Consume streams on this broker
//	qbroker_leader                                 gauge: 1 on the sweeping leader (with a session)
//	qbroker_streams_refused_total{reason}          counter (max_streams|per_identity|no_subscribe)
//	qbroker_connections_refused_total{reason}      counter (max_conns|per_ip|per_identity|evicted_unproven|handshake_timeout)
//	qbroker_connections_open                       gauge: connections on LimitListener listeners
//	qbroker_lock_wait_seconds                      histogram: Lock request to grant
//	qbroker_locks_held                             gauge: locks held by this broker's Lock streams
//	qbroker_lock_revocations_total                 counter: Revoke calls that reached a holder
//	qbroker_election_leaders                       gauge: elections led by this broker's Campaign streams
//	qbroker_counter_operations_total{op}           counter: Counter calls answered OK (get, add, compare_and_set, set)
//	qbroker_counter_writes_total                   counter: counter writes in ZooKeeper (combined Adds: one)
//	qbroker_counter_conflicts_total                counter: counter writes and checks refused as stale, retried
//	qbroker_counter_rollovers_total                counter: counter writes that moved the value to a new node
//	qbroker_semaphore_wait_seconds                 histogram: semaphore Acquire request to grant
//	qbroker_semaphore_permits_held                 gauge: permits held by this broker's Acquire streams
//	qbroker_semaphore_revocations_total            counter: holders asked by semaphore Revoke calls
//	qbroker_barrier_waits                          gauge: Barrier Wait calls waiting on this broker
//	qbroker_double_barrier_participants            gauge: participants of this broker's DoubleBarrier Enter streams
//	qbroker_double_barrier_enter_wait_seconds      histogram: Enter request to ENTERED
//	qbroker_build_info{version}                    gauge: 1
//	grpc_server_*                                  go-grpc-middleware server metrics
//
// qbroker serve also registers the NATS event bridge's metrics, listed in
// internal/natsbridge, with or without a NATS server. docs/operations.md
// describes them all.
//
// A queue's counters appear at 0 when the broker first loads the queue,
// so rate and increase count its first event. The queue label takes at most Config.MaxQueueLabels distinct values;
// further queues share the label "_other".
//
// # Authentication and authorization
//
// With Config.Auth (NewAuth) every call but health checks must
// authenticate, by a client certificate the TLS handshake verified, a
// bearer token whose SHA-256 is in the tokens file or a JWT signed by a
// key of the JWKS file (JWTConfig, jwt.go), and is checked against
// the rules file (ParseRules): each method maps to an action on a queue,
// lock or election name (calls.go's methodAuths; a method missing there
// is denied). Streams are checked per request received, so a Consume
// stream's settlements need consume on their tokens' queues too, and again
// while open (authstreams.go): when one of the files is reloaded, and when
// the stream's JWT or certificate expires, a stream no longer allowed ends
// with Unauthenticated or PermissionDenied, naming why. Lock and Campaign
// record the caller's identity in their node; a call by key on another
// identity's node needs lock.admin or election.admin (coord.go); so for
// semaphore leases (semaphore.admin, which SetLimit needs too). Changes
// (queue creation, deletion, purge, redrive, JoinSync, Unlock, Revoke,
// Resign, Proclaim, a counter's Set, barrier Set and Remove) and refused calls are logged at info ("audit",
// audit.go) with the identity, with or without Auth.
//
// A Broker is safe for concurrent use.
package broker
