// Package faults is qbroker's fault and abuse suite: real brokers under
// load, hit by the failures a production deployment meets, with every
// message's history checked afterwards.
//
// # Running it
//
//	make faults                               # full run: 3-10 minutes on 2 cores
//	go test ./faults -args -faults.full -faults.out results.md   # the same
//	go test ./faults                          # short run (part of make test)
//	go test ./faults -run TestPauseBroker -v -args -faults.full  # one scenario
//
// The suite needs ZooKeeper installed (make deps); without it the
// scenarios skip, or fail when CI is set. It builds cmd/qbroker once into
// a temporary directory, starts a 3-member ZooKeeper ensemble on loopback
// ports, and runs each scenario's brokers as separate `qbroker serve`
// processes under their own root, with a 3s session timeout, a 500ms
// sweep interval, a 3s visibility timeout and the default publish limits
// given explicitly (512 KiB payloads, batches of 1,000 messages or 900
// KiB). Each broker reaches each
// ensemble member through its own loopback proxy (internal/zktest.Proxy),
// so a partition can cut one broker off. Clients are the Go client
// (clients/go) and, where a test must speak below it, raw gRPC or HTTP/2.
// Everything is bounded in count and time and stops by itself; when a
// test fails, the broker and ZooKeeper logs are kept and their directory
// printed.
//
// At the end the suite prints a table (scenario, delivery mode,
// acknowledged and uncertain publishes, messages delivered and
// redelivered, lost, in doubt, duplicates, uncounted redeliveries, time
// to recover after the fault and after the heal, verdict), followed by
// the problems of the rows that failed and the clients' failed calls;
// -faults.out writes the same to a file (make faults: faults/results.md).
//
// # Scenarios
//
// Each scenario runs one queue per delivery mode, fed by producers that
// publish numbered messages (the number travels in the payload) through
// every broker (some scenarios add packed queues, QueueOptions.Packed,
// whose producers publish batches of up to 10, so that many messages
// share a node; their rows say "(packed)"), and drained by Consume stream consumers pinned to chosen
// brokers and by Receive consumers spread over all of them. At least
// once, stream consumers ack on the stream and Receive consumers with the
// Ack call, whose outcome is recorded. After the faults the producers
// stop, the queues must drain (every acknowledged publish delivered,
// nothing ready or leased), Stats must count one consumer per open
// stream and none once they close, and every running broker must be
// registered under a live session.
//
//   - kill-broker (both modes, and both packed; short and full): a broker
//     is SIGKILLed mid-load and restarted at once, within its old
//     session's timeout (three times in the full run). At most once, the
//     stream consumers sit on the other brokers. The packed queues have a
//     stream on every broker, and the kill comes while packs are half
//     delivered: bursts of 100 (one pack each) are published until the
//     victim's stream of each packed queue receives a message of one; it
//     holds it, the rest of its prefetch waits in its client and the rest
//     of the pack in the victim's pack buffer. At least once, every
//     message of that pack the stream had not received comes back,
//     counted (a delivery count above 1); at most once, the loss may be no
//     larger than what the victim had claimed (its stream's prefetch and
//     one pack: Checker.MayLose), and nothing is delivered twice.
//   - pause-broker (at least once, and packed; short and full): a
//     broker is SIGSTOPped 5 to 100ms after a burst published through it
//     (so its claims are in flight), past its session timeout and the
//     visibility timeout, then SIGCONTed (four times in the full run,
//     once in the short one). No stale copy of a message whose lease
//     expired meanwhile may reach a consumer. The packed queue has a
//     stream on every broker, and the victim holds a pack when it stops:
//     its stream a message of a 100-message pack, its pack buffer the
//     rest, and a Receive through it 5 messages unsettled (of that pack,
//     or after an earlier cycle's session expiry of another it claimed:
//     a stream that outlives its broker's session keeps the queue handle
//     it opened with, pack buffer included). Every message of the
//     pack its consumers had not received must come back, counted,
//     through the other brokers before the victim is continued; then a
//     Receive through it must get no stale copy from its buffer, and the
//     5 held messages' late acks must be refused (FailedPrecondition).
//   - slow-reader (at least once; full): no fault; a raw Consume stream
//     (prefetch 32) with a 64 KiB window stops reading while the broker's
//     sends of 60 KiB messages wait on flow control, longer than the 1s
//     visibility timeout, while another consumer reads. When it reads on
//     it drops deliveries past their lease deadline (what docs/design.md asks
//     of clients other than the Go client); only those in transit when it
//     stopped (at most 4) may arrive that late.
//   - zk-leader-kill (both modes, and a packed queue at least once;
//     full): the ensemble's leader is SIGKILLed and restarted, twice. The
//     packed queue's receivers on one broker ack all the messages of each
//     Receive at once, so acks of one pack lease are coalesced into one
//     write, and each kill waits until at least 8 of them are in flight.
//   - pack-nack (packed, at least once; short and full): no fault; packs
//     of 20, each received whole, the middle message nacked at the same
//     moment as its 19 neighbours are acked (10 packs, 40 in the full
//     run). The nacked message must come back once, with count 2, through
//     either broker; each neighbour is delivered once, never again.
//   - pack-expiry (packed, at least once; short and full): a consumer
//     acks every other message of a pack of 20 and holds the rest past
//     the visibility timeout: only those come back, counted, through the
//     other broker, and late acks of the held copies are refused. In
//     alternate cycles a Receive takes 5 of the pack (the other 15 wait in
//     its broker's pack buffer), acks 2 and holds 3, and its broker is
//     SIGSTOPped at once past its session timeout and the visibility
//     timeout: the 18 come back counted through the other broker, and the
//     continued broker must not hand out the stale copies its buffer held
//     (2 cycles, 6 in the full run).
//   - quorum-loss (both modes, and both packed; full): two of the three
//     members are SIGKILLed for twice the brokers' session timeout, then
//     restarted. As in zk-leader-kill, the packed queue's receivers on one
//     broker ack each Receive's messages at once and the loss waits until
//     at least 8 acks are in flight; another broker's stream holds a
//     message of a 100-message pack, the rest in its pack buffer, whose
//     lease runs out during the outage: that broker keeps its session, so
//     the rest comes back either given back unchanged (never delivered)
//     or swept back counted, and a Receive through it after the outage
//     must get no stale copy. At most once, Receive consumers only: an
//     uncertain Receive of the packed queue may have lost its claim's
//     packs (Checker.PackReceiveFailed).
//   - partition (both modes, and both packed; full): one broker's
//     proxies stop forwarding without closing anything (packets just
//     stop), past its session timeout and the visibility timeout, then
//     resume; twice. The packed queues have a stream on every broker and
//     the cut comes while the victim holds a pack of each, as in
//     pause-broker. At least once, the pack's lease runs out and is swept
//     back while the victim is cut off: the rest of the pack comes back
//     counted before the heal, a Receive through the healed broker gets
//     no stale copy, and the late acks of the 5 messages a Receive held
//     are refused. At most once, the victim's buffer is out of
//     ZooKeeper: what it hands out from there while cut off is delivered
//     once, and the loss may be no larger than what it had claimed (its
//     stream's prefetch and one pack: Checker.MayLose).
//   - abuse (at least once; short and full): one broker with a
//     descriptor limit of 1024 and a 5s sweep interval, a legitimate
//     producer and consumers running throughout, and: bad queue names and
//     member ids on every call (InvalidArgument, nothing written to
//     ZooKeeper); edited ack tokens (refused, the genuine lease intact);
//     a token whose deadline hint was moved ahead, used after its lease
//     expired (refused, the message redelivered); oversized payloads and
//     batches (a clear status, nothing stored); garbage on the gRPC port
//     (the broker closes the connection). Full run only: a Receive of 20
//     messages of 480 KiB by a client with default limits (nothing lost);
//     11,000 Consume streams that never subscribe, and 1,100 connections
//     that never send a byte, each held while a new client must get a
//     message through within 60s. After every check the broker must still
//     run.
//
// # The checker
//
// Checker (checker.go) keeps each queue's history: every publish with
// its outcome (acknowledged; refused, which certainly changed nothing;
// or failed with an uncertain outcome: Unavailable, DeadlineExceeded,
// Canceled, Internal, ..., which may have been applied), every delivery
// (key, id, delivery count, lease deadline, arrival time, consumer),
// every confirmed ack, every failed receive, and the moments faults were
// injected and healed. Its verdict:
//
//   - lost: an acknowledged publish never delivered. At most once, a
//     Receive that failed with an uncertain outcome may have claimed
//     (deleted) up to its maximum of messages that never reached the
//     consumer, as the delivery contract allows; of a packed queue, the
//     claim it waited for may have deleted whole packs, up to a claim's
//     worth (1,000 messages and a pack) of messages published before it
//     failed; a killed or cut-off broker may lose what it had claimed
//     (its stream's prefetch and a pack); losses up to that total are
//     reported "in doubt" instead. Uncertain publishes are never lost,
//     whether or not they were applied;
//   - duplicates (at most once): any second delivery;
//   - uncounted redeliveries (at least once): a delivery whose count is
//     not above every count delivered before it (the same count twice, or
//     a stale copy after a newer one), a delivery after a confirmed ack,
//     or a delivery that arrives more than StaleTolerance past its own
//     lease deadline;
//   - phantoms: deliveries of refused or never-published messages, and
//     corrupt payloads;
//   - time to recover: from a fault (or heal) to the first delivery of a
//     message whose publish started after it.
//
// A scenario passes when nothing is lost, duplicated, uncounted or
// phantom and every end-of-scenario check held. Waits are conditions
// polled against generous deadlines; only the length of a fault is a
// fixed time.
package faults
