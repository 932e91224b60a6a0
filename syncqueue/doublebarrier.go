package syncqueue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// Double barrier errors.
var (
	ErrAlreadyEntered = errors.New("syncqueue: double barrier already entered")
	ErrNotEntered     = errors.New("syncqueue: double barrier not entered")
)

// DoubleBarrier is one participant of the ZooKeeper recipes' double
// barrier: Enter returns once n participants have entered, Leave once all
// of them have left, so a group starts and ends a computation together.
//
// Layout under the barrier path B:
//
//	B/<id>@0000000007   one participant: EPHEMERAL_SEQUENTIAL
//	B/ready             created by the participant whose arrival makes n;
//	                    its data: the highest participant sequence counted
//
// Enter creates the participant node, sets an exists watch on B/ready and
// counts the participants; the n-th arrival creates B/ready, which wakes
// everyone else. Leave follows the recipe: the participant with the lowest
// sequence waits (exists watch) on the highest one; every other
// participant deletes its node and waits on the lowest. The lowest deletes
// B/ready and then its own node when it is the last one left, which
// releases the others. Every wait watches a single node, never the
// children of B (no herd on the parent).
//
// A barrier path serves one round at a time: a participant entering while
// the previous round is still leaving counts those participants and may
// find their B/ready. Use a fresh path per round (B/<round>) when rounds
// overlap. A round whose last participant left without Leave (crashed, or
// cancelled) leaves B/ready behind; B/ready records the highest sequence
// its round counted, so the next round's arrivals know it for stale (none
// of its participants is present) and wait for n of their own, then
// reuse it. DoubleBarrierReaper deletes idle barriers, stale ready and all.
//
// A DoubleBarrier is one participant: Enter and Leave are meant to be
// called in turn from one goroutine at a time (concurrent calls
// serialize).
type DoubleBarrier struct {
	conn *zk.Conn
	acl  []zk.ACL
	path string
	n    int
	id   string

	mu   sync.Mutex
	node string // our participant node's name while entered
}

// NewDoubleBarrier returns participant id of the double barrier at path
// for n participants, creating path and its parents as needed (with the
// ACL of zkqueue.WithACL among opts; the other options do not count). Errors:
// ErrBadID, a bad path or n < 1, or a ZooKeeper error.
func NewDoubleBarrier(conn *zk.Conn, path string, n int, id string, opts ...Option) (*DoubleBarrier, error) {
	if conn == nil {
		return nil, errors.New("syncqueue: nil zk conn")
	}
	if err := checkPath(path); err != nil {
		return nil, errfmt.Errorf("syncqueue: %w", err)
	}
	if n < 1 {
		return nil, errfmt.Errorf("syncqueue: double barrier of %d participants", n)
	}
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := zkutil.EnsurePath(conn, path, zkqueue.ACLOf(opts...)); err != nil {
		return nil, errfmt.Errorf("syncqueue: %w", err)
	}
	return &DoubleBarrier{conn: conn, acl: zkqueue.ACLOf(opts...), path: path, n: n, id: id}, nil
}

// Path returns the barrier node.
func (b *DoubleBarrier) Path() string { return b.path }

func (b *DoubleBarrier) wrap(op string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return errfmt.Errorf("syncqueue: double barrier %s %s as %s: %w", op, b.path, b.id, err)
}

func (b *DoubleBarrier) readyPath() string { return b.path + "/ready" }

type participant struct {
	name string
	seq  int32
}

// participants lists the participant nodes sorted by sequence, skipping
// ready and foreign children.
func (b *DoubleBarrier) participants() ([]participant, error) {
	children, _, err := b.conn.Children(b.path)
	if err != nil {
		return nil, fmt.Errorf("children %s: %w", b.path, err)
	}
	ps := make([]participant, 0, len(children))
	for _, c := range children {
		i := strings.LastIndexByte(c, '@')
		if i < 0 || checkID(c[:i]) != nil || len(c)-i-1 < 10 || c[i+1] == '+' {
			continue
		}
		seq, err := strconv.ParseInt(c[i+1:], 10, 32)
		if err != nil {
			continue
		}
		ps = append(ps, participant{c, int32(seq)})
	}
	slices.SortFunc(ps, func(a, b participant) int { return cmp.Compare(a.seq, b.seq) })
	return ps, nil
}

// deleteOwn deletes our participant node (gone already is fine).
func (b *DoubleBarrier) deleteOwn() error {
	err := b.conn.Delete(b.path+"/"+b.node, -1)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("delete %s/%s: %w", b.path, b.node, err)
	}
	return nil
}

// abort deletes our node after a cancelled or failed wait and forgets it.
func (b *DoubleBarrier) abort() {
	_ = b.deleteOwn()
	b.node = ""
}

// Enter joins the barrier and blocks until n participants have entered. If
// ctx ends first, or a ZooKeeper error interrupts the wait, Enter deletes
// the participant node and returns the error. Errors: ErrAlreadyEntered,
// a context error, or a ZooKeeper error.
func (b *DoubleBarrier) Enter(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.node != "" {
		return b.wrap("enter", ErrAlreadyEntered)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := b.create()
	if err != nil {
		return b.wrap("enter", err)
	}
	b.node = path.Base(p)
	for {
		// The watch is set before counting, so the n-th arrival's ready
		// cannot slip between the count and the wait.
		ok, _, w, err := b.conn.ExistsW(b.readyPath())
		if err != nil {
			b.abort()
			return b.wrap("enter", err)
		}
		round, version := int64(-1), int32(-1)
		if ok {
			data, st, err := b.conn.Get(b.readyPath())
			if errors.Is(err, zk.ErrNoNode) {
				continue // deleted since: look again
			}
			if err != nil {
				b.abort()
				return b.wrap("enter", err)
			}
			round, version = readyRound(data), st.Version
		}
		ps, err := b.participants()
		if err != nil {
			b.abort()
			return b.wrap("enter", err)
		}
		if ok && !staleReady(round, ps) {
			return nil
		}
		if len(ps) >= b.n {
			data := []byte(strconv.FormatInt(int64(ps[len(ps)-1].seq), 10))
			if ok {
				_, err = b.conn.Set(b.readyPath(), data, version) // a stale ready
			} else {
				_, err = b.conn.Create(b.readyPath(), data, 0, b.acl)
			}
			switch {
			case err == nil:
				return nil
			case errors.Is(err, zk.ErrNodeExists), errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoNode):
				continue // another arrival made it first: look again
			default:
				b.abort()
				return b.wrap("enter", err)
			}
		}
		select {
		case ev := <-w:
			if ev.Type == zk.EventNotWatching {
				b.abort()
				return b.wrap("enter", ev.Err)
			}
		case <-ctx.Done():
			b.abort()
			return ctx.Err()
		}
	}
}

// create creates our participant node, making the barrier node again if
// a reaper (DoubleBarrierReaper) deleted it meanwhile.
func (b *DoubleBarrier) create() (string, error) {
	name := b.path + "/" + b.id + "@"
	p, err := b.conn.Create(name, nil, zk.FlagEphemeral|zk.FlagSequence, b.acl)
	if errors.Is(err, zk.ErrNoNode) {
		if err := zkutil.EnsurePath(b.conn, b.path, b.acl); err != nil {
			return "", err
		}
		p, err = b.conn.Create(name, nil, zk.FlagEphemeral|zk.FlagSequence, b.acl)
	}
	return p, err
}

// readyRound returns the round a ready node's data records: the highest
// participant sequence counted when it was made; -1 for a ready without
// one (made by an earlier version), which is never stale.
func readyRound(data []byte) int64 {
	r, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil || r < 0 {
		return -1
	}
	return r
}

// staleReady reports whether a ready of round is left from a round that
// is over: none of its participants (sequence at most round) is present
// any more. That happens when the round's last participant left without
// Leave (its stream, process or session ended): its ready would otherwise
// let the next round's first arrival in alone.
func staleReady(round int64, ps []participant) bool {
	if round < 0 {
		return false
	}
	return !slices.ContainsFunc(ps, func(p participant) bool { return int64(p.seq) <= round })
}

// Key returns the participant's node while it is entered (from a
// successful Enter until Leave or Close), "" otherwise. Its deletion by
// anyone but this participant, or by the end of the session, means the
// participant was lost.
func (b *DoubleBarrier) Key() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.node == "" {
		return ""
	}
	return b.path + "/" + b.node
}

// ErrParticipantLost is what Held returns when the participant's node
// went while entered: deleted by another client, or with its session.
var ErrParticipantLost = errors.New("syncqueue: double barrier participant lost")

// Held waits while the entered participant's node exists, with an exists
// watch, until ctx ends (it returns ctx's error) or the node goes (an
// error wrapping ErrParticipantLost, with the cause when the watch ended
// with the session or the connection). Errors: ErrNotEntered, or a
// ZooKeeper error when it could not look.
func (b *DoubleBarrier) Held(ctx context.Context) error {
	node := b.Key()
	if node == "" {
		return ErrNotEntered
	}
	for {
		ok, _, w, err := b.conn.ExistsW(node)
		if err != nil {
			return b.wrap("held", err)
		}
		if !ok {
			return fmt.Errorf("%w: %s", ErrParticipantLost, node)
		}
		select {
		case ev := <-w:
			switch ev.Type {
			case zk.EventNodeDeleted:
				return fmt.Errorf("%w: %s", ErrParticipantLost, node)
			case zk.EventNotWatching:
				return fmt.Errorf("%w: %s: %w", ErrParticipantLost, node, ev.Err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close leaves at once, without waiting for the others: it deletes the
// participant node, if entered, as a participant that vanishes does. It
// is a no-op when not entered. Errors: a ZooKeeper error (the node then
// goes with the session).
func (b *DoubleBarrier) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.node == "" {
		return nil
	}
	err := b.deleteOwn()
	b.node = ""
	return b.wrap("close", err)
}

// Leave leaves the barrier and blocks until every participant has left. If
// ctx ends first, Leave deletes the participant node (which, for the
// lowest participant, releases the others early) and returns ctx.Err().
// After a ZooKeeper error the participant is still entered and Leave may
// be called again. Errors: ErrNotEntered, a context error, or a ZooKeeper
// error.
func (b *DoubleBarrier) Leave(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.node == "" {
		return b.wrap("leave", ErrNotEntered)
	}
	for {
		if err := ctx.Err(); err != nil {
			b.abort()
			return err
		}
		ps, err := b.participants()
		if err != nil {
			return b.wrap("leave", err)
		}
		if len(ps) == 0 {
			b.node = ""
			return nil
		}
		me := slices.IndexFunc(ps, func(p participant) bool { return p.name == b.node })
		if len(ps) == 1 && me == 0 {
			// Last one: clean up ready, then release the others.
			if err := b.conn.Delete(b.readyPath(), -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
				return b.wrap("leave", err)
			}
			if err := b.deleteOwn(); err != nil {
				return b.wrap("leave", err)
			}
			b.node = ""
			return nil
		}
		var target string
		if me == 0 {
			target = ps[len(ps)-1].name
		} else {
			if me > 0 {
				if err := b.deleteOwn(); err != nil {
					return b.wrap("leave", err)
				}
			}
			target = ps[0].name
		}
		ok, _, w, err := b.conn.ExistsW(b.path + "/" + target)
		if err != nil {
			return b.wrap("leave", err)
		}
		if !ok {
			continue
		}
		select {
		case ev := <-w:
			if ev.Type == zk.EventNotWatching {
				return b.wrap("leave", ev.Err)
			}
		case <-ctx.Done():
			b.abort()
			return ctx.Err()
		}
	}
}
