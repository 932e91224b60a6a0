package semaphore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// Lease is one holding of permits, from the Acquire that returned it to
// its Release or its loss. Its watcher goroutine follows the lease's node
// until then. A Lease is safe for concurrent use.
type Lease struct {
	conn    *zk.Conn
	log     *slog.Logger
	key     string
	permits int
	token   int64
	marked  bool // a lock-delay marker may be beside the node

	lost    chan struct{} // closed when the lease ends
	revoked chan struct{} // closed at the first revocation request
	wake    chan struct{} // Release asks the watcher to delete the node
	done    chan struct{} // closed when the watcher returns

	mu        sync.Mutex
	ended     bool
	releasing bool  // Release was called: the node must go
	keep      bool  // Abandon was called: the lock-delay marker stays
	err       error // why the lease was lost; nil while held or after Release
	isRevoked bool
}

// startLease starts the lease of the node key, whose Stat st and exists
// watch w were just read.
func startLease(conn *zk.Conn, log *slog.Logger, key string, permits int, st *zk.Stat, w <-chan zk.Event, marked bool) *Lease {
	l := &Lease{
		conn: conn, log: log, key: key, permits: permits, token: st.Czxid, marked: marked,
		lost: make(chan struct{}), revoked: make(chan struct{}),
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	if st.Version > 0 {
		l.revoke() // revoked between the grant and now
	}
	l.log.Debug("permits granted", "znode", key, "permits", permits, "token", l.token)
	go l.watch(w)
	return l
}

// Token returns the fencing token: the zxid that created the lease's
// node. Tokens of leases, of lock grants and of leaderships on the same
// ZooKeeper ensemble are zxids too, so they compare across kinds: a
// resource that refuses a token lower than the highest it has seen
// refuses a stale holder of any of them. Leases held at once have
// distinct tokens.
func (l *Lease) Token() int64 { return l.token }

// Key returns the lease's node, <path>/leases/lease-<n>-<nonce>: with
// Token, what ReleaseKey needs.
func (l *Lease) Key() string { return l.key }

// Permits returns the number of permits the lease holds.
func (l *Lease) Permits() int { return l.permits }

// Lost returns a channel closed when the lease ends: at Release, or as
// soon as the client learns it was lost (its node deleted by another
// client, the session expired, the connection closed; see Err). A holder
// stops using the permits when it closes.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Revoked returns a channel closed when another client asked the holder
// to give its permits back (Revoke, RevokeKey). The lease still holds:
// the holder decides when to Release.
func (l *Lease) Revoked() <-chan struct{} { return l.revoked }

// Err returns nil while the lease holds and after Release, and an error
// wrapping ErrLost, with the cause, once it was lost.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

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
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return nil
	}
	if !l.releasing {
		l.releasing, l.keep = true, keep
	}
	l.mu.Unlock()
	if err := ctx.Err(); err != nil {
		l.kick()
		return err
	}
	err := l.deleteNode()
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		l.kick()
		return errfmt.Errorf("semaphore: release %s: %w", l.key, err)
	}
	l.end(nil, "released")
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// deleteNode deletes the lease's node, with its marker unless Abandon
// asked to keep it.
func (l *Lease) deleteNode() error {
	l.mu.Lock()
	keep := l.keep
	l.mu.Unlock()
	return release(l.conn, l.key, l.marked && !keep)
}

func (l *Lease) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// end ends the lease once: err nil for a Release, the cause of a loss
// otherwise.
func (l *Lease) end(err error, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	if l.releasing {
		err = nil // the node went as Release asked
	}
	l.ended = true
	if err != nil {
		l.err = fmt.Errorf("%w: %s: %w", ErrLost, l.key, err)
	}
	close(l.lost)
	l.log.Debug("lease ended", "znode", l.key, "why", why)
}

func (l *Lease) revoke() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.isRevoked {
		l.isRevoked = true
		close(l.revoked)
	}
}

func (l *Lease) isReleasing() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.releasing
}

// Causes of a loss, wrapped in Err's error.
var (
	errNodeDeleted = errors.New("node deleted")
	errNoContact   = errors.New("no answer from ZooKeeper for longer than any session lasts")
)

// watch follows the lease's node with an exists watch until the lease
// ends: NodeDeleted (another client, the session's end on the server) or
// EventNotWatching (the client learned the session expired, or the
// connection closed) ends it; a data change is a revocation request.
// After a failed Release it retries the delete, with backoff.
func (l *Lease) watch(w <-chan zk.Event) {
	defer close(l.done)
	backoff := retryMin
	var retry <-chan time.Time
	for {
		select {
		case <-l.lost:
			return
		case ev := <-w:
			switch ev.Type {
			case zk.EventNodeDeleted:
				l.end(errNodeDeleted, "node deleted")
				return
			case zk.EventNotWatching:
				l.end(ev.Err, "watch ended")
				return
			case zk.EventNodeDataChanged:
				l.revoke()
			}
			if w = l.rewatch(); w == nil {
				return
			}
		case <-l.wake:
		case <-retry:
		}
		if !l.isReleasing() {
			continue
		}
		err := l.deleteNode()
		if err == nil || errors.Is(err, zk.ErrNoNode) {
			l.end(nil, "released in the background")
			return
		}
		l.log.Debug("release failed, retrying", "znode", l.key, "err", err)
		retry = time.After(backoff)
		backoff = min(2*backoff, retryMax)
	}
}

// rewatch sets the exists watch on the lease's node again, retrying while
// ZooKeeper is away; nil when the lease ended meanwhile.
func (l *Lease) rewatch() <-chan zk.Event {
	backoff, contact := retryMin, time.Now()
	for {
		ok, st, w, err := l.conn.ExistsW(l.key)
		switch {
		case errors.Is(err, zk.ErrSessionExpired), errors.Is(err, zk.ErrClosing):
			l.end(err, err.Error())
			return nil
		case err == nil && (!ok || st.EphemeralOwner != l.conn.SessionID()):
			l.end(errNodeDeleted, "node gone")
			return nil
		case err == nil:
			if st.Version > 0 {
				l.revoke()
			}
			return w
		case !zkutil.IsUnavailable(err):
			contact = time.Now()
		case time.Since(contact) > noContactLimit:
			l.end(errNoContact, "no contact")
			return nil
		}
		if !sleep(backoff, l.lost, nil) {
			return nil
		}
		backoff = min(2*backoff, retryMax)
	}
}
