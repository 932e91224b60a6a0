package election

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lockdelay"
)

// ErrNoCandidate: ProclaimKey or ResignKey named a candidate node that is
// gone (resigned, or its session ended) or never was one.
var ErrNoCandidate = errors.New("election: no such candidate")

// ProclaimKey sets the value of the leader whose candidate node is key
// (<path>/n-<seq>, as Key and LeaderInfo.Key name it) on behalf of that
// leader, from any session: for a service that proclaims for its clients.
// It keeps the candidate's owner (WithOwner). It returns ErrNoCandidate
// when the node is gone, ErrNotLeader when it is a candidate that does not
// lead; with IfOwner, ErrNotOwner when it is another owner's. The write is
// conditional on the version read with the owner (it is read again when
// another write came between), so an Election leading under key sees its
// next Proclaim fail (zk.ErrBadVersion): use one way or the other for a
// leadership.
//
// Leading is checked before the write; the check holds at the write,
// since the lowest candidate stays the lowest until its node goes, and a
// node gone meanwhile fails the write with ErrNoCandidate.
func ProclaimKey(ctx context.Context, conn *zk.Conn, key string, value []byte, opts ...KeyOption) error {
	o := keyOpts(opts)
	dir, name, err := splitKey(key)
	if err != nil {
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		children, _, err := conn.Children(dir)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return errfmt.Errorf("election: proclaim %s: %w", key, ErrNoCandidate)
		case err != nil:
			return errfmt.Errorf("election: proclaim: children %s: %w", dir, err)
		}
		if !slices.Contains(children, name) {
			return errfmt.Errorf("election: proclaim %s: %w", key, ErrNoCandidate)
		}
		data, st, err := conn.Get(key)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return errfmt.Errorf("election: proclaim %s: %w", key, ErrNoCandidate)
		case err != nil:
			return errfmt.Errorf("election: proclaim: get %s: %w", key, err)
		}
		owner, _ := zkutil.DecodeOwned(data)
		if !o.mayTouch(owner) {
			return errfmt.Errorf("election: proclaim %s: %w", key, ErrNotOwner)
		}
		if lowest(children) != name {
			return errfmt.Errorf("election: proclaim %s: %w", key, ErrNotLeader)
		}
		_, err = conn.Set(key, zkutil.EncodeOwned(owner, value), st.Version)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrBadVersion):
			continue // another proclaim came between: read the owner again
		case errors.Is(err, zk.ErrNoNode):
			return errfmt.Errorf("election: proclaim %s: %w", key, ErrNoCandidate)
		default:
			return errfmt.Errorf("election: proclaim %s: %w", key, err)
		}
	}
}

// ResignKey removes the candidate node key (leading or waiting), with its
// lock-delay marker (the next candidate leads at once), from any
// session: for a service that resigns for its clients. The Election that
// campaigned with it sees its Done close (or its Campaign fail with
// ErrNodeLost). It returns ErrNoCandidate when the node is gone already,
// so a retry after a lost answer sees ErrNoCandidate; with IfOwner,
// ErrNotOwner when the candidate is another owner's (it stays).
func ResignKey(ctx context.Context, conn *zk.Conn, key string, opts ...KeyOption) error {
	o := keyOpts(opts)
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, _, err := splitKey(key); err != nil {
		return err
	}
	for {
		version := int32(-1)
		if o.ifOwner {
			data, st, err := conn.Get(key)
			switch {
			case errors.Is(err, zk.ErrNoNode):
				return errfmt.Errorf("election: resign %s: %w", key, ErrNoCandidate)
			case err != nil:
				return errfmt.Errorf("election: resign: get %s: %w", key, err)
			}
			if owner, _ := zkutil.DecodeOwned(data); !o.mayTouch(owner) {
				return errfmt.Errorf("election: resign %s: %w", key, ErrNotOwner)
			}
			version = st.Version // the node whose owner was checked
		}
		// An explicit resignation frees the election at once: the
		// leader's lock-delay marker, if any, goes first (a marker whose
		// node lives holds nothing by itself).
		if err := lockdelay.Clear(conn, path.Dir(key), path.Base(key)); err != nil {
			return errfmt.Errorf("election: resign %s: %w", key, err)
		}
		err := conn.Delete(key, version)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrBadVersion):
			continue // a Proclaim came between: check again
		case errors.Is(err, zk.ErrNoNode):
			return errfmt.Errorf("election: resign %s: %w", key, ErrNoCandidate)
		default:
			return errfmt.Errorf("election: resign %s: %w", key, err)
		}
	}
}

// splitKey checks that key names a candidate node, <path>/n-<seq>, and
// returns the election's path and the node's name.
func splitKey(key string) (dir, name string, err error) {
	dir, name = path.Split(key)
	dir = path.Clean(dir)
	if key == "" || key[0] != '/' || path.Clean(key) != key || dir == "/" {
		return "", "", fmt.Errorf("%w: key %q: want <election path>/n-<sequence>", ErrInvalid, key)
	}
	if _, ok := parseSeq(name); !ok {
		return "", "", fmt.Errorf("%w: key %q: want <election path>/n-<sequence>", ErrInvalid, key)
	}
	return dir, name, nil
}
