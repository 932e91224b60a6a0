package lock

import (
	"context"
	"errors"
	"path"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/holding"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lockdelay"
)

// Test hooks, set by tests only (export_test.go). testHookCreate stands
// in for the create of a contender's node; testHookWaiting runs when the
// contender key starts waiting for the node pred to go.
var (
	testHookCreate  func(conn *zk.Conn, prefix string, data []byte) (string, error)
	testHookWaiting func(key, pred string)
)

// acquire is Lock, TryLock, RLock and TryRLock: kind names the node, try
// gives up with ErrLocked instead of waiting.
func (l *locker) acquire(ctx context.Context, kind string, try bool) (*Grant, error) {
	return holding.Acquire(ctx, l.bg, holding.Attempt[*Grant]{
		Create: func(nonce string) (string, error) { return l.create(kind, nonce) },
		Wait: func(ctx context.Context, key, _ string) (*Grant, error) {
			return l.wait(ctx, key, try)
		},
		// An attempt that failed leaves its node, deleted with its marker.
		Nodes:    func(key, _ string) []holding.Node { return []holding.Node{{Key: key, Marked: l.delay > 0}} },
		Vanished: errVanished,
		What:     "contender's node",
	})
}

// create makes the contender's node. A create that fails with the
// connection may have been applied, its answer lost: the node, ephemeral
// and owned by our live session, would otherwise block the lock for
// everyone until the session ends. Its nonce finds it: create adopts it
// when the connection is back at once, and leaves its removal to the
// background otherwise.
func (l *locker) create(kind, nonce string) (string, error) {
	prefix := l.path + "/" + namePrefix(kind, nonce)
	var key string
	var err error
	for range maxRecreate + 1 {
		if testHookCreate != nil {
			key, err = testHookCreate(l.conn, prefix, l.value)
		} else {
			key, err = l.conn.Create(prefix, l.value, zk.FlagEphemeral|zk.FlagSequence, l.acl)
		}
		if !errors.Is(err, zk.ErrNoNode) || !l.mayCreate {
			break
		}
		// The lock's node went while idle (a Reaper deleted it): make it
		// again. The create failed, so no node of ours exists.
		if perr := zkutil.EnsurePath(l.conn, l.path, l.acl); perr != nil {
			err = perr
			break
		}
	}
	if err == nil {
		return key, nil
	}
	err = errfmt.Errorf("lock: create in %s: %w", l.path, err)
	if !zkutil.IsUnavailable(err) {
		return "", err
	}
	nodes, lerr := l.list()
	if lerr != nil {
		l.bg.Reap(nonce)
		return "", err
	}
	if n, ok := withNonce(nodes, nonce); ok {
		l.log.Info("adopting a node whose create answer was lost", "znode", l.path+"/"+n.name)
		return l.path + "/" + n.name, nil
	}
	return "", err
}

// maxRecreate bounds how often one create makes the lock's node again
// after finding it gone: a reaper deletes it only once idle, so a second
// loss in a row is already unlikely.
const maxRecreate = 8

// list returns the lock nodes under the lock's node.
func (l *locker) list() ([]node, error) {
	nodes, _, err := l.listAll()
	return nodes, err
}

// listAll returns the lock nodes under the lock's node, and all its
// children (with the lock-delay markers).
func (l *locker) listAll() ([]node, []string, error) {
	children, _, err := l.conn.Children(l.path)
	if err != nil {
		return nil, nil, errfmt.Errorf("lock: children %s: %w", l.path, err)
	}
	return parseAll(children), children, nil
}

// wait blocks until the node key holds the lock and returns its grant.
// It rides out connection losses (the client reconnects, maybe with a
// new session that no longer has our node: errVanished then) until ctx
// ends, the connection closes, or ZooKeeper has not answered for
// holding.NoContactLimit.
func (l *locker) wait(ctx context.Context, key string, try bool) (*Grant, error) {
	me, _ := parseNode(path.Base(key)) // ZooKeeper named it after our prefix
	// Our node's Stat and exists watch, which a grant needs, are read
	// beside the first listing: an uncontended Lock costs a create and
	// one round trip.
	var mine watched
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		mine = l.watchOwn(key)
	}()
	defer wg.Wait()
	pace := holding.NewPace()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		w, holds, delayed, err := l.check(me, try)
		if holds && delayed {
			// First in line, but a lost holder's lock-delay runs: wait
			// it out, then look again.
			err = l.waitDelay(ctx, me)
			holds = false
			if err == nil {
				continue
			}
		}
		if holds {
			wg.Wait()
			return l.grant(key, mine)
		}
		if err != nil {
			if err := pace.Retry(ctx, l.bg, err); err != nil {
				return nil, err
			}
			continue
		}
		pace.Answered()
		if w == nil {
			continue // the node to wait for went meanwhile
		}
		select {
		case ev := <-w:
			// Deleted, or the watch ended: the session expired (our node
			// is gone too, which the next list shows) or the connection
			// closed.
			if errors.Is(ev.Err, zk.ErrClosing) {
				return nil, errfmt.Errorf("lock: waiting in %s: %w", l.path, ev.Err)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.bg.Done():
			return nil, ErrClosed
		}
	}
}

// check lists the lock's nodes once: holds when me holds the lock, else
// the exists watch on the node me waits for (nil when that node is gone
// already). delayed says that me is first in line but a lost holder's
// lock-delay marker may still hold the lock (TryLock: ErrLocked).
func (l *locker) check(me node, try bool) (w <-chan zk.Event, holds, delayed bool, err error) {
	nodes, children, err := l.listAll()
	if err != nil {
		return nil, false, false, err
	}
	if _, ok := withNonce(nodes, me.nonce); !ok {
		return nil, false, false, errVanished
	}
	b, blocked := blocker(nodes, me)
	if !blocked {
		delayed = lockdelay.Blocked(children, delayBlocks(me))
		if delayed && try {
			return nil, false, false, errfmt.Errorf("lock: trylock %s: %w (lock-delay)", l.path, ErrLocked)
		}
		return nil, true, delayed, nil
	}
	if try {
		return nil, false, false, errfmt.Errorf("lock: trylock %s: %w", l.path, ErrLocked)
	}
	p := l.path + "/" + b.name
	ok, _, w, err := l.conn.ExistsW(p)
	if err != nil {
		return nil, false, false, errfmt.Errorf("lock: exists %s: %w", p, err)
	}
	if !ok {
		return nil, false, false, nil
	}
	if testHookWaiting != nil {
		testHookWaiting(l.path+"/"+me.name, p)
	}
	return w, false, false, nil
}

// delayBlocks says which lost holders' lock-delays hold me off: every
// holder's for an exclusive node, a writer's (or Mutex's) for a reader,
// which would have shared the lock with a reader.
func delayBlocks(me node) func(holder string) bool {
	if me.exclusive() {
		return nil
	}
	return func(holder string) bool {
		n, ok := parseNode(holder)
		return !ok || n.exclusive()
	}
}

// waitDelay waits, first in line, until no lost holder's lock-delay
// holds the lock, or ctx ends, or Close.
func (l *locker) waitDelay(ctx context.Context, me node) error {
	ctx, cancel := l.bg.WithClose(ctx)
	defer cancel()
	waited, err := lockdelay.Wait(ctx, l.conn, l.path, delayBlocks(me))
	if waited {
		l.log.Debug("waited for a lost holder's lock-delay", "znode", l.path+"/"+me.name)
	}
	if err != nil && l.bg.Closed() {
		return ErrClosed
	}
	return err
}

// watched is a node's Stat and exists watch, read together.
type watched struct {
	st  *zk.Stat
	w   <-chan zk.Event
	err error
}

// watchOwn reads our node's Stat with an exists watch: the grant follows
// the watch, so whatever happened to the node since (a revocation, its
// deletion, the session's end) reaches the grant.
func (l *locker) watchOwn(key string) watched {
	ok, st, w, err := l.conn.ExistsW(key)
	switch {
	case err != nil:
		return watched{err: errfmt.Errorf("lock: exists %s: %w", key, err)}
	case !ok:
		return watched{err: errVanished}
	}
	return watched{st: st, w: w}
}

// grant makes the node key, now holding the lock, a Grant: its Stat gives
// the fencing token (the creation zxid), its watch the grant's watcher.
// A node that is not our current session's is one of an expired session
// that the server has not deleted yet: it holds nothing.
func (l *locker) grant(key string, mine watched) (*Grant, error) {
	if mine.err != nil && !errors.Is(mine.err, errVanished) {
		mine = l.watchOwn(key) // the first read failed: read again
	}
	if mine.err != nil {
		return nil, mine.err
	}
	if mine.st.EphemeralOwner != l.conn.SessionID() {
		return nil, errVanished
	}
	// The marker of our lock-delay, before the holder is told.
	err := lockdelay.Mark(l.conn, l.path, path.Base(key), l.delay, l.acl)
	if errors.Is(err, lockdelay.ErrHolderGone) {
		return nil, errVanished
	}
	if err != nil {
		return nil, errfmt.Errorf("lock: %w", err)
	}
	return startGrant(holding.Config{Conn: l.conn, Log: l.log, Key: key, Stat: mine.st, Watch: mine.w, Marked: l.delay > 0}), nil
}

// reapOnce deletes the node named with nonce, a create whose answer was
// lost or a delete that failed (the Background's Reap retries it); nil
// once it is gone.
func (l *locker) reapOnce(nonce string) error {
	nodes, err := l.list()
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	n, ok := withNonce(nodes, nonce)
	if !ok {
		return nil
	}
	p := l.path + "/" + n.name
	if err := holding.Delete(l.conn, p, l.delay > 0); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return errfmt.Errorf("lock: delete %s: %w (%w)", p, err, holding.ErrAnswered)
	}
	l.log.Info("removed a node left behind by a failed call", "znode", p)
	return nil
}
