// Command loadtest measures qbroker end to end, through its Go client
// (clients/go) only, and checks every message on the way.
//
//	make loadtest                                   # = bin/loadtest --spawn-brokers 1
//	bin/loadtest --spawn-brokers 2 --producers 8 --consumers 64 --duration 20s --json r.json --html r.html
//	bin/loadtest --broker 127.0.0.1:7070 --metrics 127.0.0.1:9090 --zk 127.0.0.1:2181
//
// # Topology
//
// With --spawn-brokers N it starts its own ZooKeeper (internal/zkserver)
// and N `qbroker serve` processes (built with go build from this tree, or
// --qbroker-bin), each on free 127.0.0.1 ports with --metrics-listen set,
// in their own process groups with a parent-death signal: they are all
// stopped at the end, on Ctrl-C, and when the load test is killed. Or it
// targets running brokers (--broker, with --metrics for their /metrics
// and --zk for the baselines). Every address must be a loopback address.
//
// # Workload
//
// --producers goroutines publish (--batch messages per call) to a new
// queue (--kind fifo or priority, with --priority-mix), in closed loop or
// at an open-loop --rate, for --duration or --messages; --consumers
// consume it over Consume streams (--mode, --prefetch), nacking the first
// delivery of a --nack-rate fraction at least once. Producers and
// consumers are spread round-robin over the brokers and over
// --conns-per-broker client connections (0: one each). Consumers stay
// until every published message is delivered (acked), bounded by
// --drain-timeout; the queue is deleted at the end. --timeout bounds
// everything.
//
// --rate-of-raw F runs the raw baseline first and then the open loop at F
// times its throughput, so "latency at half the ceiling" is one command
// (--rate-of-raw 0.5). --warmup D runs the same workload for D before the
// measured run, checked like it but left out of the report (and, with
// --rate-of-raw, the raw baseline for D before measuring it): a fresh
// ZooKeeper JVM is still compiling its hot paths for the first seconds,
// so with a spawned ZooKeeper the warmup goes on, in runs of 5 s, until
// its JIT compilers used under 0.05 cores in the last one (at most
// --warmup-max more; warm.go). With --backlog, each warm run also takes
// the measured run's readings of ZooKeeper and starts its cold broker,
// whose first run makes ZooKeeper compile anew.
//
// --backlog N publishes N messages before any consumer starts, then starts
// the consumers and measures how fast they drain the queue: the delivered
// (acked) rate is over the drain alone, and end-to-end latency includes
// the time a message waited in the backlog.
// With spawned brokers it also starts one more broker process once the
// backlog is published and times its first delivery (a message received
// at least once and nacked back), and reads the brokers' peak RSS (VmHWM)
// at the end of the drain. --compare-shallow then runs the same N messages
// with the consumers subscribed first; the report shows the deep and the
// shallow publish and consume rates side by side (deep.go).
//
// --tenants N publishes for N tenants (a "tenant" header; producer i for
// tenant i mod N), tenant t0 at --noisy-factor times each other's rate,
// sharing the open-loop --rate; --fair creates the queue with fair
// dispatch by that header, and --work makes each consumer spend that long
// on a message, so a rate above the consumers' capacity builds a backlog.
// The report gives each tenant's time in queue (tenants.go).
//
// --single-active creates the queue with single active consumer (one
// Consume stream at a time across brokers; --confirm-acks, which uses
// Receive, is refused with it). The checker records, per consumer
// stream, the intervals it held a delivery: from taking it off the stream
// to the return of its ack or nack, or to the end of the stream when the
// settlement failed. Two streams' intervals overlapping fail the run
// (overlaps, 0 expected); the report also gives how many streams held
// deliveries, the handovers between them and the longest takeover (the
// gap from the last interval of one stream to the first of the next)
// (active.go). --kill-active-after D (spawned brokers, at least 2) kills
// the broker serving the active stream with SIGKILL D into the
// publishing (the broker whose delivered counter grows, kill.go); the
// run goes on through the others, the report names the killed broker,
// and the longest takeover is the failover's time: the session timeout,
// since the next active stream's broker revokes the dead one's leases.
//
// --packed creates the queue with packed storage (a publish's batch, and
// the publishes one group commit gathers, in one ZooKeeper node); the
// report's ZooKeeper cost per message (zkcost.go), given for every run,
// shows what it saves.
//
// --probe times, while the producers publish, the two hops of a publish
// each alone: a round trip to a broker (a ping: gRPC health check) and a
// bare ZooKeeper create on a session of its own, one of each every 2 ms
// (probe.go). Beside the publish call latency it tells what the machine
// as loaded makes any publish cost and what the broker adds.
//
// A payload carries its producer, sequence number and send time (in open
// loop the time it was due, so end-to-end latency includes any publishing
// backlog) and a filler derived from them up to --payload bytes.
//
// # Checks
//
// The run fails (exit status 1, reasons on stderr) when a message whose
// publish succeeded is never delivered (at-most-once) or acked
// (at-least-once), when one is delivered twice at-most-once or acked
// twice or delivered after its ack at-least-once, when a delivered id
// differs from the published one or a payload is corrupt, or when the
// queue is not empty afterwards. A publish that failed with Unavailable,
// DeadlineExceeded, Canceled, Internal or Unknown (or without a status)
// may or may not have been applied: its messages are "uncertain", never
// counted lost. A publish the broker refused (ResourceExhausted from a full
// queue, InvalidArgument, NotFound, FailedPrecondition, AlreadyExists) is
// certainly not applied: its messages are counted as "refused", and one
// of them delivered is a failure.
//
// Order: each consumer must see each producer's messages in increasing
// sequence (per priority on priority queues). Redeliveries are not
// compared (a nacked or released message comes back behind newer ones),
// and a queue with several consumers promises no global order; with
// several brokers, or a claim racing a re-scan of the head, a consumer's
// own view may invert: --order report counts violations as warnings
// without failing the run, --order strict fails it; the default is
// strict with one broker and report with several.
//
// # Baselines
//
// On the same ZooKeeper with the same payload (--baselines, default
// raw,naive when the ZooKeeper is known), each bounded by
// --baseline-duration, after the workload:
//
//   - raw: create+delete pairs of sequential nodes, --raw-sessions
//     sessions × --raw-goroutines goroutines, no contention: the ceiling
//     of any ZooKeeper queue;
//   - naive: the seeds' recipe: --consumers consumers, each with its own
//     session, listing the children, sorting them and racing for the head
//     with getData+delete, moving on to the next child when the node is
//     gone and listing again when the list is used up, on a queue
//     prefilled with --naive-prefill messages;
//   - create (only when asked for): --producers goroutines, each with its
//     own session, creating one sequential node per call in closed loop:
//     the latency floor of a durable publish of one message, printed
//     beside qbroker's publish call latency;
//   - jetstream, jetstream-sync (only when asked for): the workload itself
//     (producers, batch, consumers, prefetch, mode, backlog) on a NATS
//     JetStream work queue with file storage, run as its users run it: a
//     nats-server process (built with go build from the version go.mod
//     requires, or --nats-server-bin) started on a free loopback port and
//     storing in a temporary directory on the same disk, with JetStream's
//     default durability (files synced every 2 minutes) or with
//     `sync_interval: always` (every write fsynced, as ZooKeeper does every
//     commit). Every producer and every consumer has its own connection;
//     consumers share a durable pull consumer with explicit acks and the
//     default MaxAckPending (consumers × prefetch when that is more) and
//     Fetch --prefetch messages at a time. At least once each runs twice,
//     on a fresh server: with plain Ack (not waited for) and with
//     DoubleAck (each waited for; the result is named <baseline>-doubleack).
//     A run ends when every message is acked and the stream is empty, so
//     every ack is applied; the server's CPU per message over that span is
//     reported beside its rate.
//
// qbroker's delivered/s is reported as a ratio of each. Its acks travel on
// the Consume stream and are not confirmed; --confirm-acks makes consumers
// take messages with Receive (up to --prefetch, at most 100, a call) and
// ack each with the Ack call, which returns once the ack is committed:
// the counterpart of DoubleAck. ZooKeeper syncs its log to disk before it
// applies each transaction, JetStream's default only every 2 minutes:
// --zk-no-sync runs the spawned ZooKeeper with forceSync=no, the same
// durability as that default, to compare like with like.
//
// # Report
//
// A summary on stdout; a progress line on stderr every second (--quiet
// turns it off); --json FILE with the configuration, throughput
// (published/s, delivered/s: distinct messages delivered, or acked at
// least once), latency percentiles (p50, p90, p99, p99.9, max, plus CDF
// and histogram points) of publish calls and of send-to-first-delivery,
// lost claims per delivered message (qbroker_claim_conflicts_total over
// qbroker_messages_delivered_total of the queue, scraped from every
// broker before and after), errors by gRPC code and by call, the
// baselines and ratios, CPU seconds per 1,000 messages of the brokers, of
// ZooKeeper and of the load test itself (spawned topologies only, from
// /proc/<pid>/stat; with --backlog also over the drain alone), ZooKeeper's
// transactions over the run per message delivered and how long a leader's
// zxid counter (2^32 transactions, then an election) lasts at their rate
// (from the zxid srvr reports before and after; when ZooKeeper is known
// and answers srvr), what a message cost ZooKeeper (zk cost: its
// transactions and the brokers' ZooKeeper requests per message delivered
// over the run; with --backlog, per message published over the backlog's
// publishing, with the znodes, data bytes (mntr's zk_znode_count and
// zk_approximate_data_size) and, on a spawned ZooKeeper with jcmd on the
// PATH, live heap bytes (its old generation after a full collection) the
// backlog added, and the mean messages per znode), and a per-second timeline; --html FILE with the same as one self-contained
// page of SVG charts (throughput over time, latency histograms and CDF,
// baseline comparison).
package main
