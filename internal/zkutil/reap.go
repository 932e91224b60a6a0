package zkutil

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"
)

// IdleReaper deletes the idle children of a directory: the nodes under
// dir that have no children and whose child counter (cversion) has not
// moved between two passes, so a node is deleted only after it stayed
// empty for a whole pass interval. The delete is conditional on the
// version read, and ZooKeeper refuses to delete a node that has children:
// a contender whose create lands first keeps the node, and one whose
// create comes after the delete gets NoNode and makes the node again.
// An IdleReaper is used by one goroutine at a time.
type IdleReaper struct {
	conn *zk.Conn
	dir  string
	seen map[string]int32 // empty at the last pass: name -> cversion
}

// NewIdleReaper returns an IdleReaper of dir's children.
func NewIdleReaper(conn *zk.Conn, dir string) *IdleReaper {
	return &IdleReaper{conn: conn, dir: dir, seen: map[string]int32{}}
}

// Pass looks at every child of dir once (a missing dir has none) and
// deletes those found empty and unchanged since the last pass. It returns
// how many it deleted.
func (r *IdleReaper) Pass(ctx context.Context) (int, error) {
	names, _, err := r.conn.Children(r.dir)
	if errors.Is(err, zk.ErrNoNode) {
		clear(r.seen)
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("children %s: %w", r.dir, err)
	}
	next := make(map[string]int32)
	deleted := 0
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		p := r.dir + "/" + n
		ok, st, err := r.conn.Exists(p)
		if err != nil {
			return deleted, fmt.Errorf("exists %s: %w", p, err)
		}
		if !ok || st.NumChildren > 0 {
			continue
		}
		if cv, was := r.seen[n]; !was || cv != st.Cversion {
			next[n] = st.Cversion
			continue
		}
		err = r.conn.Delete(p, st.Version)
		switch {
		case err == nil:
			deleted++
		case errors.Is(err, zk.ErrNotEmpty), errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
			// A contender came meanwhile, or someone else deleted it.
		default:
			return deleted, fmt.Errorf("delete %s: %w", p, err)
		}
	}
	r.seen = next
	return deleted, nil
}
