package lock

import (
	"context"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/holding"
)

// Grant is one holding of a lock, from the Lock that returned it to its
// Unlock or its loss. Its watcher goroutine (internal/holding) follows
// the node until then: a deletion or the session's end is a loss, a data
// change a revocation request, and a failed Unlock's delete is retried in
// the background. A Grant is safe for concurrent use.
type Grant struct {
	h *holding.Holding
}

// startGrant starts the grant of the node c.Key, whose Stat and exists
// watch were just read; it sets c.Lost and c.Kind.
func startGrant(c holding.Config) *Grant {
	c.Log.Debug("lock granted", "znode", c.Key, "token", c.Stat.Czxid)
	c.Lost, c.Kind = ErrLost, "lock grant"
	return &Grant{h: holding.Start(c)}
}

// Token returns the fencing token: the zxid that created the grant's node.
// Every later grant of the same lock has a greater one (readers sharing
// the lock have distinct ones, all smaller than the next writer's). Pass
// it to the resources the holder writes and let them refuse a token lower
// than the highest they have seen.
func (g *Grant) Token() int64 { return g.h.Token() }

// Key returns the grant's node, <path>/<kind>-<nonce>-<seq>: with Token,
// what UnlockKey needs.
func (g *Grant) Key() string { return g.h.Key() }

// Lost returns a channel closed when the grant ends: at Unlock, or as soon
// as the client learns it was lost (its node deleted by another client,
// the session expired, the connection closed; see Err). A holder stops
// acting on the lock when it closes.
func (g *Grant) Lost() <-chan struct{} { return g.h.Lost() }

// Revoked returns a channel closed when another client asked the holder to
// release the lock (Revoke). The grant still holds: the holder decides
// when to Unlock.
func (g *Grant) Revoked() <-chan struct{} { return g.h.Revoked() }

// Err returns nil while the grant holds and after Unlock, and an error
// wrapping ErrLost, with the cause, once it was lost.
func (g *Grant) Err() error { return g.h.Err() }

// Unlock releases the lock: it deletes the grant's node (with WithDelay,
// in one multi with its marker: the lock is free at once, no delay),
// closes Lost and waits for the grant's watcher. It is idempotent and
// safe to retry: after the grant ended it returns nil. When the delete
// fails (the connection is down) or ctx has ended, it returns the error,
// and the grant's watcher goes on deleting the node in the background
// until it is gone or the session ends (Lost closes then): a failed
// Unlock never leaves the lock held by a live session.
func (g *Grant) Unlock(ctx context.Context) error { return g.release(ctx, false) }

// Abandon releases the lock as a loss would: it deletes the grant's node
// but leaves its lock-delay marker (WithDelay), so no other contender
// holds until the delay has passed. For a service that holds locks for
// its clients and sees one vanish without unlocking: the client may only
// be cut off, still believing it holds. Without a delay it is Unlock.
// After Unlock or Abandon, the first call decides; errors as Unlock's.
func (g *Grant) Abandon(ctx context.Context) error { return g.release(ctx, true) }

func (g *Grant) release(ctx context.Context, keep bool) error {
	err := g.h.Release(ctx, keep)
	if err != nil && ctx.Err() == nil {
		return errfmt.Errorf("lock: unlock %s: %w", g.h.Key(), err)
	}
	return err
}
