package syncqueue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// Status is what a member knows of its group.
type Status struct {
	Joined  int  // members present (ephemeral member nodes)
	Members int  // the group size the queue waits for
	Open    bool // the group of this membership has opened
}

// Membership is one member of a queue's group: an ephemeral node
// <path>/members/<id> on the Queue's session, and one goroutine that waits
// for the group to open. The goroutine ends when the group opens, when the
// membership fails, or on Leave. A Membership is safe for concurrent use.
type Membership struct {
	q     *Queue
	id    string
	node  string
	czxid int64 // identifies our incarnation of node

	opened chan struct{} // closed when the group opened
	done   chan struct{} // closed when the watcher goroutine ended
	stop   context.CancelFunc

	mu   sync.Mutex
	err  error
	left bool
}

// Join adds memberID to the group and waits until the group is complete
// (the queue opens) or ctx ends. If ctx ends first, Join removes the
// member node it created and returns ctx.Err(). The caller must Leave the
// returned Membership when done; the queue stays open when members leave.
//
// Errors: ErrBadID, ErrGroupFull (the queue is already open, or the group
// completed without this member), ErrDuplicateMember, a context error, or
// a ZooKeeper error.
func (q *Queue) Join(ctx context.Context, memberID string) (*Membership, error) {
	m, err := q.JoinAsync(ctx, memberID)
	if err != nil {
		return nil, err
	}
	if err := m.Wait(ctx); err != nil {
		_ = m.Leave(context.WithoutCancel(ctx))
		return nil, err
	}
	return m, nil
}

// JoinAsync adds memberID to the group and returns as soon as its member
// node exists, without waiting for the group to complete: Opened, Wait and
// Progress tell when it does. If this member completes the group, the
// queue is open when JoinAsync returns. The caller must call Leave, which
// also stops the membership's goroutine.
//
// Errors: as for Join. If ctx ends during JoinAsync, the member node is
// removed.
func (q *Queue) JoinAsync(ctx context.Context, memberID string) (*Membership, error) {
	if err := checkID(memberID); err != nil {
		return nil, q.wrap("join", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// An open queue admits nobody: fail before creating anything.
	if ok, _, err := q.conn.Exists(q.startPath()); err != nil {
		return nil, q.wrap("join", err)
	} else if ok {
		return nil, q.wrap("join", fmt.Errorf("%w: queue is open", ErrGroupFull))
	}
	m := &Membership{
		q:      q,
		id:     memberID,
		node:   q.membersPath() + "/" + memberID,
		opened: make(chan struct{}),
		done:   make(chan struct{}),
	}
	_, err := q.conn.Create(m.node, nil, zk.FlagEphemeral, q.acl)
	if errors.Is(err, zk.ErrNodeExists) {
		return nil, q.wrap("join", fmt.Errorf("%w: %s", ErrDuplicateMember, memberID))
	}
	if err != nil {
		return nil, q.wrap("join", fmt.Errorf("create %s: %w", m.node, err))
	}
	ok, stat, err := q.conn.Exists(m.node)
	switch {
	case err != nil:
		err = fmt.Errorf("exists %s: %w", m.node, err)
	case !ok:
		err = fmt.Errorf("member node %s vanished: %w", m.node, zk.ErrNoNode)
	default:
		m.czxid = stat.Czxid
		if err = ctx.Err(); err == nil {
			err = q.complete()
		}
	}
	var w <-chan zk.Event
	opened := false
	if err == nil {
		opened, w, err = m.check()
	}
	if err != nil {
		_ = m.removeNode()
		return nil, q.wrap("join", err)
	}
	if opened {
		close(m.opened)
		close(m.done)
		m.stop = func() {}
		return m, nil
	}
	wctx, cancel := context.WithCancel(context.Background())
	m.stop = cancel
	go m.run(wctx, w)
	return m, nil
}

// check looks at the start node. It returns opened when start names this
// member's group, ErrGroupFull (after removing the member node) when start
// names a group without it, and otherwise the exists watch on start.
func (m *Membership) check() (opened bool, w <-chan zk.Event, err error) {
	conn, start := m.q.conn, m.q.startPath()
	for {
		ok, _, w, err := conn.ExistsW(start)
		if err != nil {
			return false, nil, fmt.Errorf("exists %s: %w", start, err)
		}
		if !ok {
			return false, w, nil
		}
		data, _, err := conn.Get(start)
		if errors.Is(err, zk.ErrNoNode) {
			continue // reset meanwhile
		}
		if err != nil {
			return false, nil, fmt.Errorf("get %s: %w", start, err)
		}
		if inGroup(data, m.id) {
			return true, nil, nil
		}
		if err := m.removeNode(); err != nil {
			return false, nil, err
		}
		return false, nil, fmt.Errorf("%w: the group completed without %s", ErrGroupFull, m.id)
	}
}

// run waits for the start node. It is the membership's only goroutine.
func (m *Membership) run(ctx context.Context, w <-chan zk.Event) {
	defer close(m.done)
	for {
		select {
		case ev := <-w:
			if ev.Type == zk.EventNotWatching {
				m.fail(fmt.Errorf("watch %s: %w", m.q.startPath(), ev.Err))
				return
			}
		case <-ctx.Done():
			return
		}
		backoff := 50 * time.Millisecond
		for {
			opened, w2, err := m.check()
			if err == nil {
				if opened {
					close(m.opened)
					return
				}
				w = w2
				break
			}
			if !errors.Is(err, zk.ErrConnectionClosed) {
				m.fail(err)
				return
			}
			// Disconnected: the client reconnects within the session
			// timeout, or the session expires and the next try says so.
			select {
			case <-time.After(backoff):
				backoff = min(2*backoff, time.Second)
			case <-ctx.Done():
				return
			}
		}
	}
}

func (m *Membership) fail(err error) {
	m.mu.Lock()
	if m.err == nil {
		m.err = m.q.wrap("member "+m.id, err)
	}
	m.mu.Unlock()
}

// removeNode deletes the member node if it is still this membership's (not
// a node of the same id created by a later session).
func (m *Membership) removeNode() error {
	ok, stat, err := m.q.conn.Exists(m.node)
	if err != nil {
		return fmt.Errorf("exists %s: %w", m.node, err)
	}
	if !ok || stat.Czxid != m.czxid {
		return nil
	}
	if err := m.q.conn.Delete(m.node, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("delete %s: %w", m.node, err)
	}
	return nil
}

// ID returns the member id.
func (m *Membership) ID() string { return m.id }

// Opened returns a channel closed when the group of this membership has
// opened. It stays open forever if the membership fails or leaves first;
// select on Done too.
func (m *Membership) Opened() <-chan struct{} { return m.opened }

// Done returns a channel closed when the membership stops waiting: the
// group opened, the membership failed (see Err), or it left.
func (m *Membership) Done() <-chan struct{} { return m.done }

// Err returns why the membership stopped waiting without its group
// opening: ErrGroupFull, a lost session (zk.ErrSessionExpired,
// zk.ErrClosing) or ErrLeft; nil while waiting and after opening.
func (m *Membership) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	if m.left && !m.isOpened() {
		return ErrLeft
	}
	return nil
}

func (m *Membership) isOpened() bool {
	select {
	case <-m.opened:
		return true
	default:
		return false
	}
}

// Wait blocks until the group of this membership opens (nil), the
// membership fails or leaves (Err), or ctx ends (ctx.Err(); the member
// stays in the group: call Leave to give up the place).
func (m *Membership) Wait(ctx context.Context) error {
	select {
	case <-m.opened:
		return nil
	case <-m.done:
		if m.isOpened() {
			return nil
		}
		return m.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Progress returns the group's status as soon as it differs from last:
// at once for the zero Status, then whenever a member joins or leaves and
// when the group opens. It waits on a children watch of the members node
// and on the membership itself, never polls. A broker streaming "joined k
// of N", then "open", calls it in a loop.
//
// Errors: ErrLeft after Leave, the membership's Err if it stopped without
// opening, ctx.Err(), or a ZooKeeper error.
func (m *Membership) Progress(ctx context.Context, last Status) (Status, error) {
	for {
		if err := ctx.Err(); err != nil {
			return Status{}, err
		}
		m.mu.Lock()
		left := m.left
		m.mu.Unlock()
		if left {
			return Status{}, ErrLeft
		}
		opened := m.isOpened()
		if !opened {
			select {
			case <-m.done:
				return Status{}, m.Err()
			default:
			}
		}
		children, _, w, err := m.q.conn.ChildrenW(m.q.membersPath())
		if err != nil {
			return Status{}, m.q.wrap("progress", err)
		}
		st := Status{Joined: len(children), Members: m.q.members, Open: opened}
		if st != last {
			return st, nil
		}
		openedc, donec := m.opened, m.done
		if opened {
			openedc, donec = nil, nil
		}
		select {
		case ev := <-w:
			if ev.Type == zk.EventNotWatching {
				return Status{}, m.q.wrap("progress", ev.Err)
			}
		case <-openedc:
		case <-donec:
		case <-ctx.Done():
			return Status{}, ctx.Err()
		}
	}
}

// Leave gives up the membership: it stops the membership's goroutine and
// deletes the member node. Before the group is complete this frees the
// place; after, the queue stays open. Leave waits for the goroutine unless
// ctx ends first; the node is deleted either way. Leaving twice is a no-op.
func (m *Membership) Leave(ctx context.Context) error {
	m.mu.Lock()
	if m.left {
		m.mu.Unlock()
		return nil
	}
	m.left = true
	m.mu.Unlock()
	m.stop()
	select {
	case <-m.done:
	case <-ctx.Done():
	}
	return m.q.wrap("leave "+m.id, m.removeNode())
}
