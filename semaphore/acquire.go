package semaphore

import (
	"context"
	"errors"
	"fmt"
	"path"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/holding"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lockdelay"
)

// Test hooks, set by tests only (export_test.go). testHookWaiting runs
// when a waiter starts waiting on watches (on the waiter pred before it,
// or on the leases when pred is ""); testHookWoken when one of them fired
// and the waiter woke.
var (
	testHookWaiting func(key, pred string)
	testHookWoken   func(key, pred string)
)

// acquire is Acquire and TryAcquire: try gives up with ErrNoPermit
// instead of waiting.
func (s *Semaphore) acquire(ctx context.Context, n int, try bool) (*Lease, error) {
	if n < 1 || n > MaxLimit {
		return nil, fmt.Errorf("%w: %d permits: want 1 to %d", ErrInvalid, n, MaxLimit)
	}
	return holding.Acquire(ctx, s.bg, holding.Attempt[*Lease]{
		Create: s.enqueue,
		Wait: func(ctx context.Context, key, nonce string) (*Lease, error) {
			return s.wait(ctx, key, nonce, n, try)
		},
		// An attempt that failed leaves its waiter, and a lease it may
		// have been granted without seeing it, deleted with its marker.
		Nodes: func(key, nonce string) []holding.Node {
			return []holding.Node{{Key: key}, {Key: s.leasePath(n, nonce), Marked: s.delay > 0}}
		},
		Vanished: errVanished,
		What:     "waiter",
	})
}

func (s *Semaphore) leasePath(n int, nonce string) string {
	return s.leases + "/" + leaseName(n, nonce)
}

// enqueue makes the contender's waiter. A create that fails with the
// connection may have been applied, its answer lost: the waiter, owned by
// our live session, would block the queue until the session ends. Its
// nonce finds it: enqueue adopts it when the connection is back at once,
// and leaves its removal to the background otherwise.
func (s *Semaphore) enqueue(nonce string) (string, error) {
	prefix := s.queue + "/" + waitPrefix + nonce + "-"
	var key string
	var err error
	for range maxRecreate + 1 {
		key, err = s.conn.Create(prefix, nil, zk.FlagEphemeral|zk.FlagSequence, s.acl)
		if !errors.Is(err, zk.ErrNoNode) {
			break
		}
		// The semaphore went while idle (a Reaper deleted it): make it
		// again. The create failed, so no node of ours exists.
		if perr := s.ensure(); perr != nil {
			err = perr
			break
		}
	}
	if err == nil {
		return key, nil
	}
	err = errfmt.Errorf("semaphore: create in %s: %w", s.queue, err)
	if !zkutil.IsUnavailable(err) {
		return "", err
	}
	children, _, lerr := s.conn.Children(s.queue)
	if lerr != nil {
		s.bg.Reap(nonce)
		return "", err
	}
	if w, ok := waiterWithNonce(waiters(children), nonce); ok {
		s.log.Info("adopting a waiter whose create answer was lost", "znode", s.queue+"/"+w.name)
		return s.queue + "/" + w.name, nil
	}
	return "", err
}

// maxRecreate bounds how often one create makes the semaphore's node
// again after finding it gone.
const maxRecreate = 8

// watches is what a waiter waits on: the waiter before it, or (the first
// waiter) the leases and the limit.
type watches struct {
	pred   string // the waiter waited for; "" for the first waiter
	a, b   <-chan zk.Event
	active bool
	delay  bool // first, and only lost leases' lock-delays keep the permits: wait them out
}

// wait blocks until the waiter key holds n permits and returns its lease.
// It rides out connection losses until ctx ends, the connection closes,
// or ZooKeeper has not answered for holding.NoContactLimit.
func (s *Semaphore) wait(ctx context.Context, key, nonce string, n int, try bool) (*Lease, error) {
	me, _ := parseWaiter(path.Base(key)) // ZooKeeper named it after our prefix
	lp := s.leasePath(n, nonce)
	pace := holding.NewPace()
	head := false // me is known to be the first waiter
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		l, w, err := s.step(me, n, lp, try, head)
		head = err == nil && w.active && w.pred == ""
		if errors.Is(err, errVanished) {
			// Our waiter is gone: the transaction that grants deleted
			// it and its answer was lost, or the session expired. A lease
			// of ours is the grant; otherwise queue again.
			g, gerr := s.grant(lp, n)
			switch {
			case gerr == nil:
				return g, nil
			case errors.Is(gerr, errVanished), !holding.Transient(gerr):
				return nil, gerr
			}
			err = gerr
		}
		if l != nil {
			return l, nil
		}
		if err != nil {
			if err := pace.Retry(ctx, s.bg, err); err != nil {
				return nil, err
			}
			continue
		}
		pace.Answered()
		if w.delay {
			if err := s.waitDelay(ctx, key); err != nil {
				return nil, err
			}
			continue
		}
		if !w.active {
			continue // something changed meanwhile: look again
		}
		if testHookWaiting != nil {
			testHookWaiting(key, w.pred)
		}
		var ev zk.Event
		select {
		case ev = <-w.a:
		case ev = <-w.b:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.bg.Done():
			return nil, ErrClosed
		}
		if errors.Is(ev.Err, zk.ErrClosing) {
			return nil, errfmt.Errorf("semaphore: waiting in %s: %w", s.path, ev.Err)
		}
		if ev.Type == zk.EventNotWatching {
			// The session expired (our waiter went with it) or the
			// watches were dropped: look at the queue again.
			head = false
		}
		if testHookWoken != nil {
			testHookWoken(key, w.pred)
		}
	}
}

// step looks once: a lease when me was granted, else what to wait on
// (inactive when something changed meanwhile and step should run again).
// A waiter known to be first (head) skips the listing of the queue:
// nobody can get before it.
func (s *Semaphore) step(me waiter, n int, lp string, try, head bool) (*Lease, watches, error) {
	if !head {
		children, _, err := s.conn.Children(s.queue)
		if errors.Is(err, zk.ErrNoNode) {
			return nil, watches{}, errVanished
		}
		if err != nil {
			return nil, watches{}, errfmt.Errorf("semaphore: children %s: %w", s.queue, err)
		}
		queue := waiters(children)
		if _, ok := waiterWithNonce(queue, me.nonce); !ok {
			return nil, watches{}, errVanished
		}
		if pred, ok := ahead(queue, me); ok {
			if try {
				return nil, watches{}, errfmt.Errorf("semaphore: tryacquire %s: %d waiting: %w", s.path, len(queue)-1, ErrNoPermit)
			}
			p := s.queue + "/" + pred.name
			ok, _, w, err := s.conn.ExistsW(p)
			if err != nil {
				return nil, watches{}, errfmt.Errorf("semaphore: exists %s: %w", p, err)
			}
			return nil, watches{pred: p, a: w, active: ok}, nil
		}
	}
	// The first waiter: the only one that may take permits. It reads
	// the limit and the leases with watches, so that no release or
	// change of the limit is missed if it must wait.
	limit, version, used, held, w, err := s.room(!try)
	if err != nil {
		return nil, watches{}, err
	}
	if n > limit {
		return nil, watches{}, errfmt.Errorf("semaphore: acquire %d of %s: limit %d: %w", n, s.path, limit, ErrOverLimit)
	}
	if used+held+n <= limit {
		return s.take(me, n, lp, version)
	}
	if try && used+n <= limit {
		return nil, watches{}, errfmt.Errorf("semaphore: tryacquire %d of %s: %d of %d kept by lock-delay: %w", n, s.path, held, limit, ErrNoPermit)
	}
	if used+n <= limit {
		return nil, watches{delay: true}, nil
	}
	if try {
		return nil, watches{}, errfmt.Errorf("semaphore: tryacquire %d of %s: %d of %d in use: %w", n, s.path, used, limit, ErrNoPermit)
	}
	return nil, w, nil
}

// room reads the limit (with its version) and the permits in use, the
// two reads together; with watch, it sets watches on both (the first
// waiter's). used counts the leases' permits, held those that lost
// leases' lock-delays keep.
func (s *Semaphore) room(watch bool) (limit int, version int32, used, held int, w watches, err error) {
	type got struct {
		data []byte
		st   *zk.Stat
		w    <-chan zk.Event
		err  error
	}
	c := make(chan got, 1)
	go func() {
		var g got
		if watch {
			g.data, g.st, g.w, g.err = s.conn.GetW(s.path)
		} else {
			g.data, g.st, g.err = s.conn.Get(s.path)
		}
		c <- g
	}()
	var children []string
	var lerr error
	if watch {
		children, _, w.a, lerr = s.conn.ChildrenW(s.leases)
	} else {
		children, _, lerr = s.conn.Children(s.leases)
	}
	g := <-c
	switch {
	case g.err != nil:
		return 0, 0, 0, 0, watches{}, errfmt.Errorf("semaphore: get %s: %w", s.path, g.err)
	case lerr != nil:
		return 0, 0, 0, 0, watches{}, errfmt.Errorf("semaphore: children %s: %w", s.leases, lerr)
	}
	limit, ok := parseLimit(g.data)
	if !ok {
		return 0, 0, 0, 0, watches{}, fmt.Errorf("%w: %s holds no limit", ErrInvalid, s.path)
	}
	w.b, w.active = g.w, watch
	return limit, g.st.Version, inUse(leases(children)), delayed(children), w, nil
}

// take grants n permits to the first waiter me: one transaction checks
// that the limit is still the one read (version), creates the lease and
// deletes the waiter. Only the first waiter takes permits, and its
// waiter's existence is checked by the same transaction (the delete), so
// two takes never race on the same count.
func (s *Semaphore) take(me waiter, n int, lp string, version int32) (*Lease, watches, error) {
	res, err := s.conn.Multi(
		&zk.CheckVersionRequest{Path: s.path, Version: version},
		&zk.CreateRequest{Path: lp, Data: s.value, Acl: s.acl, Flags: zk.FlagEphemeral},
		&zk.DeleteRequest{Path: s.queue + "/" + me.name, Version: -1},
	)
	err = zkutil.MultiError(res, err)
	switch {
	case err == nil:
		l, err := s.grant(lp, n)
		return l, watches{}, err
	case errors.Is(err, zk.ErrBadVersion):
		return nil, watches{}, nil // the limit changed: look again
	case errors.Is(err, zk.ErrNoNode):
		return nil, watches{}, errVanished // our waiter is gone
	}
	return nil, watches{}, errfmt.Errorf("semaphore: take %s: %w", lp, err)
}

// grant makes the lease lp, just created, a Lease: its Stat gives the
// fencing token (the creation zxid), its exists watch the lease's
// watcher. A lease that is not our current session's holds nothing
// (errVanished), nor does one that is gone.
func (s *Semaphore) grant(lp string, n int) (*Lease, error) {
	ok, st, w, err := s.conn.ExistsW(lp)
	switch {
	case err != nil:
		return nil, errfmt.Errorf("semaphore: exists %s: %w", lp, err)
	case !ok, st.EphemeralOwner != s.conn.SessionID():
		return nil, errVanished
	}
	// The marker of our lock-delay, before the holder is told.
	err = lockdelay.Mark(s.conn, s.leases, path.Base(lp), s.delay, s.acl)
	if errors.Is(err, lockdelay.ErrHolderGone) {
		return nil, errVanished
	}
	if err != nil {
		return nil, errfmt.Errorf("semaphore: %w", err)
	}
	return startLease(holding.Config{Conn: s.conn, Log: s.log, Key: lp, Stat: st, Watch: w, Marked: s.delay > 0}, n), nil
}

// waitDelay waits, first in line, until no lost lease's lock-delay keeps
// permits, or ctx ends, or Close.
func (s *Semaphore) waitDelay(ctx context.Context, key string) error {
	ctx, cancel := s.bg.WithClose(ctx)
	defer cancel()
	waited, err := lockdelay.Wait(ctx, s.conn, s.leases, nil)
	if waited {
		s.log.Debug("waited for a lost lease's lock-delay", "znode", key)
	}
	if err != nil && s.bg.Closed() {
		return ErrClosed
	}
	return err
}

// reapOnce deletes the waiter and the lease named with nonce, left by a
// create whose answer was lost or a delete that failed (the Background's
// Reap retries it); nil once both are gone.
func (s *Semaphore) reapOnce(nonce string) error {
	for _, dir := range []string{s.queue, s.leases} {
		children, _, err := s.conn.Children(dir)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return errfmt.Errorf("semaphore: children %s: %w", dir, err)
		}
		name := ""
		if w, ok := waiterWithNonce(waiters(children), nonce); ok && dir == s.queue {
			name = w.name
		}
		if l, ok := leaseWithNonce(leases(children), nonce); ok && dir == s.leases {
			name = l.name
		}
		if name == "" {
			continue
		}
		p := dir + "/" + name
		if dir == s.leases {
			// A lease never granted keeps no delay.
			if err := lockdelay.Clear(s.conn, dir, name); err != nil {
				return errfmt.Errorf("semaphore: %w (%w)", err, holding.ErrAnswered)
			}
		}
		if err := s.conn.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return errfmt.Errorf("semaphore: delete %s: %w (%w)", p, err, holding.ErrAnswered)
		}
		s.log.Info("removed a node left behind by a failed call", "znode", p)
	}
	return nil
}
