// Package syncqueue is seed 001's synchronizing queue on Apache ZooKeeper:
// a FIFO queue that opens to consumers only once all N members of a group
// have arrived. It also holds the seed's two barrier recipes, Barrier and
// DoubleBarrier. It is a library usable without the broker; it depends on
// go-zookeeper only.
//
// # Znode layout
//
//	<path>                        the queue (created with its parents by New)
//	<path>/members/<memberID>     one member: EPHEMERAL, on the joiner's session
//	<path>/start                  PERSISTENT: the queue is open; its data
//	                              names the group ("qbroker-sync 1" + ids)
//	<path>/items/s0000000000000000001/qn-1-0000000000  the messages, in segments,
//	                              exactly as in package zkqueue
//
// # Joining
//
// A member joins by creating its ephemeral node, then lists the members:
// if the group size N is reached, it creates start. ZooKeeper orders all
// writes, so the joiner whose node completes the group always lists at
// least N members: some joiner creates start, and creating an existing
// start is harmless. If more than N are present (joiners racing for the
// last place), start names the N earliest by creation zxid; a member not
// named in start is out: its node is removed and it gets ErrGroupFull.
// Every other member waits with an exists watch on start, never polling and
// never watching the members list (no herd).
//
//   - Join blocks until the group opens; JoinAsync returns once the member
//     node exists, with a Membership whose Opened/Done channels, Wait and
//     Progress ("joined k of N", then open) follow the group. A Membership
//     owns one goroutine, which ends when the group opens or fails, and on
//     Leave.
//   - A queue that is open admits nobody: Join returns ErrGroupFull without
//     writing. A member id already present returns ErrDuplicateMember
//     (also while a crashed member's session has not expired yet).
//   - A member that leaves before the group is complete (Leave, a
//     cancelled Join, or the end of its session, which deletes its
//     ephemeral node) frees its place: the count is the number of member
//     nodes present.
//   - Members that leave after the queue opened do not close it: it stays
//     open until Reset (or until the queue is deleted). After Reset, members
//     still present count towards the next opening.
//   - Open forces the queue open with whoever is present; IsOpen and Joined
//     read the current state.
//
// # Consuming
//
// Publishing is allowed at any time. Before start exists, TryDequeue fails
// with ErrNotOpen and Dequeue waits on an exists watch on start; once open,
// both behave as zkqueue's: FIFO by publish order, at-most-once, claims by
// getData + delete(version), one shared snapshot per Queue. A Dequeue that
// is waiting for a message when the queue is reset goes back to waiting for
// it to open. The open state is cached per Queue and refreshed by one
// shared exists watch, so a consumer learns of Reset or opening as soon as
// its session receives the notification (milliseconds); a claim that races
// with Reset may still succeed.
//
// # Cancellation and failure
//
// Every wait takes a context. A cancelled Join or JoinAsync removes the
// caller's member node; a cancelled DoubleBarrier Enter or Leave removes
// the participant node, and so does DoubleBarrier.Close. A double
// barrier's ready node records the highest participant sequence its round
// counted, so a ready left by a round whose last participant did not Leave
// is known for stale and lets nobody in; DoubleBarrierReaper deletes idle
// double barriers. Nodes are removed only if they are still the
// caller's (same creation zxid), never a later session's node of the same
// id. A lost session ends waits with its error (zk.ErrSessionExpired or
// zk.ErrClosing).
//
// # Limits
//
//   - Group size: 1 to MaxMembers (1,000). Member and participant ids:
//     [A-Za-z0-9._-]{1,200}, not "." or "..".
//   - Payloads and batches as in zkqueue: 512 KiB per payload, 1,000
//     messages and 900 KiB per batch by default, checked before writing.
//   - The items are segmented as in zkqueue: neither a listing packet nor a
//     sequence counter bounds the backlog or the queue's lifetime.
//
// Queue, Membership and Barrier are safe for concurrent use; a
// DoubleBarrier is one participant, used by one goroutine at a time.
package syncqueue
