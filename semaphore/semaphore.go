package semaphore

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
	// ErrNoPermit: TryAcquire found no free permits, or others waiting
	// before it.
	ErrNoPermit = errors.New("semaphore: no permit available")
	// ErrOverLimit: Acquire asked for more permits than the semaphore's
	// limit (at the call, or after the limit was lowered while it
	// waited): it could never be granted.
	ErrOverLimit = errors.New("semaphore: more permits than the limit")
	// ErrNotHeld: ReleaseKey or RevokeKey found no lease of that key (and
	// token); Revoke found no holder.
	ErrNotHeld = errors.New("semaphore: not held")
	// ErrLost: what Lease.Err wraps once a lease was lost (its node
	// deleted by another client, the session expired, the connection
	// closed).
	ErrLost = errors.New("semaphore: lease lost")
	// ErrClosed: the Semaphore was closed.
	ErrClosed = errors.New("semaphore: closed")
	// ErrInvalid: a bad argument.
	ErrInvalid = errors.New("semaphore: invalid argument")
	// ErrNotOwner: a call with IfOwner met a lease of another owner;
	// nothing was changed.
	ErrNotOwner = errors.New("semaphore: held by another owner")
)

// MaxLimit bounds a semaphore's limit (and so the permits of one
// acquisition).
const MaxLimit = 1 << 20

// maxValue bounds a lease's value well under ZooKeeper's jute.maxbuffer.
const maxValue = zkutil.MaxBuffer / 2

// errVanished: our waiter went away while we waited (the session expired
// and a new one began): the attempt starts over with a new waiter.
var errVanished = errors.New("semaphore: our waiter vanished")

// Semaphore is a counting semaphore under a ZooKeeper node, shared by
// every process that uses the same path: at most Limit permits are held
// at once, by leases. Each Acquire is one contender with its own waiter
// node, so two Acquires of one Semaphore, or of two Semaphores on one
// session, compete like Acquires of two processes. A Semaphore is safe for
// concurrent use.
type Semaphore struct {
	conn   *zk.Conn
	path   string
	queue  string // <path>/queue
	leases string // <path>/leases
	limit  int    // the limit the node gets when this Semaphore creates it
	acl    []zk.ACL
	value  []byte // lease data: the value, with the owner when there is one
	delay  time.Duration
	log    *slog.Logger
	bg     *holding.Background // ends waits and cleanups at Close
}

// New returns a Semaphore under the node p. When p does not exist, New
// creates it (and its missing parents) with limit permits; when it
// exists, the limit stored in it rules and limit is only used if the node
// has to be made again (after a Reaper deleted it while idle): read the
// stored limit with Limit, change it with SetLimit. It returns ErrInvalid
// for a nil conn, a path that is not absolute and clean, or a limit out
// of 1..MaxLimit, or a delay (WithDelay) out of 0..lockdelay.Max.
func New(conn *zk.Conn, p string, limit int, opts ...Option) (*Semaphore, error) {
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
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	if lockdelay.Validate(o.delay) != nil {
		return nil, fmt.Errorf("%w: delay %v: want 0 (none) to %v", ErrInvalid, o.delay, lockdelay.Max)
	}
	if len(o.value) > maxValue {
		return nil, fmt.Errorf("%w: value of %d bytes, at most %d", ErrInvalid, len(o.value), maxValue)
	}
	s := &Semaphore{conn: conn, path: p, queue: p + "/" + queueDir, leases: p + "/" + leasesDir, limit: limit,
		acl: zkutil.ACLOr(o.acl), value: zkutil.EncodeOwned(o.owner, o.value), delay: o.delay,
		log: o.logger.With("semaphore", p)}
	s.bg = holding.NewBackground(conn, s.log, ErrClosed, s.reapOnce)
	if err := s.ensure(); err != nil {
		return nil, err
	}
	return s, nil
}

func checkPath(p string) error {
	if p == "" || p[0] != '/' || p == "/" || path.Clean(p) != p {
		return fmt.Errorf("%w: path %q: want an absolute, clean ZooKeeper path other than /", ErrInvalid, p)
	}
	return nil
}

func checkLimit(n int) error {
	if n < 1 || n > MaxLimit {
		return fmt.Errorf("%w: limit %d: want 1 to %d", ErrInvalid, n, MaxLimit)
	}
	return nil
}

// ensure makes the semaphore's node, with its limit, and its queue and
// leases nodes, in one transaction, so that nobody sees a semaphore
// without them (a Reaper deletes the three in one transaction too).
func (s *Semaphore) ensure() error {
	if ok, _, err := s.conn.Exists(s.leases); err == nil && ok {
		return nil
	}
	if err := zkutil.EnsurePath(s.conn, path.Dir(s.path), s.acl); err != nil {
		return errfmt.Errorf("semaphore: %w", err)
	}
	res, err := s.conn.Multi(
		&zk.CreateRequest{Path: s.path, Data: encodeLimit(s.limit), Acl: s.acl},
		&zk.CreateRequest{Path: s.queue, Acl: s.acl},
		&zk.CreateRequest{Path: s.leases, Acl: s.acl},
	)
	err = zkutil.MultiError(res, err)
	if err == nil {
		return nil
	}
	if !errors.Is(err, zk.ErrNodeExists) {
		return errfmt.Errorf("semaphore: create %s: %w", s.path, err)
	}
	// The node exists (made by another, or by hand): complete it.
	for _, p := range []string{s.queue, s.leases} {
		if _, err := s.conn.Create(p, nil, 0, s.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return errfmt.Errorf("semaphore: create %s: %w", p, err)
		}
	}
	data, st, err := s.conn.Get(s.path)
	if err != nil {
		return errfmt.Errorf("semaphore: get %s: %w", s.path, err)
	}
	if _, ok := parseLimit(data); !ok {
		// An empty node made by someone else: give it our limit.
		if _, err := s.conn.Set(s.path, encodeLimit(s.limit), st.Version); err != nil && !errors.Is(err, zk.ErrBadVersion) {
			return errfmt.Errorf("semaphore: set %s: %w", s.path, err)
		}
	}
	return nil
}

// Path returns the semaphore's node.
func (s *Semaphore) Path() string { return s.path }

// Limit returns the semaphore's current limit, read from its node.
func (s *Semaphore) Limit(ctx context.Context) (int, error) { return Limit(ctx, s.conn, s.path) }

// Acquire waits until this contender holds n permits and returns its
// Lease. It creates an EPHEMERAL_SEQUENTIAL waiter <path>/queue/wait-
// <nonce>-<seq>; until it is the first waiter it watches only the waiter
// just before its own; first, it watches the leases (and the limit) until
// n permits are free, then takes them: one transaction creates its lease
// <path>/leases/lease-<n>-<nonce> and deletes its waiter, if the limit is
// still the one it read.
//
// Once its waiter is made, Acquire rides out connection losses (queueing
// again with a new waiter if the session expired) until ctx ends, the
// connection closes, or ZooKeeper has not answered for two minutes. When
// ctx ends first, Acquire deletes its waiter (and a lease whose grant it
// did not see) and returns ctx.Err(); so on any other error. A delete
// that fails, or a create whose answer was lost with the connection, is
// finished in the background (see Close). It returns ErrInvalid for n out
// of 1..MaxLimit, ErrOverLimit when n is above the limit, ErrClosed after
// Close; errors of ZooKeeper are wrapped.
func (s *Semaphore) Acquire(ctx context.Context, n int) (*Lease, error) {
	return s.acquire(ctx, n, false)
}

// TryAcquire takes n permits when they are free and nobody waits before
// it, and returns ErrNoPermit at once otherwise (its waiter deleted).
// Other errors as Acquire's.
func (s *Semaphore) TryAcquire(ctx context.Context, n int) (*Lease, error) {
	return s.acquire(ctx, n, true)
}

// Close ends the Acquires under way (they return ErrClosed, their waiters
// deleted) and stops the background removal of nodes left by failed
// calls (those nodes then stay until the session ends), waiting for it.
// Leases are not affected: each ends with its Release or loss. Close is
// idempotent.
func (s *Semaphore) Close() error {
	s.bg.Close()
	return nil
}
