// Package semaphore is a counting semaphore on Apache ZooKeeper: N
// permits under one name, taken by leases, without the herd effect, with
// cancellation, revocation (another client asks a holder to give its
// permits back), a limit that can change at run time, and a fencing token
// per lease. It is the semaphore Curator ships as
// InterProcessSemaphoreV2, without its known failures (see below). It is a
// library usable without the broker; it depends on go-zookeeper only.
//
// # Znode layout
//
//	<path>                                   the semaphore; data = its limit N, in decimal
//	<path>/queue/wait-<nonce>-0000000041     a waiter: EPHEMERAL_SEQUENTIAL, no data
//	<path>/leases/lease-<n>-<nonce>          a lease of n permits: EPHEMERAL;
//	                                         data = WithValue (with WithOwner: the owner, then the value)
//	<path>/leases/delay-lease-<n>-<nonce>    WithDelay: the lease's lock-delay marker (package lockdelay)
//
// <nonce> is 16 random hex digits, new for every Acquire attempt; the
// waiter and the lease of one attempt share it. Waiters are ordered by
// their sequence suffix, parsed as a number; names that do not parse are
// ignored (and count for no permit). New creates the three nodes in one
// transaction; a Reaper deletes an idle semaphore's three in one
// transaction (so an idle semaphore can be reaped, which
// InterProcessSemaphoreV2's subnodes once prevented: CURATOR-173), and the next Acquire makes them again.
//
// # Algorithm (acquire.go)
//
// Acquire(ctx, n) creates its waiter and lists the queue. A waiter that is
// not first watches the waiter just before it (an exists watch) and looks
// again when that one is gone. The first waiter reads the limit and the
// leases, with watches on both; when n permits are free it takes them in
// one transaction: check the semaphore node's version (the limit it
// read), create its lease, delete its waiter. Otherwise it waits for its
// watches: a release (a lease deleted) or a change of the limit. So:
//
//   - a release wakes one waiter, the first (its children watch on
//     leases/), and a grant wakes one waiter, the next (its exists watch on
//     the granted waiter's node): herd-free, whatever the number of
//     waiters;
//   - waiters are served in arrival order: a waiter for many permits is not
//     starved by later waiters for one;
//   - a release never has to find its successor: it deletes its lease.
//
// Lease.Release deletes the lease (lease.go); its watcher follows the
// lease's node as lock.Grant does. Holders, Revoke, RevokeKey, ReleaseKey,
// Limit, SetLimit and the Reaper are in admin.go.
//
// # Invariants and guarantees
//
//   - At most N permits are held, as ZooKeeper orders changes: leases are
//     created only by the first waiter's transaction, whose delete of its
//     own waiter fails if it is gone (so a waiter that lost its place, or
//     its session, takes nothing), and whose version check fails if the
//     limit changed since it was read. Waiters that are not first create
//     nothing but their waiter. Only the first waiter takes permits, and
//     nothing else creates leases, so the count it read can only have
//     fallen by the time its transaction commits.
//   - Changing the limit (SetLimit) takes effect at once for every
//     process: a raise wakes the first waiter; after a cut, holders above
//     the new limit keep their leases until they release them (ask them
//     with Revoke), and new grants wait until the permits in use are under
//     the new limit. A waiter asking for more than the limit fails with
//     ErrOverLimit instead of blocking the queue.
//   - The fencing token (Lease.Token) is the zxid that created the lease,
//     from the same space as lock.Grant.Token and election tokens on the
//     same ensemble: a resource may compare tokens of all three. Every
//     lease granted later has a greater token.
//   - A lease is granted only to a node of the connection's current
//     session: after a session expiry, a node of the old session grants
//     nothing.
//   - No node is left behind. A holder that crashes: its lease is
//     ephemeral, gone when its session expires. A waiter whose context
//     ends, or whose Semaphore is closed: Acquire deletes its waiter and
//     any lease its attempt was granted without seeing the answer
//     (CURATOR-462, a lease orphaned when the acquiring thread was
//     interrupted). A create or a grant whose answer was lost with the
//     connection (CURATOR-315): the nonce finds the node; Acquire adopts it
//     when the connection is back at once, and a background cleanup
//     deletes it otherwise. A Release whose delete fails: the lease's
//     watcher retries it until the node is gone or the session ends.
//   - Lease.Lost closes as soon as the client learns the lease is gone
//     (deleted, session expired, connection closed); Lease.Err tells a
//     loss from a Release.
//   - Revocation is a request (Revoke asks every holder, RevokeKey one):
//     a write of the lease's node, its data unchanged; the holder's watch
//     sees it and closes Lease.Revoked. Releasing is up to the holder.
//
// Lock-delay (WithDelay, package lockdelay): a lease lost with its node
// (the session expired, the node deleted without ReleaseKey; Abandon)
// keeps its permits unavailable until the delay has passed since the
// first waiter (or a Sweeper) noted the loss; Release and ReleaseKey free
// them at once. The first waiter counts the permits of a lost lease's
// marker as in use (the marker's name carries them); when those alone
// keep it from its permits it waits the delays out (lockdelay.Wait, all
// of the pending ones). TryAcquire returns ErrNoPermit meanwhile.
//
// What it does not guarantee: that a holder knows at once when its lease
// is gone. A holder cut off from ZooKeeper keeps its Lease while the
// server, after the session timeout, deletes the lease and grants the
// permits to another; it learns it (Lost) only when its client reaches a
// server again. As with locks: stop using the permits from the
// zk.StateDisconnected event on, and fence with Lease.Token.
//
// # Limits
//
//   - A limit is 1 to MaxLimit; a lease's value at most 512 KiB.
//   - The queue's sequence counter is a signed 32-bit integer: after 2^31
//     Acquires it wraps. A Reaper recreates the semaphore whenever it is
//     idle.
//   - A Reaper deletes the limit with the semaphore; the next Acquire makes
//     it again with its own Semaphore's limit (New's). Keep the limits
//     given to New in agreement, or use SetLimit on a semaphore in use.
//   - Grants are serial: each is one ZooKeeper transaction by the first
//     waiter, so a semaphore grants at most a few hundred permits a second
//     (its holders may be many).
//
// Semaphore and Lease are safe for concurrent use. A Lease's watcher
// goroutine ends with the lease (Release or loss); the background
// cleanups end when done, or at the Semaphore's Close.
package semaphore
