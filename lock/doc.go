// Package lock is a distributed lock on Apache ZooKeeper: an exclusive
// Mutex and a read/write RWMutex without the herd effect, with
// cancellation, revocation (seed 001's recoverable lock: another client
// asks the holder to let go), a fencing token per grant and a channel that
// tells the holder at once when it has lost the lock. It is shaped like
// etcd's clientv3/concurrency Mutex. It is a library usable without the
// broker; it depends on go-zookeeper only.
//
// # Znode layout
//
//	<path>                               the lock (created with its parents by NewMutex)
//	<path>/lock-<nonce>-0000000041       a Mutex contender: EPHEMERAL_SEQUENTIAL,
//	<path>/write-<nonce>-0000000042      an RWMutex writer,
//	<path>/read-<nonce>-0000000043       an RWMutex reader; data = WithValue
//	                                     (with WithOwner: the owner, then the value)
//	<path>/delay-write-<nonce>-0000000042  with WithDelay, a holder's lock-delay marker:
//	                                     PERSISTENT, while it holds and, once it is
//	                                     lost, for the delay (package lockdelay)
//
// A Reaper, run periodically by one process, deletes the lock nodes under
// a directory of locks that stayed empty for a whole pass; a contender
// that then finds its lock's node gone makes it again.
//
// <nonce> is 16 random hex digits, new for every Lock call. Nodes are
// ordered by their sequence suffix, parsed as a number (never compared as
// strings); children whose names do not parse are ignored. A "lock" node
// and a "write" node are exclusive, so a Mutex and an RWMutex's writers
// on the same path exclude each other.
//
// An exclusive node holds the lock alone once it is the lowest; read nodes
// before the first exclusive node share it, and a waiting writer makes
// the readers behind it wait too (readers do not starve writers). Each waiter watches exactly one node (an
// exists watch): an exclusive waiter the node just before its own, a
// reader the last exclusive node before its own. So a Mutex's release
// wakes its successor alone, whatever the number of waiters, and a writer's
// release wakes the readers right behind it, who all hold next.
//
// A revocation request is a write of the holder's node with its data
// unchanged (Revoke): the node's data version counts the requests and the
// holder's value survives. A holder's exists watch sees the write and
// closes Grant.Revoked. Seed 001 writes "unlock" into the node instead;
// such a write reaches the holder the same way (it replaces the value).
//
// # Guarantees
//
//   - Mutual exclusion as ZooKeeper orders changes: when Lock returns a
//     Grant, no other contender's does until the grant's node is gone
//     (Unlock, UnlockKey, or the session ended).
//   - The fencing token (Grant.Token) is the zxid that created the
//     grant's node. Grants follow node order, which is creation order, so
//     every later grant of the lock has a greater token.
//   - A grant is made only for a node of the connection's current
//     session: after a session expiry, a node of the old session that the
//     server has not deleted yet grants nothing (the Curator failure where
//     two clients held one lock after a reconnection).
//   - Grant.Lost closes as soon as the client learns the grant is gone:
//     its node deleted (NodeDeleted), the session expired or the
//     connection closed (the watch ends).
//   - A create whose answer is lost with the connection may have made a
//     node of our live session, which would block everyone behind it
//     until the session ends. The nonce finds it: Lock adopts it when the
//     connection is back at once, and a background cleanup deletes it
//     otherwise. One session can thus run many contenders on one lock
//     (one per Lock call), unlike a scheme that deletes all of a
//     session's other nodes.
//   - Lock honours its context: when it ends, Lock deletes its node and
//     returns; a delete that fails is retried in the background.
//   - Unlock is idempotent and safe to retry. When its delete fails (the
//     connection is down), the grant's watcher retries it until the node
//     is gone or the session ends, so the lock is never left stuck by a
//     live session (the Curator failure of a release lost with the
//     connection). Lost closes when the node is gone; Grant.Err tells a
//     loss from an Unlock.
//   - No missed wakeup: a waiter lists the nodes, then sets its exists
//     watch on the one it waits for, and lists again when that node is
//     gone already or the watch fires. A connection loss keeps the watch
//     (the client sets it again when it reconnects); a session expiry
//     ends it, and the waiter, its node gone with the session, queues
//     again with a new node.
//
// Lock-delay (WithDelay, package lockdelay): a grant lost with its node
// (the session expired, the node deleted without UnlockKey; Abandon)
// leaves the lock to nobody until the delay has passed since the first
// contender in line noted the loss, so a holder that was only cut off can
// notice and stop first; Unlock and UnlockKey free it at once. A
// contender honours earlier holders' delays whatever its own option; a
// reader is held off by a lost writer's delay only. TryLock returns
// ErrLocked while a delay runs.
//
// Fencing tokens are zxids, which ZooKeeper orders across the whole
// ensemble: tokens of locks of different paths, and of the election
// package's leaderships, compare in one space.
//
// What it does not guarantee: that a holder knows at once when another
// may hold the lock. A holder cut off from ZooKeeper keeps its grant
// while the server, after the session timeout, deletes its node and grants
// the lock to the next contender; the holder learns it (Lost) only when
// its client reaches a server again. Two remedies, best together: stop
// acting on the lock while the connection has no session (from the
// zk.StateDisconnected event on), and fence: pass Grant.Token to the
// resources the holder writes, and let them refuse a token lower than the
// highest they have seen (see the tests' guarded write). Also not
// guaranteed: that a contender who sees Revoked released; revocation is a
// request.
//
// # Limits
//
//   - The value is node data: keep it small (at most 512 KiB is accepted);
//     Current, Holders and Revoke read it.
//   - The sequence counter of <path> is a signed 32-bit integer: after
//     2^31 Lock calls it wraps to negative numbers and a contender made
//     after the wrap sorts before older ones. Delete and recreate <path>
//     (with no contender in it) long before; a Reaper does so whenever
//     the lock is idle.
//   - The background cleanup gives up after two minutes without an answer
//     from ZooKeeper (no session lasts that long without its client by
//     default: the server's maximum session timeout is 40 s), or at Close.
//
// Mutex, RWMutex and Grant are safe for concurrent use. A Grant's watcher
// goroutine ends with the grant (Unlock or loss); the background cleanups
// end when done, or at the Mutex's or RWMutex's Close.
package lock
