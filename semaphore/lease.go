package semaphore

import (
	"context"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/holding"
)

// Lease is one holding of permits, from the Acquire that returned it to
// its Release or its loss. Its watcher goroutine (internal/holding)
// follows the lease's node until then: a deletion or the session's end is
// a loss, a data change a revocation request, and a failed Release's
// delete is retried in the background. A Lease is safe for concurrent use.
type Lease struct {
	h       *holding.Holding
	permits int
}

// startLease starts the lease of permits held by the node c.Key, whose
// Stat and exists watch were just read; it sets c.Lost and c.Kind.
func startLease(c holding.Config, permits int) *Lease {
	c.Log.Debug("permits granted", "znode", c.Key, "permits", permits, "token", c.Stat.Czxid)
	c.Lost, c.Kind = ErrLost, "lease"
	return &Lease{permits: permits, h: holding.Start(c)}
}

// Token returns the fencing token: the zxid that created the lease's
// node. Tokens of leases, of lock grants and of leaderships on the same
// ZooKeeper ensemble are zxids too, so they compare across kinds: a
// resource that refuses a token lower than the highest it has seen
// refuses a stale holder of any of them. Leases held at once have
// distinct tokens.
func (l *Lease) Token() int64 { return l.h.Token() }

// Key returns the lease's node, <path>/leases/lease-<n>-<nonce>: with
// Token, what ReleaseKey needs.
func (l *Lease) Key() string { return l.h.Key() }

// Permits returns the number of permits the lease holds.
func (l *Lease) Permits() int { return l.permits }

// Lost returns a channel closed when the lease ends: at Release, or as
// soon as the client learns it was lost (its node deleted by another
// client, the session expired, the connection closed; see Err). A holder
// stops using the permits when it closes.
func (l *Lease) Lost() <-chan struct{} { return l.h.Lost() }

// Revoked returns a channel closed when another client asked the holder
// to give its permits back (Revoke, RevokeKey). The lease still holds:
// the holder decides when to Release.
func (l *Lease) Revoked() <-chan struct{} { return l.h.Revoked() }

// Err returns nil while the lease holds and after Release, and an error
// wrapping ErrLost, with the cause, once it was lost.
func (l *Lease) Err() error { return l.h.Err() }

// Release gives the permits back: it deletes the lease's node, closes
// Lost and waits for the lease's watcher. It is idempotent and safe to
// retry: after the lease ended it returns nil. When the delete fails (the
// connection is down) or ctx has ended, it returns the error, and the
// watcher goes on deleting the node in the background until it is gone
// or the session ends (Lost closes then): a failed Release never leaves
// permits held by a live session.
func (l *Lease) Release(ctx context.Context) error { return l.release(ctx, false) }

// Abandon gives the permits back as a loss would: it deletes the lease's
// node but leaves its lock-delay marker (WithDelay), so the permits stay
// unavailable until the delay has passed. For a service that holds
// permits for its clients and sees one vanish without releasing: the
// client may only be cut off, still believing it holds. Without a delay
// it is Release. After Release or Abandon, the first call decides; errors
// as Release's.
func (l *Lease) Abandon(ctx context.Context) error { return l.release(ctx, true) }

func (l *Lease) release(ctx context.Context, keep bool) error {
	err := l.h.Release(ctx, keep)
	if err != nil && ctx.Err() == nil {
		return errfmt.Errorf("semaphore: release %s: %w", l.h.Key(), err)
	}
	return err
}
