package lock

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

// Grant is one holding of a lock, from the Lock that returned it to its
// Unlock or its loss. Its watcher goroutine follows the node until then.
// A Grant is safe for concurrent use.
type Grant struct {
	conn   *zk.Conn
	log    *slog.Logger
	key    string
	token  int64
	marked bool // a lock-delay marker goes with the node

	lost    chan struct{} // closed when the grant ends
	revoked chan struct{} // closed at the first revocation request
	wake    chan struct{} // Unlock asks the watcher to delete the node
	done    chan struct{} // closed when the watcher returns

	mu        sync.Mutex
	ended     bool
	releasing bool  // Unlock was called: the node must go
	keep      bool  // Abandon was called: the lock-delay marker stays
	err       error // why the grant was lost; nil while held or after Unlock
	isRevoked bool
}

// startGrant starts the grant of the node key, whose Stat st and exists
// watch w were just read.
func startGrant(conn *zk.Conn, log *slog.Logger, key string, st *zk.Stat, w <-chan zk.Event, marked bool) *Grant {
	g := &Grant{
		conn: conn, log: log, key: key, token: st.Czxid, marked: marked,
		lost: make(chan struct{}), revoked: make(chan struct{}),
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	if st.Version > 0 {
		g.revoke() // revoked between becoming the holder and now
	}
	g.log.Debug("lock granted", "znode", key, "token", g.token)
	go g.watch(w)
	return g
}

// Token returns the fencing token: the zxid that created the grant's node.
// Every later grant of the same lock has a greater one (readers sharing
// the lock have distinct ones, all smaller than the next writer's). Pass
// it to the resources the holder writes and let them refuse a token lower
// than the highest they have seen.
func (g *Grant) Token() int64 { return g.token }

// Key returns the grant's node, <path>/<kind>-<nonce>-<seq>: with Token,
// what UnlockKey needs.
func (g *Grant) Key() string { return g.key }

// Lost returns a channel closed when the grant ends: at Unlock, or as soon
// as the client learns it was lost (its node deleted by another client,
// the session expired, the connection closed; see Err). A holder stops
// acting on the lock when it closes.
func (g *Grant) Lost() <-chan struct{} { return g.lost }

// Revoked returns a channel closed when another client asked the holder to
// release the lock (Revoke). The grant still holds: the holder decides
// when to Unlock.
func (g *Grant) Revoked() <-chan struct{} { return g.revoked }

// Err returns nil while the grant holds and after Unlock, and an error
// wrapping ErrLost, with the cause, once it was lost.
func (g *Grant) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Unlock releases the lock: it deletes the grant's node (with WithDelay,
// in one multi with its marker: the lock is free at once, no delay),
// closes Lost and waits for the grant's watcher. It is idempotent and
// safe to retry: after the grant ended it returns nil. When the delete fails (the connection
// is down) or ctx has ended, it returns the error, and the grant's watcher
// goes on deleting the node in the background until it is gone or the
// session ends (Lost closes then): a failed Unlock never leaves the lock
// held by a live session.
func (g *Grant) Unlock(ctx context.Context) error { return g.unlock(ctx, false) }

// Abandon releases the lock as a loss would: it deletes the grant's node
// but leaves its lock-delay marker (WithDelay), so no other contender
// holds until the delay has passed. For a service that holds locks for
// its clients and sees one vanish without unlocking: the client may only
// be cut off, still believing it holds. Without a delay it is Unlock.
// After Unlock or Abandon, the first call decides; errors as Unlock's.
func (g *Grant) Abandon(ctx context.Context) error { return g.unlock(ctx, true) }

func (g *Grant) unlock(ctx context.Context, keep bool) error {
	g.mu.Lock()
	if g.ended {
		g.mu.Unlock()
		return nil
	}
	if !g.releasing {
		g.releasing, g.keep = true, keep
	}
	g.mu.Unlock()
	if err := ctx.Err(); err != nil {
		g.kick()
		return err
	}
	err := g.release()
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		g.kick()
		return errfmt.Errorf("lock: unlock %s: %w", g.key, err)
	}
	g.end(nil, "unlocked")
	select {
	case <-g.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release deletes the grant's node, with its marker unless Abandon asked
// to keep it.
func (g *Grant) release() error {
	g.mu.Lock()
	keep := g.keep
	g.mu.Unlock()
	return release(g.conn, g.key, g.marked && !keep)
}

func (g *Grant) kick() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// end ends the grant once: err nil for an Unlock, the cause of a loss
// otherwise.
func (g *Grant) end(err error, why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return
	}
	if g.releasing {
		err = nil // the node went as Unlock asked
	}
	g.ended = true
	if err != nil {
		g.err = fmt.Errorf("%w: %s: %w", ErrLost, g.key, err)
	}
	close(g.lost)
	g.log.Debug("lock grant ended", "znode", g.key, "why", why)
}

func (g *Grant) revoke() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.isRevoked {
		g.isRevoked = true
		close(g.revoked)
	}
}

func (g *Grant) isReleasing() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.releasing
}

// Causes of a loss, wrapped in Err's error.
var (
	errNodeDeleted = errors.New("node deleted")
	errNoContact   = errors.New("no answer from ZooKeeper for longer than any session lasts")
)

// watch follows the grant's node with an exists watch until the grant
// ends: NodeDeleted (another client, the session's end on the server) or
// EventNotWatching (the client learned the session expired, or the
// connection closed) ends it; a data change is a revocation request.
// After a failed Unlock it retries the delete, with backoff.
func (g *Grant) watch(w <-chan zk.Event) {
	defer close(g.done)
	backoff := retryMin
	var retry <-chan time.Time
	for {
		select {
		case <-g.lost:
			return
		case ev := <-w:
			switch ev.Type {
			case zk.EventNodeDeleted:
				g.end(errNodeDeleted, "node deleted")
				return
			case zk.EventNotWatching:
				g.end(ev.Err, "watch ended")
				return
			case zk.EventNodeDataChanged:
				g.revoke()
			}
			if w = g.rewatch(); w == nil {
				return
			}
		case <-g.wake:
		case <-retry:
		}
		if !g.isReleasing() {
			continue
		}
		err := g.release()
		if err == nil || errors.Is(err, zk.ErrNoNode) {
			g.end(nil, "unlocked in the background")
			return
		}
		g.log.Debug("unlock failed, retrying", "znode", g.key, "err", err)
		retry = time.After(backoff)
		backoff = min(2*backoff, retryMax)
	}
}

// rewatch sets the exists watch on the grant's node again, retrying while
// ZooKeeper is away; nil when the grant ended meanwhile.
func (g *Grant) rewatch() <-chan zk.Event {
	backoff, contact := retryMin, time.Now()
	for {
		ok, st, w, err := g.conn.ExistsW(g.key)
		switch {
		case errors.Is(err, zk.ErrSessionExpired), errors.Is(err, zk.ErrClosing):
			g.end(err, err.Error())
			return nil
		case err == nil && (!ok || st.EphemeralOwner != g.conn.SessionID()):
			g.end(errNodeDeleted, "node gone")
			return nil
		case err == nil:
			if st.Version > 0 {
				g.revoke()
			}
			return w
		case !zkutil.IsUnavailable(err):
			contact = time.Now()
		case time.Since(contact) > noContactLimit:
			g.end(errNoContact, "no contact")
			return nil
		}
		if !sleep(backoff, g.lost, nil) {
			return nil
		}
		backoff = min(2*backoff, retryMax)
	}
}
