package syncqueue

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
)

// DoubleBarrierReaper deletes the idle double barriers under a directory
// of them (the broker's doublebarriers/): a barrier node <dir>/<name> that
// has no participant, only perhaps a ready left by a round whose last
// participant did not Leave, and whose children did not change for a
// whole pass interval. The ready and the barrier node go in one multi, so
// a participant that arrives first keeps both; one that arrives after
// makes the barrier node again (Enter does). A DoubleBarrierReaper is used
// by one goroutine at a time.
type DoubleBarrierReaper struct {
	conn *zk.Conn
	dir  string
	seen map[string]int32 // idle at the last pass: name -> cversion
}

// NewDoubleBarrierReaper returns a reaper of the double barriers under
// dir, an absolute clean path.
func NewDoubleBarrierReaper(conn *zk.Conn, dir string) (*DoubleBarrierReaper, error) {
	if conn == nil {
		return nil, errors.New("syncqueue: nil zk conn")
	}
	if err := checkPath(dir); err != nil {
		return nil, errfmt.Errorf("syncqueue: %w", err)
	}
	return &DoubleBarrierReaper{conn: conn, dir: dir, seen: map[string]int32{}}, nil
}

// Reap is one pass: it deletes the barriers under dir that are idle and
// were idle, unchanged, at the previous pass, and returns how many. Call
// it periodically from one process (such as a leader): the interval
// between passes is how long a barrier stays idle before it goes.
func (r *DoubleBarrierReaper) Reap(ctx context.Context) (int, error) {
	names, _, err := r.conn.Children(r.dir)
	if errors.Is(err, zk.ErrNoNode) {
		clear(r.seen)
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("syncqueue: reap: children %s: %w", r.dir, err)
	}
	next := make(map[string]int32)
	deleted := 0
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		p := r.dir + "/" + n
		children, st, err := r.conn.Children(p)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return deleted, fmt.Errorf("syncqueue: reap: children %s: %w", p, err)
		}
		if len(children) > 1 || len(children) == 1 && children[0] != "ready" {
			continue // participants, or not a double barrier
		}
		if cv, was := r.seen[n]; !was || cv != st.Cversion {
			next[n] = st.Cversion
			continue
		}
		var ops []any
		if len(children) == 1 {
			ops = append(ops, &zk.DeleteRequest{Path: p + "/ready", Version: -1})
		}
		ops = append(ops, &zk.DeleteRequest{Path: p, Version: st.Version})
		_, err = r.conn.Multi(ops...)
		switch {
		case err == nil:
			deleted++
		case errors.Is(err, zk.ErrNotEmpty), errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
			// A participant came meanwhile, or someone else deleted it.
		default:
			return deleted, fmt.Errorf("syncqueue: reap: delete %s: %w", p, err)
		}
	}
	r.seen = next
	return deleted, nil
}
