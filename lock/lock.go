package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/holding"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lockdelay"
)

// Sentinel errors, wrapped with the operation and node; use errors.Is.
var (
	// ErrLocked: TryLock or TryRLock found the lock held by another.
	ErrLocked = errors.New("lock: locked by another holder")
	// ErrNotHeld: Current or Revoke found no holder; UnlockKey found no
	// node of that key and token.
	ErrNotHeld = errors.New("lock: not held")
	// ErrLost: what Grant.Err wraps once a grant was lost (its node
	// deleted by another client, the session expired, the connection
	// closed).
	ErrLost = errors.New("lock: grant lost")
	// ErrClosed: the Mutex or RWMutex was closed.
	ErrClosed = errors.New("lock: closed")
	// ErrInvalid: a bad argument.
	ErrInvalid = errors.New("lock: invalid argument")
	// ErrNotOwner: UnlockKey or Revoke with IfOwner met a node of
	// another owner; nothing was changed.
	ErrNotOwner = errors.New("lock: held by another owner")
)

// errVanished: our node went away while we waited (the session expired
// and a new one began): the attempt starts over with a new node.
var errVanished = errors.New("lock: our node vanished")

// Mutex is an exclusive lock under a ZooKeeper node, shared by every
// process that locks the same path. Each Lock is one contender with its
// own node: two Locks of one Mutex, or of two Mutexes on one session,
// exclude each other like Locks of two processes. A Mutex is safe for
// concurrent use.
type Mutex struct{ l *locker }

// RWMutex is a read/write lock under a ZooKeeper node: readers share it,
// a writer holds it alone. Waiters are served in arrival order, so a
// waiting writer is not starved by readers that come after it. A Mutex on
// the same path counts as a writer. An RWMutex is safe for concurrent use.
type RWMutex struct{ l *locker }

// locker is what Mutex and RWMutex share: the lock's node and the
// goroutines that remove nodes a failed call left behind.
type locker struct {
	conn      *zk.Conn
	path      string
	acl       []zk.ACL
	value     []byte // node data: the value, with the owner when there is one
	mayCreate bool   // the lock's node may be created (again) when missing
	delay     time.Duration
	log       *slog.Logger
	bg        *holding.Background // ends waits and cleanups at Close
}

// NewMutex returns a Mutex under the node p, creating p and its missing
// parents unless WithoutCreate says not to. It returns ErrInvalid for a
// nil conn or a path that is not absolute and clean.
func NewMutex(conn *zk.Conn, p string, opts ...Option) (*Mutex, error) {
	l, err := newLocker(conn, p, opts)
	if err != nil {
		return nil, err
	}
	return &Mutex{l: l}, nil
}

// NewRWMutex returns an RWMutex under the node p, as NewMutex does.
func NewRWMutex(conn *zk.Conn, p string, opts ...Option) (*RWMutex, error) {
	l, err := newLocker(conn, p, opts)
	if err != nil {
		return nil, err
	}
	return &RWMutex{l: l}, nil
}

func newLocker(conn *zk.Conn, p string, opts []Option) (*locker, error) {
	o := defaults()
	for _, opt := range opts {
		opt(&o)
	}
	if conn == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalid)
	}
	if err := checkPath(p); err != nil {
		return nil, err
	}
	if len(o.value) > maxValue {
		return nil, fmt.Errorf("%w: value of %d bytes, at most %d", ErrInvalid, len(o.value), maxValue)
	}
	if lockdelay.Validate(o.delay) != nil {
		return nil, fmt.Errorf("%w: delay %v: want 0 (none) to %v", ErrInvalid, o.delay, lockdelay.Max)
	}
	if o.create {
		if err := zkutil.EnsurePath(conn, p, o.acl); err != nil {
			return nil, errfmt.Errorf("lock: %w", err)
		}
	}
	data := zkutil.EncodeOwned(o.owner, o.value)
	l := &locker{conn: conn, path: p, acl: zkutil.ACLOr(o.acl), value: data, mayCreate: o.create,
		delay: o.delay, log: o.logger.With("lock", p)}
	l.bg = holding.NewBackground(conn, l.log, ErrClosed, l.reapOnce)
	return l, nil
}

// maxValue bounds a node's value well under ZooKeeper's jute.maxbuffer.
const maxValue = zkutil.MaxBuffer / 2

func checkPath(p string) error {
	if p == "" || p[0] != '/' || p == "/" || path.Clean(p) != p {
		return fmt.Errorf("%w: path %q: want an absolute, clean ZooKeeper path other than /", ErrInvalid, p)
	}
	return nil
}

// Path returns the lock's node.
func (m *Mutex) Path() string { return m.l.path }

// Lock waits until this contender holds the lock and returns its Grant.
// It creates an EPHEMERAL_SEQUENTIAL node <path>/lock-<nonce>-<seq> and,
// until it is the lowest, watches only the node just before its own, so
// each release wakes one waiter.
//
// Once its node is made, Lock rides out connection losses (queueing again
// with a new node if the session expired) until ctx ends, the connection
// closes, or ZooKeeper has not answered for two minutes. When ctx ends
// first, Lock deletes its node and returns ctx.Err(); on any other error
// it deletes its node too. A delete that fails (the connection is down),
// or a create whose answer was lost with the connection, is finished in
// the background (see Close). Errors of ZooKeeper are wrapped
// (zk.ErrNoNode when the lock's node is missing); ErrClosed after Close.
func (m *Mutex) Lock(ctx context.Context) (*Grant, error) {
	return m.l.acquire(ctx, kindLock, false)
}

// TryLock takes the lock when nobody holds it or waits for it, and
// returns ErrLocked at once otherwise (its node deleted). Other errors as
// Lock's.
func (m *Mutex) TryLock(ctx context.Context) (*Grant, error) {
	return m.l.acquire(ctx, kindLock, true)
}

// Close ends the Locks under way (they return ErrClosed, their nodes
// deleted) and stops the background removal of nodes left by failed calls
// (those nodes then stay until the session ends), waiting for it. Grants
// are not affected: each ends with its Unlock or loss. Close is
// idempotent.
func (m *Mutex) Close() error { return m.l.close() }

// Path returns the lock's node.
func (rw *RWMutex) Path() string { return rw.l.path }

// RLock waits until this reader shares the lock: until no writer (or
// Mutex) node is before its own <path>/read-<nonce>-<seq>. It watches only
// the last such writer node. Errors as Mutex.Lock's.
func (rw *RWMutex) RLock(ctx context.Context) (*Grant, error) {
	return rw.l.acquire(ctx, kindRead, false)
}

// TryRLock is RLock that returns ErrLocked at once when a writer holds
// the lock or waits for it.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Grant, error) {
	return rw.l.acquire(ctx, kindRead, true)
}

// Lock waits until this writer holds the lock alone: until its node
// <path>/write-<nonce>-<seq> is the lowest. It watches only the node just
// before its own, of either kind. Errors as Mutex.Lock's.
func (rw *RWMutex) Lock(ctx context.Context) (*Grant, error) {
	return rw.l.acquire(ctx, kindWrite, false)
}

// TryLock is Lock that returns ErrLocked at once when anyone holds the
// lock or waits for it.
func (rw *RWMutex) TryLock(ctx context.Context) (*Grant, error) {
	return rw.l.acquire(ctx, kindWrite, true)
}

// Close is Mutex.Close.
func (rw *RWMutex) Close() error { return rw.l.close() }

func (l *locker) close() error {
	l.bg.Close()
	return nil
}
