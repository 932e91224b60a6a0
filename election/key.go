package election

import (
	"context"
	"errors"
	"fmt"
	"path"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
)

// ErrNoCandidate: ProclaimKey or ResignKey named a candidate node that is
// gone (resigned, or its session ended) or never was one.
var ErrNoCandidate = errors.New("election: no such candidate")

// ProclaimKey sets the value of the leader whose candidate node is key
// (<path>/n-<seq>, as Key and LeaderInfo.Key name it) on behalf of that
// leader, from any session: for a service that proclaims for its clients.
// It returns ErrNoCandidate when the node is gone, ErrNotLeader when it is
// a candidate that does not lead. The write is unconditional on the
// node's version, so an Election leading under key sees its next Proclaim
// fail (zk.ErrBadVersion): use one way or the other for a leadership.
//
// Leading is checked before the write; the check holds at the write,
// since the lowest candidate stays the lowest until its node goes, and a
// node gone meanwhile fails the write with ErrNoCandidate.
func ProclaimKey(ctx context.Context, conn *zk.Conn, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dir, name, err := splitKey(key)
	if err != nil {
		return err
	}
	children, _, err := conn.Children(dir)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return errfmt.Errorf("election: proclaim %s: %w", key, ErrNoCandidate)
	case err != nil:
		return errfmt.Errorf("election: proclaim: children %s: %w", dir, err)
	}
	first := lowest(children)
	if first != name {
		for _, c := range children {
			if c == name {
				return errfmt.Errorf("election: proclaim %s: %w", key, ErrNotLeader)
			}
		}
		return errfmt.Errorf("election: proclaim %s: %w", key, ErrNoCandidate)
	}
	if _, err := conn.Set(key, value, -1); err != nil {
		if errors.Is(err, zk.ErrNoNode) {
			return errfmt.Errorf("election: proclaim %s: %w", key, ErrNoCandidate)
		}
		return errfmt.Errorf("election: proclaim %s: %w", key, err)
	}
	return nil
}

// ResignKey removes the candidate node key (leading or waiting) from any
// session: for a service that resigns for its clients. The Election that
// campaigned with it sees its Done close (or its Campaign fail with
// ErrNodeLost). It returns ErrNoCandidate when the node is gone already,
// so a retry after a lost answer sees ErrNoCandidate.
func ResignKey(ctx context.Context, conn *zk.Conn, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, _, err := splitKey(key); err != nil {
		return err
	}
	if err := conn.Delete(key, -1); err != nil {
		if errors.Is(err, zk.ErrNoNode) {
			return errfmt.Errorf("election: resign %s: %w", key, ErrNoCandidate)
		}
		return errfmt.Errorf("election: resign %s: %w", key, err)
	}
	return nil
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
