// Package lockdelay keeps a lock-like name unavailable for a while after
// its holder was lost, as Chubby's and Consul's lock-delay do: when a
// holder's ZooKeeper session ends (expiry after a crash or a partition)
// the name stays unavailable for the holder's delay, so a holder that was
// only cut off can notice and stop before a new holder acts; an explicit
// release (Unlock, Resign) frees it at once. The lock/, election/ and
// semaphore/ recipes use it (lock.WithDelay, election.WithDelay,
// semaphore.WithDelay, where a lost lease's marker keeps its permits);
// any recipe whose holders are ephemeral nodes under one directory can,
// with four calls:
// Wait before granting, Mark once granted, Release to let go, and a
// Sweeper run by one process. It is a library usable without the broker;
// it depends on go-zookeeper only.
//
// # Znode layout
//
//	<dir>/<holder>            the holder's EPHEMERAL node (the recipe's own)
//	<dir>/delay-<holder>      its marker: PERSISTENT, data = the delay in
//	                          milliseconds (decimal text); version 0 while
//	                          the holder lives, 1 once its loss was noted
//
// Recipes must ignore children named delay-*; lock/, election/ and
// semaphore/ do (their nodes' names do not parse).
//
// # How it works
//
// A holder with a delay Marks once its node holds the name: a multi that
// checks its node exists and creates the marker, so no marker outlives a
// holder that was gone before. Release deletes both nodes in one multi.
// A marker whose holder's node exists holds nothing by itself. A marker
// whose holder's node is gone (the session ended, or someone deleted the
// node without Release) holds the name until its delay has passed since
// the loss was first observed: the first observer (the contender next in
// line, which Waits before it is granted, or a Sweeper) notes the loss
// with a write of the marker at version 0, so every later observer knows
// the delay runs and ZooKeeper's mtime records when it began. Each
// observer counts the delay on its own monotonic clock from when it first
// saw the loss noted, and deletes the marker when it has passed (at the
// noted version: one observer deletes it, the others find it gone and
// wake on their watch).
//
// # Clock assumption
//
// No wall clock is compared across machines. Every observer counts the
// delay on its local monotonic clock from its own observation, which
// comes after the first one, so, as long as clocks tick at about the rate
// of real time, the marker is deleted no earlier than the delay after the
// loss was first noted, which is after the holder's node was gone. The
// delay is thus counted from the server's deletion of the holder's node,
// not from the holder's last contact: choose it longer than a holder
// needs to notice that its connection has no session (go-zookeeper's
// StateDisconnected) and stop.
//
// # Guarantees and limits
//
//   - Between the loss of a holder with a delay and the end of its delay,
//     no contender that Waits is granted the name. A contender waiting
//     for the name Waits at once, so the delay runs from the loss; a name
//     nobody contends for keeps its marker until a Sweeper pass or the
//     next contender, which then waits the full delay from its own
//     observation.
//   - An explicit release (Release; Clear after a release by key) leaves
//     no marker: the next contender is granted at once.
//   - No marker is left behind: each ends with Release, or with its
//     delay at the next contender or Sweeper pass.
//   - The delay is at most Max (one minute).
//
// Mark, Release, Clear and Wait are safe for concurrent use; a Sweeper is
// used by one goroutine at a time.
package lockdelay
