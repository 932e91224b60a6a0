// Package holding follows one holding of a coordination recipe, a lock's
// grant or a semaphore's lease: an EPHEMERAL node of the holder's
// session, from the call that made it to its release or its loss. lock.Grant
// and semaphore.Lease are a Holding under their own names.
//
// A Holding's watcher goroutine follows the node with an exists watch:
// NodeDeleted (another client, or the session's end on the server) or
// EventNotWatching (the client learned the session expired, or the
// connection closed) ends it as lost; a data change is a revocation
// request. After a release whose delete failed, the watcher retries the
// delete in the background, with backoff, until the node is gone or the
// session ends: a failed release never leaves a live session holding.
//
// attempt.go holds what the recipes share before a holding begins:
// Acquire's loop of attempts (create a node, wait, queue again when the
// node vanished with the session, abandon on error), the pacing of a wait
// that rides out connection losses (Pace), the bounds of all retries, and
// a recipe's Background, which removes the nodes of failed attempts and
// ends with the recipe's Close. Each recipe keeps what differs: how its
// nodes are named and what its turn is.
package holding

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lockdelay"
)

// Config describes a holding that just began.
type Config struct {
	Conn   *zk.Conn
	Log    *slog.Logger
	Key    string          // the holding's node
	Stat   *zk.Stat        // the node's Stat, just read
	Watch  <-chan zk.Event // the exists watch set by that read
	Marked bool            // a lock-delay marker goes with the node
	Lost   error           // what Err wraps once the holding was lost
	Kind   string          // what the logs call it: "lock grant", "lease"
}

// Holding is one holding, safe for concurrent use.
type Holding struct {
	conn    *zk.Conn
	log     *slog.Logger
	key     string
	token   int64
	marked  bool
	errLost error
	kind    string

	lost    chan struct{} // closed when the holding ends
	revoked chan struct{} // closed at the first revocation request
	wake    chan struct{} // Release asks the watcher to delete the node
	done    chan struct{} // closed when the watcher returns

	mu        sync.Mutex
	ended     bool
	releasing bool  // Release was called: the node must go
	keep      bool  // Release was asked to keep the lock-delay marker
	err       error // why the holding was lost; nil while held or after Release
	isRevoked bool
}

// Start starts following the holding c describes.
func Start(c Config) *Holding {
	h := &Holding{
		conn: c.Conn, log: c.Log, key: c.Key, token: c.Stat.Czxid, marked: c.Marked, errLost: c.Lost, kind: c.Kind,
		lost: make(chan struct{}), revoked: make(chan struct{}),
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	if c.Stat.Version > 0 {
		h.revoke() // revoked between the grant and now
	}
	go h.watch(c.Watch)
	return h
}

// Token returns the zxid that created the node: the fencing token.
func (h *Holding) Token() int64 { return h.token }

// Key returns the holding's node.
func (h *Holding) Key() string { return h.key }

// Lost returns a channel closed when the holding ends: at Release, or as
// soon as the client learns it was lost.
func (h *Holding) Lost() <-chan struct{} { return h.lost }

// Revoked returns a channel closed at the first revocation request.
func (h *Holding) Revoked() <-chan struct{} { return h.revoked }

// Err returns nil while the holding holds and after Release, and an error
// wrapping Config.Lost, with the cause, once it was lost.
func (h *Holding) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Release deletes the node, with its lock-delay marker unless keep, closes
// Lost and waits for the watcher. It is idempotent: after the holding
// ended it returns nil, and the first call decides keep. When the delete
// fails or ctx has ended it returns the error, and the watcher goes on
// deleting the node in the background.
func (h *Holding) Release(ctx context.Context, keep bool) error {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return nil
	}
	if !h.releasing {
		h.releasing, h.keep = true, keep
	}
	h.mu.Unlock()
	if err := ctx.Err(); err != nil {
		h.kick()
		return err
	}
	err := h.deleteNode()
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		h.kick()
		return err
	}
	h.end(nil, "released")
	select {
	case <-h.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Delete deletes a holding's node key, and its lock-delay marker when it
// may have one: a release frees what it held at once.
func Delete(conn *zk.Conn, key string, marked bool) error {
	if marked {
		return lockdelay.Release(conn, path.Dir(key), path.Base(key))
	}
	return conn.Delete(key, -1)
}

// deleteNode deletes the node, with its marker unless Release was asked
// to keep it.
func (h *Holding) deleteNode() error {
	h.mu.Lock()
	keep := h.keep
	h.mu.Unlock()
	return Delete(h.conn, h.key, h.marked && !keep)
}

func (h *Holding) kick() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// end ends the holding once: err nil for a Release, the cause of a loss
// otherwise.
func (h *Holding) end(err error, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return
	}
	if h.releasing {
		err = nil // the node went as Release asked
	}
	h.ended = true
	if err != nil {
		h.err = fmt.Errorf("%w: %s: %w", h.errLost, h.key, err)
	}
	close(h.lost)
	h.log.Debug(h.kind+" ended", "znode", h.key, "why", why)
}

func (h *Holding) revoke() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.isRevoked {
		h.isRevoked = true
		close(h.revoked)
	}
}

func (h *Holding) isReleasing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.releasing
}

// Causes of a loss, wrapped in Err's error.
var (
	errNodeDeleted = errors.New("node deleted")
	errNoContact   = errors.New("no answer from ZooKeeper for longer than any session lasts")
)

// watch follows the node until the holding ends (see the package doc).
func (h *Holding) watch(w <-chan zk.Event) {
	defer close(h.done)
	backoff := RetryMin
	var retry <-chan time.Time
	for {
		select {
		case <-h.lost:
			return
		case ev := <-w:
			switch ev.Type {
			case zk.EventNodeDeleted:
				h.end(errNodeDeleted, "node deleted")
				return
			case zk.EventNotWatching:
				h.end(ev.Err, "watch ended")
				return
			case zk.EventNodeDataChanged:
				h.revoke()
			}
			if w = h.rewatch(); w == nil {
				return
			}
		case <-h.wake:
		case <-retry:
		}
		if !h.isReleasing() {
			continue
		}
		err := h.deleteNode()
		if err == nil || errors.Is(err, zk.ErrNoNode) {
			h.end(nil, "released in the background")
			return
		}
		h.log.Debug("release failed, retrying", "znode", h.key, "err", err)
		retry = time.After(backoff)
		backoff = min(2*backoff, RetryMax)
	}
}

// rewatch sets the exists watch on the node again, retrying while
// ZooKeeper is away; nil when the holding ended meanwhile.
func (h *Holding) rewatch() <-chan zk.Event {
	backoff, contact := RetryMin, time.Now()
	for {
		ok, st, w, err := h.conn.ExistsW(h.key)
		switch {
		case errors.Is(err, zk.ErrSessionExpired), errors.Is(err, zk.ErrClosing):
			h.end(err, err.Error())
			return nil
		case err == nil && (!ok || st.EphemeralOwner != h.conn.SessionID()):
			h.end(errNodeDeleted, "node gone")
			return nil
		case err == nil:
			if st.Version > 0 {
				h.revoke()
			}
			return w
		case !zkutil.IsUnavailable(err):
			contact = time.Now()
		case time.Since(contact) > NoContactLimit:
			h.end(errNoContact, "no contact")
			return nil
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-h.lost:
			t.Stop()
			return nil
		}
		backoff = min(2*backoff, RetryMax)
	}
}
