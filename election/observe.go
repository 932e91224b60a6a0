package election

import (
	"context"
	"errors"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// Leader returns the current leader: the candidate with the lowest
// sequence (it may not have noticed yet that it leads). It returns
// ErrNoLeader when the election has no candidate.
func (e *Election) Leader(ctx context.Context) (LeaderInfo, error) {
	for {
		if err := ctx.Err(); err != nil {
			return LeaderInfo{}, err
		}
		children, _, err := e.conn.Children(e.path)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return LeaderInfo{}, ErrNoLeader
		case err != nil:
			return LeaderInfo{}, errfmt.Errorf("election: leader: children %s: %w", e.path, err)
		}
		first := lowest(children)
		if first == "" {
			return LeaderInfo{}, ErrNoLeader
		}
		key := e.path + "/" + first
		data, st, err := e.conn.Get(key)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			continue // it just resigned: look again
		case err != nil:
			return LeaderInfo{}, errfmt.Errorf("election: leader: get %s: %w", key, err)
		}
		return leaderInfo(key, data, st), nil
	}
}

// Observe returns a stream of the election's leaders: the current one
// (once there is one), then each new leader and each new value a leader
// proclaims. It is watch-driven: it watches the leader's node only (the
// election's node only while there is no candidate), so observers, like
// candidates, are not woken by candidates that come and go behind the
// leader. A value is sent once the receiver takes it; a leader that comes
// and goes while the receiver is busy, or between ZooKeeper's
// notification and the next read, may be skipped, but the tokens of
// successive values never decrease. The channel closes when ctx ends or
// the Election closes; connection errors are retried meanwhile.
func (e *Election) Observe(ctx context.Context) <-chan LeaderInfo {
	ch := make(chan LeaderInfo)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.isClosed {
		close(ch)
		return ch
	}
	e.wg.Add(1)
	go e.observe(ctx, ch)
	return ch
}

func (e *Election) observe(ctx context.Context, ch chan<- LeaderInfo) {
	defer e.wg.Done()
	defer close(ch)
	var last LeaderInfo
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		info, w, err := e.leaderW()
		if err != nil {
			e.log.Debug("observe", "err", err)
			if !sleep(backoff, ctx.Done(), e.closed) {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		if info.Key != "" && (info.Key != last.Key || info.Version != last.Version) {
			select {
			case ch <- info:
				last = info
			case <-ctx.Done():
				return
			case <-e.closed:
				return
			}
		}
		select {
		case <-w:
		case <-ctx.Done():
			return
		case <-e.closed:
			return
		}
	}
}

// leaderW reads the leader with a watch that fires when it may change: on
// the leader's node (deleted, or a new value), on the election's children
// while it has none, on the election's node while it does not exist. Info
// is zero without a leader.
func (e *Election) leaderW() (LeaderInfo, <-chan zk.Event, error) {
	for {
		children, _, err := e.conn.Children(e.path)
		if errors.Is(err, zk.ErrNoNode) {
			ok, _, w, err := e.conn.ExistsW(e.path)
			if err != nil {
				return LeaderInfo{}, nil, errfmt.Errorf("election: observe: exists %s: %w", e.path, err)
			}
			if ok {
				continue // created meanwhile
			}
			return LeaderInfo{}, w, nil
		}
		if err != nil {
			return LeaderInfo{}, nil, errfmt.Errorf("election: observe: children %s: %w", e.path, err)
		}
		first := lowest(children)
		if first == "" {
			// Only now the children: a candidate's arrival matters.
			children, _, w, err := e.conn.ChildrenW(e.path)
			if errors.Is(err, zk.ErrNoNode) {
				continue
			}
			if err != nil {
				return LeaderInfo{}, nil, errfmt.Errorf("election: observe: children %s: %w", e.path, err)
			}
			if lowest(children) != "" {
				continue // one arrived meanwhile
			}
			return LeaderInfo{}, w, nil
		}
		key := e.path + "/" + first
		data, st, w, err := e.conn.GetW(key)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return LeaderInfo{}, nil, errfmt.Errorf("election: observe: get %s: %w", key, err)
		}
		return leaderInfo(key, data, st), w, nil
	}
}

// leaderInfo describes the candidate key from its data and Stat.
func leaderInfo(key string, data []byte, st *zk.Stat) LeaderInfo {
	owner, value := zkutil.DecodeOwned(data)
	return LeaderInfo{Key: key, Value: value, Owner: owner, Token: st.Czxid, Version: st.Version}
}
