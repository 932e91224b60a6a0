package semaphore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lockdelay"
)

// Holder describes a lease of a semaphore.
type Holder struct {
	// Key is the lease's node, <path>/leases/lease-<n>-<nonce>.
	Key string
	// Permits is the number of permits the lease holds.
	Permits int
	// Value is the holder's WithValue.
	Value []byte
	// Owner is the holder's WithOwner, "" without one.
	Owner string
	// Token is the lease's fencing token (Lease.Token).
	Token int64
	// Revoked says that a revocation was requested (the node's data
	// version is above 0).
	Revoked bool

	version int32
	data    []byte // the node's data as stored: owner and value
}

// Limit returns the limit stored in the semaphore at p. It wraps
// zk.ErrNoNode when p does not exist.
func Limit(ctx context.Context, conn *zk.Conn, p string) (int, error) {
	if err := checkPath(p); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	data, _, err := conn.Get(p)
	if err != nil {
		return 0, errfmt.Errorf("semaphore: get %s: %w", p, err)
	}
	n, ok := parseLimit(data)
	if !ok {
		return 0, fmt.Errorf("%w: %s holds no limit", ErrInvalid, p)
	}
	return n, nil
}

// SetLimit changes the limit of the semaphore at p to n, at once for
// every process using it. Raising it lets the first waiter take the new
// permits; lowering it takes nothing back: holders keep their leases
// until they release them (ask them with Revoke), and new grants wait
// until the permits in use are under the new limit. A waiter that asked
// for more than n permits fails with ErrOverLimit. It wraps zk.ErrNoNode
// when p does not exist, ErrInvalid for n out of 1..MaxLimit.
func SetLimit(ctx context.Context, conn *zk.Conn, p string, n int) error {
	if err := checkPath(p); err != nil {
		return err
	}
	if err := checkLimit(n); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := conn.Set(p, encodeLimit(n), -1); err != nil {
		return errfmt.Errorf("semaphore: set limit of %s: %w", p, err)
	}
	return nil
}

// Holders returns the leases of the semaphore at p, lowest token first;
// none when nobody holds a permit or p does not exist.
func Holders(ctx context.Context, conn *zk.Conn, p string) ([]Holder, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	dir := p + "/" + leasesDir
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		children, _, err := conn.Children(dir)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return nil, nil
		case err != nil:
			return nil, errfmt.Errorf("semaphore: children %s: %w", dir, err)
		}
		out, err := readHolders(conn, dir, leases(children))
		if errors.Is(err, zk.ErrNoNode) {
			continue // a holder just left: look again
		}
		if err != nil {
			return nil, err
		}
		slices.SortFunc(out, func(a, b Holder) int { return cmp.Compare(a.Token, b.Token) })
		return out, nil
	}
}

func readHolders(conn *zk.Conn, dir string, ls []lease) ([]Holder, error) {
	out := make([]Holder, 0, len(ls))
	for _, l := range ls {
		h, err := readHolder(conn, dir+"/"+l.name, l)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

func readHolder(conn *zk.Conn, key string, l lease) (Holder, error) {
	data, st, err := conn.Get(key)
	if err != nil {
		return Holder{}, errfmt.Errorf("semaphore: get %s: %w", key, err)
	}
	owner, value := zkutil.DecodeOwned(data)
	return Holder{Key: key, Permits: l.permits, Value: value, Owner: owner, Token: st.Czxid,
		Revoked: st.Version > 0, version: st.Version, data: data}, nil
}

// Revoke asks every holder of the semaphore at p to give its permits
// back: each holder's Lease.Revoked closes; each decides when to Release.
// The request is a write of the lease's node with its data unchanged (the
// data version counts the requests). It returns the holders asked, lowest
// token first, or ErrNotHeld when nobody holds a permit. With IfOwner, it
// asks nobody and returns ErrNotOwner when a holder is another owner's.
func Revoke(ctx context.Context, conn *zk.Conn, p string, opts ...KeyOption) ([]Holder, error) {
	o := keyOpts(opts)
	for {
		hs, err := Holders(ctx, conn, p)
		if err != nil {
			return nil, err
		}
		if len(hs) == 0 {
			return nil, errfmt.Errorf("semaphore: revoke %s: %w", p, ErrNotHeld)
		}
		for _, h := range hs {
			if !o.mayTouch(h.Owner) {
				return nil, errfmt.Errorf("semaphore: revoke %s: %w", p, ErrNotOwner)
			}
		}
		var asked []Holder
		for _, h := range hs {
			ok, err := ask(conn, h)
			if err != nil {
				return nil, err
			}
			if ok {
				h.Revoked = true
				asked = append(asked, h)
			}
		}
		if len(asked) > 0 {
			return asked, nil
		}
	}
}

// ask writes the lease's node with its data unchanged, at the version
// read: a node that changed hands since is another node (names are never
// reused), so the owner checked is the owner asked. false when the lease
// is gone.
func ask(conn *zk.Conn, h Holder) (bool, error) {
	_, err := conn.Set(h.Key, h.data, h.version)
	switch {
	case err == nil, errors.Is(err, zk.ErrBadVersion):
		// Written since we read it: by another revocation, the only
		// writer of a lease.
		return true, nil
	case errors.Is(err, zk.ErrNoNode):
		return false, nil // released meanwhile
	}
	return false, errfmt.Errorf("semaphore: revoke %s: %w", h.Key, err)
}

// RevokeKey asks the holder of the lease key to give its permits back,
// as Revoke does, and returns it. It returns ErrNotHeld when the lease is
// gone, ErrInvalid when key is not a lease's path; with IfOwner,
// ErrNotOwner when the lease is another owner's (it is not asked).
func RevokeKey(ctx context.Context, conn *zk.Conn, key string, opts ...KeyOption) (Holder, error) {
	o := keyOpts(opts)
	l, err := checkKey(key)
	if err != nil {
		return Holder{}, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return Holder{}, err
		}
		h, err := readHolder(conn, key, l)
		if errors.Is(err, zk.ErrNoNode) {
			return Holder{}, errfmt.Errorf("semaphore: revoke %s: %w", key, ErrNotHeld)
		}
		if err != nil {
			return Holder{}, err
		}
		if !o.mayTouch(h.Owner) {
			return Holder{}, errfmt.Errorf("semaphore: revoke %s: %w", key, ErrNotOwner)
		}
		ok, err := ask(conn, h)
		if err != nil {
			return Holder{}, err
		}
		if ok {
			h.Revoked = true
			return h, nil
		}
	}
}

// ReleaseKey deletes the lease key when its fencing token is token: the
// release of a lease by someone other than its Lease (a service that
// holds permits on its clients' behalf). The lease's holder sees Lost
// close. It returns ErrNotHeld when the lease is gone or has another
// token, ErrInvalid when key is not a lease's path; with IfOwner,
// ErrNotOwner when the lease is another owner's (it stays).
func ReleaseKey(ctx context.Context, conn *zk.Conn, key string, token int64, opts ...KeyOption) error {
	o := keyOpts(opts)
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := checkKey(key); err != nil {
		return err
	}
	data, st, err := conn.Get(key)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return errfmt.Errorf("semaphore: release %s token %d: %w", key, token, ErrNotHeld)
	case err != nil:
		return errfmt.Errorf("semaphore: get %s: %w", key, err)
	case st.Czxid != token:
		return errfmt.Errorf("semaphore: release %s token %d: %w", key, token, ErrNotHeld)
	}
	if owner, _ := zkutil.DecodeOwned(data); !o.mayTouch(owner) {
		return errfmt.Errorf("semaphore: release %s: %w", key, ErrNotOwner)
	}
	// An explicit release frees the permits at once: the lease's
	// lock-delay marker, if any, goes first (a marker whose lease lives
	// keeps nothing by itself).
	if err := lockdelay.Clear(conn, path.Dir(key), path.Base(key)); err != nil {
		return errfmt.Errorf("semaphore: release %s: %w", key, err)
	}
	// Lease names are never reused (the nonce): the node checked is the
	// one deleted.
	err = conn.Delete(key, -1)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return errfmt.Errorf("semaphore: release %s token %d: %w", key, token, ErrNotHeld)
	case err != nil:
		return errfmt.Errorf("semaphore: release %s: %w", key, err)
	}
	return nil
}

// checkKey checks that key is a lease's path, <path>/leases/lease-<n>-<nonce>.
func checkKey(key string) (lease, error) {
	if err := checkPath(key); err != nil {
		return lease{}, err
	}
	l, ok := parseLease(path.Base(key))
	if !ok || path.Base(path.Dir(key)) != leasesDir || strings.Count(key, "/") < 3 {
		return lease{}, fmt.Errorf("%w: %q is not a lease", ErrInvalid, key)
	}
	return l, nil
}

// Reaper deletes the idle semaphores under a directory of semaphores
// (the broker's semaphores/): a semaphore <dir>/<name> whose queue and
// leases stayed empty, unchanged, for a whole pass interval. Its three
// nodes go in one transaction, which ZooKeeper refuses if a waiter or a
// lease appeared meanwhile; an Acquire that then finds the semaphore gone
// makes it again, with its Semaphore's limit. A Reaper is used by one
// goroutine at a time.
type Reaper struct {
	conn *zk.Conn
	dir  string
	seen map[string][2]int32 // idle at the last pass: name -> cversions of queue and leases
}

// NewReaper returns a Reaper of the semaphores under dir. It returns
// ErrInvalid for a nil conn or a path that is not absolute and clean.
func NewReaper(conn *zk.Conn, dir string) (*Reaper, error) {
	if conn == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalid)
	}
	if err := checkPath(dir); err != nil {
		return nil, err
	}
	return &Reaper{conn: conn, dir: dir, seen: map[string][2]int32{}}, nil
}

// Reap is one pass: it deletes the semaphores under dir that are idle and
// were already idle, unchanged, at the previous pass, and returns how
// many. Call it periodically (from one process, such as a leader).
func (r *Reaper) Reap(ctx context.Context) (int, error) {
	names, _, err := r.conn.Children(r.dir)
	if errors.Is(err, zk.ErrNoNode) {
		clear(r.seen)
		return 0, nil
	}
	if err != nil {
		return 0, errfmt.Errorf("semaphore: reap: children %s: %w", r.dir, err)
	}
	next := make(map[string][2]int32)
	deleted := 0
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		p := r.dir + "/" + name
		cv, idle, err := r.idle(p)
		if err != nil {
			return deleted, err
		}
		if !idle {
			continue
		}
		if was, ok := r.seen[name]; !ok || was != cv {
			next[name] = cv
			continue
		}
		res, err := r.conn.Multi(
			&zk.DeleteRequest{Path: p + "/" + queueDir, Version: -1},
			&zk.DeleteRequest{Path: p + "/" + leasesDir, Version: -1},
			&zk.DeleteRequest{Path: p, Version: -1},
		)
		err = zkutil.MultiError(res, err)
		switch {
		case err == nil:
			deleted++
		case errors.Is(err, zk.ErrNotEmpty), errors.Is(err, zk.ErrNoNode):
			// A contender came meanwhile, or someone else deleted it.
		default:
			return deleted, errfmt.Errorf("semaphore: reap %s: %w", p, err)
		}
	}
	r.seen = next
	return deleted, nil
}

// idle reports whether the semaphore p has no waiter, no lease and no
// other child, with the cversions of its queue and leases.
func (r *Reaper) idle(p string) ([2]int32, bool, error) {
	var cv [2]int32
	ok, st, err := r.conn.Exists(p)
	if err != nil {
		return cv, false, errfmt.Errorf("semaphore: reap: exists %s: %w", p, err)
	}
	if !ok || st.NumChildren != 2 {
		return cv, false, nil
	}
	for i, d := range []string{queueDir, leasesDir} {
		ok, st, err := r.conn.Exists(p + "/" + d)
		if err != nil {
			return cv, false, errfmt.Errorf("semaphore: reap: exists %s/%s: %w", p, d, err)
		}
		if !ok || st.NumChildren > 0 {
			return cv, false, nil
		}
		cv[i] = st.Cversion
	}
	return cv, true, nil
}
