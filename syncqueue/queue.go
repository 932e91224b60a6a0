package syncqueue

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sync"

	"github.com/go-zookeeper/zk"
	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// Message is a message taken from or peeked at in a queue.
type Message = zkqueue.Message

// Sentinel errors of the gate and the group, wrapped with the operation
// and path; use errors.Is. The queue's own (zkqueue.ErrEmpty,
// zkqueue.ErrTooLarge, ...) are package zkqueue's.
var (
	// ErrNotOpen: TryDequeue before the group is complete (no start node).
	ErrNotOpen = errors.New("syncqueue: queue is not open")
	// ErrGroupFull: Join of a queue whose group is complete (open), or of a
	// member that arrived too late to be part of the group that opened.
	ErrGroupFull = errors.New("syncqueue: group is full")
	// ErrDuplicateMember: Join with an id that is already a member (a
	// member node of that name exists, possibly of a session that has not
	// expired yet).
	ErrDuplicateMember = errors.New("syncqueue: duplicate member id")
	// ErrBadID: a member or participant id outside [A-Za-z0-9._-]{1,200},
	// or "." or "..".
	ErrBadID = errors.New("syncqueue: bad id")
	// ErrLeft: Wait or Progress of a Membership that has left.
	ErrLeft = errors.New("syncqueue: membership left")
)

// MaxMembers bounds the group size: the start node records the group's
// member ids and must stay well under jute.maxbuffer.
const MaxMembers = 1000

// Option configures a Queue's messages: any of package zkqueue's options
// (zkqueue.WithMaxPayload, ...). With zkqueue.WithoutCreate, New only
// reads: the queue's nodes (path, path/items, path/members) must exist
// already. A process that also deletes queues needs it, so that a Queue
// opened while its queue is being deleted does not create the nodes again.
type Option = zkqueue.Option

func checkID(id string) error {
	if err := zkutil.CheckName(id); err != nil {
		return fmt.Errorf("%w: %q %v", ErrBadID, zkutil.Printable(id), err)
	}
	return nil
}

func checkPath(p string) error {
	if p == "" || p[0] != '/' || path.Clean(p) != p || p == "/" {
		return fmt.Errorf("bad path %q", p)
	}
	return nil
}

// Queue is a synchronizing queue under one ZooKeeper path: a FIFO
// zkqueue.Queue (path/items) behind a gate that opens once a group of
// members is complete. Publish, PublishBatch, Peek, Len and Purge are
// zkqueue's and work whether or not the gate is open; TryDequeue, Dequeue
// and Take wait for it. The gate's state is cached and refreshed by one
// exists watch on start, so a take costs no read of it. It is safe for
// concurrent use; share one Queue among the goroutines of a process.
type Queue struct {
	*zkqueue.Queue // path/items

	conn    *zk.Conn
	acl     []zk.ACL // of the nodes the queue creates (zkqueue.WithACL)
	path    string
	members int

	mu    sync.Mutex
	open  bool            // start existed at the last read
	watch <-chan zk.Event // armed exists watch on start; nil when none
}

// New returns the synchronizing queue at path for a group of members
// members (1 to MaxMembers), creating path, path/members and path/items as
// needed (see WithoutCreate). Every process using the queue must pass the
// same members.
func New(conn *zk.Conn, path string, members int, opts ...Option) (*Queue, error) {
	if members < 1 || members > MaxMembers {
		return nil, errfmt.Errorf("syncqueue: members %d out of range [1, %d]", members, MaxMembers)
	}
	if err := checkPath(path); err != nil {
		return nil, errfmt.Errorf("syncqueue: %w", err)
	}
	items, err := zkqueue.New(conn, path+"/items", opts...)
	if err != nil {
		return nil, err
	}
	// The members parent is created as the items one is: unless
	// WithoutCreate, which then left items/ alone too.
	if zkqueue.Creates(opts...) {
		if err := zkutil.EnsurePath(conn, path+"/members", zkqueue.ACLOf(opts...)); err != nil {
			return nil, errfmt.Errorf("syncqueue: %w", err)
		}
	}
	return &Queue{Queue: items, conn: conn, acl: zkqueue.ACLOf(opts...), path: path, members: members}, nil
}

// Of returns the synchronizing queue of a KindSync queue of a
// zkqueue.Catalog over its opened Handles (zkqueue.Catalog.Open): its
// messages are h.Items, its group h.Spec.SyncMembers, so a process that
// opened the queue keeps one Queue of its messages. It makes no request
// and creates nothing (the Catalog created path/members); opts set the
// ACL of the nodes it creates (zkqueue.WithACL) and nothing else.
func Of(conn *zk.Conn, h *zkqueue.Handles, opts ...Option) (*Queue, error) {
	if h.Spec.Kind != zkqueue.KindSync {
		return nil, errfmt.Errorf("syncqueue: %s is a %s queue", h.Name, h.Spec.Kind)
	}
	members := h.Spec.SyncMembers
	if members < 1 || members > MaxMembers {
		return nil, errfmt.Errorf("syncqueue: members %d out of range [1, %d]", members, MaxMembers)
	}
	return &Queue{Queue: h.Items, conn: conn, acl: zkqueue.ACLOf(opts...), path: h.Path, members: members}, nil
}

// Path returns the queue's node.
func (q *Queue) Path() string { return q.path }

// Members returns the group size the queue waits for.
func (q *Queue) Members() int { return q.members }

func (q *Queue) startPath() string   { return q.path + "/start" }
func (q *Queue) membersPath() string { return q.path + "/members" }

func (q *Queue) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return errfmt.Errorf("syncqueue: %s %s: %w", op, q.path, err)
}

// openState reports whether the queue is open, from a cached read that is
// refreshed whenever the exists watch on start has fired, and returns that
// watch. One watch serves all callers of a Queue, so waiting consumers do
// not pile up watchers in the client.
func (q *Queue) openState() (bool, <-chan zk.Event, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.watch != nil {
		select {
		case <-q.watch:
			q.watch = nil
		default:
			return q.open, q.watch, nil
		}
	}
	ok, _, w, err := q.conn.ExistsW(q.startPath())
	if err != nil {
		return false, nil, fmt.Errorf("exists %s: %w", q.startPath(), err)
	}
	q.open, q.watch = ok, w
	return ok, w, nil
}

// IsOpen reports whether the group is complete (the start node exists).
// The state is read once and then kept by an exists watch on start: a
// call costs no request until start changes.
func (q *Queue) IsOpen(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	ok, _, err := q.openState()
	return ok, q.wrap("is open", err)
}

// Joined returns the number of members present, read from the members
// node's Stat. After the queue opened it counts the members that have not
// left yet.
func (q *Queue) Joined(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	_, stat, err := q.conn.Exists(q.membersPath())
	if err != nil {
		return 0, q.wrap("joined", err)
	}
	return int(stat.NumChildren), nil
}

// Open opens the queue whether or not the group is complete: an
// administrative override. Every member present now belongs to the group;
// later Joins get ErrGroupFull. Opening an open queue is a no-op.
func (q *Queue) Open(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	children, _, err := q.conn.Children(q.membersPath())
	if err != nil {
		return q.wrap("open", err)
	}
	return q.wrap("open", q.createStart(children))
}

// Reset closes the queue: it deletes the start node, so consumers wait
// again and the next Join that brings the members present to the group
// size opens it anew. Members still present from the previous opening count
// towards that (they should Leave first for a fresh group). Memberships
// that were opened stay opened. Resetting a closed queue is a no-op.
func (q *Queue) Reset(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := q.conn.Delete(q.startPath(), -1)
	if errors.Is(err, zk.ErrNoNode) {
		err = nil
	}
	return q.wrap("reset", err)
}

// TryDequeue takes the head message. Errors: ErrNotOpen before the group
// is complete, zkqueue.ErrEmpty, or a ZooKeeper error. A claim that races with
// Reset may still succeed.
func (q *Queue) TryDequeue(ctx context.Context) (Message, error) {
	ms, err := q.Take(ctx, 1, zkqueue.Room{}, false)
	if err != nil {
		return Message{}, err
	}
	return ms[0], nil
}

// errStartChanged cancels a waiting Dequeue when the start node changed.
var errStartChanged = errors.New("start node changed")

// Dequeue takes the head message, waiting (on an exists watch on start)
// until the queue is open and then (on a children watch) until a message
// is published, or until ctx ends; then it returns ctx.Err(). If the queue
// is reset while Dequeue waits for a message, it goes back to waiting for
// the queue to open.
func (q *Queue) Dequeue(ctx context.Context) (Message, error) {
	ms, err := q.Take(ctx, 1, zkqueue.Room{}, true)
	if err != nil {
		return Message{}, err
	}
	return ms[0], nil
}

// Take takes up to max messages from the head within room (see
// zkqueue.Queue.Take). Without block: ErrNotOpen before the group is
// complete, zkqueue.ErrEmpty when there is nothing. With block it waits as Dequeue
// does.
func (q *Queue) Take(ctx context.Context, max int, room zkqueue.Room, block bool) ([]Message, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		open, w, err := q.openState()
		if err != nil {
			return nil, q.wrap("take", err)
		}
		if !open && !block {
			return nil, q.wrap("take", ErrNotOpen)
		}
		if !open {
			select {
			case <-w:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ms, err := q.Queue.Take(ctx, max, room, false)
		if !block || !errors.Is(err, zkqueue.ErrEmpty) {
			return ms, err
		}
		// Wait for a message, but stop waiting when start changes. The
		// helper goroutine is owned here: it ends with wctx.
		wctx, cancel := context.WithCancelCause(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			select {
			case <-w:
				cancel(errStartChanged)
			case <-wctx.Done():
			}
		}()
		ms, err = q.Queue.Take(wctx, max, room, true)
		cancel(nil)
		<-done
		if err != nil && ctx.Err() == nil && errors.Is(context.Cause(wctx), errStartChanged) {
			continue
		}
		return ms, err
	}
}
