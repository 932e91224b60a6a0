// Package election is leader election on Apache ZooKeeper: the seeds'
// recipe without the herd effect, with cancellation, a fencing token and
// a stream of leaders, shaped like etcd's clientv3/concurrency Election.
// It is a library usable without the broker; it depends on go-zookeeper
// only. The qbroker broker elects with it the one broker that sweeps
// expired leases.
//
// # Znode layout
//
//	<path>                  the election (created with its parents by New)
//	<path>/n-0000000041     one candidate: EPHEMERAL_SEQUENTIAL,
//	<path>/n-0000000042     data = its value (Campaign, Proclaim); with
//	                        WithOwner, the owner, then the value
//	<path>/delay-n-0000000041  with WithDelay, the leader's lock-delay marker:
//	                        PERSISTENT, while it leads and, once the
//	                        leadership is lost, for the delay (package lockdelay)
//
// A Reaper, run periodically by one process, deletes the election nodes
// under a directory of elections that had no candidate for a whole pass;
// Campaign makes a deleted node again, and Observe waits for it.
//
// The candidate with the lowest sequence leads. Sequence suffixes are
// parsed as numbers, never compared as strings; children whose names do
// not parse are not candidates. Each waiting candidate watches only the
// node just before its own (an exists watch), so a leader's resignation
// wakes one candidate, its successor, whatever the number of candidates;
// a waiting candidate that goes away wakes only the one behind it, which
// then watches the next one ahead.
//
// # Guarantees
//
//   - At most one candidate is the lowest at any time, and ZooKeeper
//     orders every change: when Campaign returns nil, no other candidate's
//     Campaign does until our node is gone (Resign, or the session ended).
//   - The fencing token (LeaderInfo.Token, Election.Token) is the zxid
//     that created the leader's node: every later leadership of the
//     election has a greater one. Hand it to the resources the leader
//     writes, and let them refuse a token lower than the highest they have
//     seen.
//   - A create whose answer is lost with the connection leaves a node of
//     our live session that nobody would delete: Campaign deletes this
//     session's other candidate nodes (compared by their ephemeral owner),
//     so it cannot stall the election. Hence one session has at most one
//     candidate per election: Campaign refuses a second one in the same
//     process (ErrCampaigning); do not share a session between processes.
//   - Campaign honours its context: when it ends, Campaign deletes its
//     node and returns. Resign is idempotent and safe to retry.
//
// Lock-delay (WithDelay, package lockdelay): a leadership lost with its
// node (the session expired, the node deleted without ResignKey; Abandon)
// leaves the election without a leader until the delay has passed since
// the next candidate noted the loss, so a leader that was only cut off
// can notice and stop first; Resign, Close and ResignKey free it at once.
// Candidates honour earlier leaders' delays whatever their own option.
//
// Fencing tokens are zxids, which ZooKeeper orders across the whole
// ensemble: a leadership's token and a lock's (package lock) compare in
// one space.
//
// What it does not guarantee: that a leader knows at once when it stops
// leading. Done closes when the client learns it: our node deleted, or
// the session expired, which go-zookeeper learns only when it reaches a
// server again. A leader cut off from ZooKeeper keeps its belief while
// the server, once the session timeout has passed, deletes its node and
// the next candidate leads: for a while two processes may think they
// lead. Two remedies, best together: stop acting as leader while the
// connection has no session (from the zk.StateDisconnected event on; the
// broker sweeps only with a session), and fence: pass the token to the
// resources the leader writes, so they refuse an older leader after a
// partition or a long pause.
//
// # Limits
//
//   - A value is node data: under ZooKeeper's jute.maxbuffer (1 MiB by
//     default); keep it small, every Observe and Leader reads it.
//   - The sequence counter of <path> is a signed 32-bit integer: after 2^31
//     campaigns it wraps to negative numbers, and a candidate made after
//     the wrap would sort before the ones made before it. At one campaign
//     a second that is 68 years; delete and recreate <path> (no candidate
//     in it) long before.
//
// ProclaimKey and ResignKey act on a candidate by its key from any
// session: a service that campaigns for its clients (the broker's
// Election service) proclaims and resigns for them wherever they call.
//
// An Election is safe for concurrent use. Its goroutines (the leadership's
// watcher, one per Observe stream) end with the leadership, the stream's
// context, or Close.
package election
