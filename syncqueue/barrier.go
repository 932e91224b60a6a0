package syncqueue

import (
	"context"
	"errors"
	"path"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// Barrier is seed 001's barrier: while its node exists, Wait blocks; when
// the node is removed, every waiter proceeds. A Barrier is safe for
// concurrent use.
type Barrier struct {
	conn *zk.Conn
	acl  []zk.ACL
	path string
}

// NewBarrier returns the barrier whose node is path. It writes nothing:
// the barrier starts down (absent) unless its node exists already. Of
// opts, only zkqueue.WithACL counts: the ACL of the nodes Raise creates.
func NewBarrier(conn *zk.Conn, path string, opts ...Option) (*Barrier, error) {
	if conn == nil {
		return nil, errors.New("syncqueue: nil zk conn")
	}
	if err := checkPath(path); err != nil {
		return nil, errfmt.Errorf("syncqueue: %w", err)
	}
	return &Barrier{conn: conn, acl: zkqueue.ACLOf(opts...), path: path}, nil
}

// Path returns the barrier node.
func (b *Barrier) Path() string { return b.path }

func (b *Barrier) wrap(op string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return errfmt.Errorf("syncqueue: barrier %s %s: %w", op, b.path, err)
}

// Set raises the barrier: it creates the (persistent) barrier node and its
// missing parents. Setting a set barrier is a no-op.
func (b *Barrier) Set(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := zkutil.EnsurePath(b.conn, path.Dir(b.path), b.acl); err != nil {
		return b.wrap("set", err)
	}
	_, err := b.conn.Create(b.path, nil, 0, b.acl)
	if errors.Is(err, zk.ErrNodeExists) {
		err = nil
	}
	return b.wrap("set", err)
}

// Remove lowers the barrier, releasing every waiter. Removing a lowered
// barrier is a no-op.
func (b *Barrier) Remove(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := b.conn.Delete(b.path, -1)
	if errors.Is(err, zk.ErrNoNode) {
		err = nil
	}
	return b.wrap("remove", err)
}

// IsSet reports whether the barrier node exists.
func (b *Barrier) IsSet(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	ok, _, err := b.conn.Exists(b.path)
	return ok, b.wrap("is set", err)
}

// Wait returns nil once the barrier node does not exist, at once if it is
// not set. It waits on an exists watch, never polls, until ctx ends (then
// it returns ctx.Err()). Wait creates no node.
func (b *Barrier) Wait(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		ok, _, w, err := b.conn.ExistsW(b.path)
		if err != nil {
			return b.wrap("wait", err)
		}
		if !ok {
			return nil
		}
		select {
		case ev := <-w:
			if ev.Type == zk.EventNotWatching {
				return b.wrap("wait", ev.Err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
