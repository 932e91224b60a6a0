package lock

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
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
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if l.isClosed() {
			return nil, ErrClosed
		}
		nonce := newNonce()
		key, err := l.create(kind, nonce)
		if err != nil {
			return nil, err
		}
		g, err := l.wait(ctx, key, try)
		if errors.Is(err, errVanished) {
			// The session expired while we waited: queue again.
			l.log.Debug("contender's node vanished, queueing again", "znode", key)
			continue
		}
		if err != nil {
			l.abandon(key, nonce)
			return nil, err
		}
		return g, nil
	}
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
	if testHookCreate != nil {
		key, err = testHookCreate(l.conn, prefix, l.value)
	} else {
		key, err = l.conn.Create(prefix, l.value, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	}
	if err == nil {
		return key, nil
	}
	err = fmt.Errorf("lock: create in %s: %w", l.path, err)
	if !zkutil.IsUnavailable(err) {
		return "", err
	}
	nodes, lerr := l.list()
	if lerr != nil {
		l.reap(nonce)
		return "", err
	}
	if n, ok := withNonce(nodes, nonce); ok {
		l.log.Info("adopting a node whose create answer was lost", "znode", l.path+"/"+n.name)
		return l.path + "/" + n.name, nil
	}
	return "", err
}

// list returns the lock nodes under the lock's node.
func (l *locker) list() ([]node, error) {
	children, _, err := l.conn.Children(l.path)
	if err != nil {
		return nil, fmt.Errorf("lock: children %s: %w", l.path, err)
	}
	return parseAll(children), nil
}

// wait blocks until the node key holds the lock and returns its grant.
func (l *locker) wait(ctx context.Context, key string, try bool) (*Grant, error) {
	me, _ := parseNode(path.Base(key)) // ZooKeeper named it after our prefix
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		nodes, err := l.list()
		if err != nil {
			return nil, err
		}
		if _, ok := withNonce(nodes, me.nonce); !ok {
			return nil, errVanished
		}
		b, blocked := blocker(nodes, me)
		if !blocked {
			return l.grant(key)
		}
		if try {
			return nil, fmt.Errorf("lock: %s: %w", l.path, ErrLocked)
		}
		p := l.path + "/" + b.name
		ok, _, w, err := l.conn.ExistsW(p)
		if err != nil {
			return nil, fmt.Errorf("lock: exists %s: %w", p, err)
		}
		if !ok {
			continue
		}
		if testHookWaiting != nil {
			testHookWaiting(key, p)
		}
		select {
		case <-w:
			// Deleted, or the watch ended (the session expired: our
			// node is gone too, which the next list shows).
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.done:
			return nil, ErrClosed
		}
	}
}

// grant makes the node key, now holding the lock, a Grant: it reads the
// node's creation zxid (the fencing token) with the watch the grant
// follows. A node that is not our current session's is one of an expired
// session that the server has not deleted yet: it holds nothing.
func (l *locker) grant(key string) (*Grant, error) {
	ok, st, w, err := l.conn.ExistsW(key)
	if err != nil {
		return nil, fmt.Errorf("lock: exists %s: %w", key, err)
	}
	if !ok || st.EphemeralOwner != l.conn.SessionID() {
		return nil, errVanished
	}
	return startGrant(l.conn, l.log, key, st, w), nil
}

// abandon deletes the node of an attempt that failed; when the delete
// fails, the background removes it.
func (l *locker) abandon(key, nonce string) {
	err := l.conn.Delete(key, -1)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		l.log.Debug("contender's node left behind", "znode", key, "err", err)
		l.reap(nonce)
	}
}

// Bounds of the background retries: between tries, and how long without
// an answer from ZooKeeper before giving up. A session cannot outlive that
// long without its client (ZooKeeper's default maximum session timeout is
// 40 s), so its ephemeral nodes are gone by then.
const (
	retryMin       = 50 * time.Millisecond
	retryMax       = 2 * time.Second
	noContactLimit = 2 * time.Minute
)

// reap removes, in the background, the node whose name holds nonce: a
// create whose answer was lost, or a delete that failed. It retries until
// the node is gone, ZooKeeper has not answered for noContactLimit, or
// Close.
func (l *locker) reap(nonce string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		backoff, contact := retryMin, time.Now()
		for sleep(backoff, l.done, nil) {
			done, err := l.reapOnce(nonce)
			switch {
			case done:
				return
			case !zkutil.IsUnavailable(err):
				l.log.Info("cannot remove a node left behind", "nonce", nonce, "err", err)
				return
			case errors.Is(err, errAnswered):
				contact = time.Now()
			case time.Since(contact) > noContactLimit:
				l.log.Info("giving up removing a node: no answer from ZooKeeper", "nonce", nonce, "err", err)
				return
			}
			backoff = min(2*backoff, retryMax)
		}
	}()
}

// errAnswered marks a failure after ZooKeeper answered a call of the
// same attempt: the session was alive then.
var errAnswered = errors.New("answered before")

// reapOnce deletes the node named with nonce; done when it is gone.
func (l *locker) reapOnce(nonce string) (done bool, err error) {
	nodes, err := l.list()
	if errors.Is(err, zk.ErrNoNode) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	n, ok := withNonce(nodes, nonce)
	if !ok {
		return true, nil
	}
	p := l.path + "/" + n.name
	if err := l.conn.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return false, fmt.Errorf("lock: delete %s: %w (%w)", p, err, errAnswered)
	}
	l.log.Info("removed a node left behind by a failed call", "znode", p)
	return true, nil
}

// sleep waits d unless a or b closes first (false then); a nil channel
// never closes.
func sleep(d time.Duration, a, b <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-a:
		return false
	case <-b:
		return false
	}
}
