package lock

import (
	"context"
	"errors"
	"fmt"
	"path"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lockdelay"
)

// Holder describes a holder of a lock.
type Holder struct {
	// Key is the holder's node, <path>/<kind>-<nonce>-<seq>.
	Key string
	// Value is the holder's WithValue.
	Value []byte
	// Owner is the holder's WithOwner, "" without one.
	Owner string
	// Token is the holder's fencing token (Grant.Token).
	Token int64
	// Revoked says that a revocation was requested (the node's data
	// version is above 0).
	Revoked bool
	// Shared says that the holder is a reader of an RWMutex, maybe one
	// of several.
	Shared bool

	version int32
	data    []byte // the node's data as stored: owner and value
}

// Current returns the holder of the lock at p: the holder of a Mutex or
// the writer of an RWMutex, or the first of an RWMutex's readers (Holders
// returns them all). It may not have noticed yet that it holds. It
// returns ErrNotHeld when nobody holds the lock, or p does not exist.
func Current(ctx context.Context, conn *zk.Conn, p string) (Holder, error) {
	hs, err := Holders(ctx, conn, p)
	if err != nil {
		return Holder{}, err
	}
	return hs[0], nil
}

// Holders returns the holders of the lock at p, lowest node first: one
// for a Mutex or a writer, every reader sharing an RWMutex. It returns
// ErrNotHeld when nobody holds the lock, or p does not exist.
func Holders(ctx context.Context, conn *zk.Conn, p string) ([]Holder, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		children, _, err := conn.Children(p)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return nil, errfmt.Errorf("lock: %s: %w", p, ErrNotHeld)
		case err != nil:
			return nil, errfmt.Errorf("lock: children %s: %w", p, err)
		}
		nodes := holders(parseAll(children))
		if len(nodes) == 0 {
			return nil, errfmt.Errorf("lock: %s: %w", p, ErrNotHeld)
		}
		out, err := readHolders(conn, p, nodes)
		if errors.Is(err, zk.ErrNoNode) {
			continue // a holder just left: look again
		}
		if err != nil {
			return nil, err
		}
		return out, nil
	}
}

func readHolders(conn *zk.Conn, p string, nodes []node) ([]Holder, error) {
	out := make([]Holder, 0, len(nodes))
	for _, n := range nodes {
		key := p + "/" + n.name
		data, st, err := conn.Get(key)
		if err != nil {
			return nil, errfmt.Errorf("lock: get %s: %w", key, err)
		}
		owner, value := zkutil.DecodeOwned(data)
		out = append(out, Holder{Key: key, Value: value, Owner: owner, Token: st.Czxid, Revoked: st.Version > 0,
			Shared: !n.exclusive(), version: st.Version, data: data})
	}
	return out, nil
}

// Revoke asks the holders of the lock at p to release it (seed 001's
// revocable lock): the holder of a Mutex, the writer of an RWMutex, or
// every reader sharing it. Each holder's Grant.Revoked closes; each holder
// decides when to Unlock. The request is a write of the holder's node,
// its data unchanged (the data version counts the requests). Revoke
// returns the first holder, with Revoked set, or ErrNotHeld when nobody
// holds the lock. With IfOwner, it asks nobody and returns ErrNotOwner
// when a holder is another owner's.
func Revoke(ctx context.Context, conn *zk.Conn, p string, opts ...KeyOption) (Holder, error) {
	o := keyOpts(opts)
	for {
		hs, err := Holders(ctx, conn, p)
		if err != nil {
			return Holder{}, err
		}
		for _, h := range hs {
			if !o.mayTouch(h.Owner) {
				return Holder{}, errfmt.Errorf("lock: revoke %s: %w", p, ErrNotOwner)
			}
		}
		asked := false
		for _, h := range hs {
			// At the version read: a node that changed hands since is
			// another node (names are never reused), so the owner
			// checked is the owner asked.
			_, err := conn.Set(h.Key, h.data, h.version)
			switch {
			case err == nil, errors.Is(err, zk.ErrBadVersion):
				// Written since we read it: by another revocation, the
				// only writer of a lock node.
				asked = true
			case errors.Is(err, zk.ErrNoNode):
				// Released meanwhile.
			default:
				return Holder{}, errfmt.Errorf("lock: revoke %s: %w", h.Key, err)
			}
		}
		if asked {
			h := hs[0]
			h.Revoked = true
			return h, nil
		}
	}
}

// UnlockKey deletes the grant's node key when its fencing token is token,
// with its lock-delay marker (the lock is free at once):
// the release of a grant by someone other than its Grant (a service that
// holds locks on its clients' behalf). The grant's holder sees Lost close.
// It returns ErrNotHeld when the node is gone or has another token, and
// ErrInvalid when key is not a lock node's path; with IfOwner,
// ErrNotOwner when the node is another owner's (it stays).
func UnlockKey(ctx context.Context, conn *zk.Conn, key string, token int64, opts ...KeyOption) error {
	o := keyOpts(opts)
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkPath(key); err != nil {
		return err
	}
	if _, ok := parseNode(path.Base(key)); !ok {
		return fmt.Errorf("%w: %q is not a lock node", ErrInvalid, key)
	}
	data, st, err := conn.Get(key)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return errfmt.Errorf("lock: unlock %s token %d: %w", key, token, ErrNotHeld)
	case err != nil:
		return errfmt.Errorf("lock: get %s: %w", key, err)
	case st.Czxid != token:
		return errfmt.Errorf("lock: unlock %s token %d: %w", key, token, ErrNotHeld)
	}
	if owner, _ := zkutil.DecodeOwned(data); !o.mayTouch(owner) {
		return errfmt.Errorf("lock: unlock %s: %w", key, ErrNotOwner)
	}
	// An explicit release frees the lock at once: the grant's lock-delay
	// marker, if any, goes first (a marker whose node lives holds
	// nothing by itself).
	if err := lockdelay.Clear(conn, path.Dir(key), path.Base(key)); err != nil {
		return errfmt.Errorf("lock: unlock %s: %w", key, err)
	}
	// Node names are never reused (the nonce, the sequence): the node
	// checked is the one deleted.
	err = conn.Delete(key, -1)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return errfmt.Errorf("lock: unlock %s token %d: %w", key, token, ErrNotHeld)
	case err != nil:
		return errfmt.Errorf("lock: unlock %s: %w", key, err)
	}
	return nil
}

// Reaper deletes the idle locks under a directory of locks (the broker's
// locks/): a lock's node <dir>/<name> that has had no contender for a
// whole pass interval, so lock names do not leave nodes behind forever.
// Mutex and RWMutex make a deleted lock node again when their next create
// finds it gone (unless WithoutCreate), so a contender racing the reaper
// still gets its lock. A Reaper is used by one goroutine at a time.
type Reaper struct{ r *zkutil.IdleReaper }

// NewReaper returns a Reaper of the locks under dir. It returns ErrInvalid
// for a path that is not absolute and clean.
func NewReaper(conn *zk.Conn, dir string) (*Reaper, error) {
	if conn == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalid)
	}
	if err := checkPath(dir); err != nil {
		return nil, err
	}
	return &Reaper{r: zkutil.NewIdleReaper(conn, dir)}, nil
}

// Reap is one pass: it deletes the lock nodes under dir that are empty
// and were already empty, unchanged, at the previous pass, and returns
// how many. Call it periodically (from one process, such as a leader):
// the interval between passes is how long a lock stays idle before it is
// deleted.
func (r *Reaper) Reap(ctx context.Context) (int, error) {
	n, err := r.r.Pass(ctx)
	if err != nil {
		return n, fmt.Errorf("lock: reap: %w", err)
	}
	return n, nil
}
