// Package twophase is two-phase commit on Apache ZooKeeper: the seeds'
// recipe (a coordinator creates a transaction node with one child per
// participant; each participant votes by writing its node and watches the
// others), with a decision made exactly once, a deadline that any
// participant can enforce, and no single point of failure after the
// transaction is created. It is a library usable without the broker; it
// depends on go-zookeeper only.
//
// # Znode layout
//
//	<tx>             the transaction: JSON {participants, deadline_unix_ms}
//	<tx>/p-<name>    one per participant: empty until it votes, then
//	                 "commit", "abort", or "timeout" (written by the decider
//	                 when the deadline passed without a vote)
//	<tx>/decision    the outcome: JSON {committed, reason, by}
//
// Begin creates <tx> and every participant's node in one Multi; the
// decision node does not exist until the transaction is decided.
//
// # Protocol
//
// Each participant Joins (a Tx of its own session), does its prepare work
// (whatever makes it able to commit later), and votes: a write of its node
// at version 0, so a vote is cast once and never changes. Every Tx, the
// coordinator's included, decides as soon as it can, by creating the
// decision node in one Multi with the conditions the decision rests on:
//
//   - an abort vote: the voter creates the decision with its vote, in the
//     same Multi;
//   - every vote commit: create the decision "commit", checking that every
//     vote node is still at version 1 (cast);
//   - the deadline passed with votes missing: create the decision "abort",
//     writing "timeout" into each missing vote node at version 0. If a
//     vote arrived meanwhile that write fails, the whole Multi with it, and
//     the Tx reads the votes again (it may now commit). A participant
//     whose vote comes later finds its node written: Vote returns ErrLate.
//   - anyone may Abort before the decision (as a coordinator may in any
//     two-phase commit).
//
// The decision node can be created once: of two deciders racing (the last
// voter's Tx and a Tx at the deadline, or many Txs seeing the last vote),
// one Multi succeeds and the others fail with NodeExists and read the
// node. Everyone reads the same decision from then on.
//
// A Tx waits on watches only, no polling: one on the decision node while
// it does not exist, one on the first participant node still empty, and a
// timer to the deadline. Each vote wakes the Txs watching that node, which
// read the votes not yet seen.
//
// # Guarantees
//
//   - Agreement: the outcome is decided at most once, and every reader
//     (Wait, Done, Outcome) sees that one decision.
//   - Validity: commit only when every participant voted commit; one
//     abort vote, an Abort, or a vote missing at the deadline aborts.
//   - Termination without the coordinator: after Begin, every participant
//     decides too, so the coordinator's death changes nothing, before or
//     after the decision. A participant that never votes (crashed, cut
//     off) is voted "timeout" by the first Tx to pass the deadline, any
//     participant's or the coordinator's. The transaction stays undecided
//     past its deadline only while no Tx of it runs.
//   - Durability: the decision is a persistent node. A participant that
//     crashed after voting commit learns the outcome on restart with
//     Outcome (or Join and Wait): it must not guess.
//
// What it does not guarantee. It is a coordination record, not a
// distributed database transaction: nothing here applies, locks or rolls
// back the participants' work. A participant prepares before voting
// commit, keeps what it prepared until the decision, then applies (on
// commit) or discards (on abort) its part itself; a crash in between is
// its to recover, by reading the outcome. Applying is not atomic across
// participants: some may have applied a commit while others have not yet
// learned it. The deadline is compared with each Tx's local clock: clock
// skew moves the moment a transaction times out (a fast clock aborts
// early), never the agreement. A participant that voted commit is blocked
// (keeps its prepared state) until some Tx decides; with no Tx running,
// nothing decides.
//
// # Cleanup
//
// Nothing deletes a transaction by itself: a participant that crashed
// after voting needs the decision on restart, and only the application
// knows when every participant has applied it. Delete removes a decided
// transaction's tree (it refuses an undecided one). The coordinator calls
// it once every participant confirmed (out of band) that it applied the
// outcome, or a periodic sweep calls it for transactions decided longer
// ago than any participant may stay down. After Delete, Outcome returns
// ErrNoTransaction: deleting early loses the outcome for a participant
// that has not read it. Never reuse a transaction's path (Begin refuses
// one that exists): use a unique name per transaction.
//
// # Limits
//
//   - At most MaxParticipants (256) participants, named as CheckName
//     allows: [A-Za-z0-9._-]{1,200}, not "." or "..".
//   - Each wake-up reads the vote nodes not yet seen cast, so a
//     transaction costs O(participants²) reads in all: keep it small.
//
// A Tx is safe for concurrent use. Its goroutine ends once the decision
// is known, or at Close; close a Tx before its connection.
package twophase
