package twophase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// Tx is one handle on a transaction: a participant's (Join), the
// coordinator's (Begin) or an observer's (Watch). Its goroutine watches
// the transaction and decides it when the votes or the deadline allow,
// until the decision is known or Close. A Tx is safe for concurrent use.
type Tx struct {
	conn     *zk.Conn
	acl      []zk.ACL
	path     string
	name     string // the participant; "" for the coordinator and observers
	parts    []string
	deadline time.Time

	closed    chan struct{} // closed by Close
	closeOnce sync.Once
	done      chan struct{} // closed when the goroutine ends; dec and err are set before
	wg        sync.WaitGroup

	dec Decision
	err error
}

// testHookDecided, set by this package's tests only, runs after a Tx
// created the decision of txPath: tests count the decisions made.
var testHookDecided func(txPath string, d Decision)

// testHookBeforeDecide, set by this package's tests only, runs after a
// Tx read the votes and before it tries to decide: tests stage a vote
// arriving in between.
var testHookBeforeDecide func(txPath, by string, d Decision)

func start(conn *zk.Conn, txPath, name string, rec txRecord, o options) *Tx {
	t := &Tx{
		conn:     conn,
		acl:      o.acl,
		path:     txPath,
		name:     name,
		parts:    rec.Participants,
		deadline: time.UnixMilli(rec.Deadline),
		closed:   make(chan struct{}),
		done:     make(chan struct{}),
	}
	t.wg.Add(1)
	go t.run()
	return t
}

// Path returns the transaction's node.
func (t *Tx) Path() string { return t.path }

// Participants returns the transaction's participants, as Begin got them.
func (t *Tx) Participants() []string { return append([]string(nil), t.parts...) }

// Deadline returns the time after which any Tx decides abort if a vote is
// still missing (by the coordinator's clock, compared with ours).
func (t *Tx) Deadline() time.Time { return t.deadline }

// Done is closed once Wait would return at once: the decision is known,
// the transaction vanished, or the Tx was closed.
func (t *Tx) Done() <-chan struct{} { return t.done }

// Wait waits for the decision. It returns ctx's error when ctx ends first,
// ErrClosed when the Tx was closed first, ErrNoTransaction when the
// transaction was deleted before this Tx read its decision.
func (t *Tx) Wait(ctx context.Context) (Decision, error) {
	select {
	case <-t.done:
		return t.dec, t.err
	case <-ctx.Done():
		return Decision{}, ctx.Err()
	}
}

// Close stops the Tx's goroutine and waits for it. It votes nothing and
// decides nothing: the transaction goes on without this Tx. Idempotent.
func (t *Tx) Close() error {
	t.closeOnce.Do(func() { close(t.closed) })
	t.wg.Wait()
	return nil
}

func (t *Tx) by() string {
	if t.name == "" {
		return Coordinator
	}
	return t.name
}

// Vote casts this participant's vote: a write of its node, at version 0,
// so a vote is cast once and never changes. An abort vote decides the
// transaction in the same Multi (unless it was decided already): one
// abort is enough. A commit vote only records itself; the decision comes
// from whichever Tx sees every vote in (Wait for it).
//
// Repeating the vote already recorded returns nil (a vote whose answer was
// lost with the connection, or cast before a restart, may be retried).
// Errors: ErrInvalid (v is neither Commit nor Abort), ErrNotParticipant (a
// coordinator's or observer's Tx), ErrVoted (another vote is recorded),
// ErrLate (the deadline passed and the vote was recorded as a timeout:
// the transaction aborted), ErrNoTransaction.
func (t *Tx) Vote(ctx context.Context, v Vote) error {
	if v != Commit && v != Abort {
		return fmt.Errorf("%w: vote %v", ErrInvalid, v)
	}
	if t.name == "" {
		return errfmt.Errorf("twophase: vote on %s: %w", t.path, ErrNotParticipant)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	vp := votePath(t.path, t.name)
	err := t.castVote(vp, v)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrNoNode):
		return errfmt.Errorf("twophase: vote %s: %w", vp, ErrNoTransaction)
	case !errors.Is(err, zk.ErrBadVersion):
		return errfmt.Errorf("twophase: vote %s: %w", vp, err)
	}
	data, _, err := t.conn.Get(vp)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return errfmt.Errorf("twophase: vote %s: %w", vp, ErrNoTransaction)
	case err != nil:
		return errfmt.Errorf("twophase: vote %s: %w", vp, err)
	case string(data) == v.String():
		return nil
	case string(data) == voteTimeout:
		return errfmt.Errorf("twophase: vote %s: %w", vp, ErrLate)
	}
	return errfmt.Errorf("twophase: vote %s: %w (recorded %q)", vp, ErrVoted, data)
}

// castVote writes the vote; an abort also creates the decision, unless one
// exists already.
func (t *Tx) castVote(vp string, v Vote) error {
	set := &zk.SetDataRequest{Path: vp, Data: []byte(v.String()), Version: 0}
	if v == Commit {
		_, err := t.conn.Set(set.Path, set.Data, set.Version)
		return err
	}
	d := Decision{Committed: false, Reason: t.name + " voted abort", By: t.name}
	err := t.decide(d, set)
	if errors.Is(err, zk.ErrNodeExists) {
		_, err = t.conn.Set(set.Path, set.Data, set.Version)
	}
	return err
}

// Abort decides the transaction abort with reason, unless it is decided
// already; it returns the decision in effect, which is a commit when every
// vote was in and another Tx decided first. The coordinator may abort
// until the decision, as in any two-phase commit; so may a participant,
// even one that voted commit.
//
// Errors: ErrNoTransaction.
func (t *Tx) Abort(ctx context.Context, reason string) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	err := t.decide(Decision{Committed: false, Reason: reason, By: t.by()})
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return Decision{}, errfmt.Errorf("twophase: abort %s: %w", t.path, ErrNoTransaction)
	case err != nil && !errors.Is(err, zk.ErrNodeExists):
		return Decision{}, errfmt.Errorf("twophase: abort %s: %w", t.path, err)
	}
	d, err := readDecision(t.conn, t.path)
	if errors.Is(err, zk.ErrNoNode) {
		return Decision{}, errfmt.Errorf("twophase: abort %s: %w", t.path, ErrNoTransaction)
	}
	return d, err
}

// decide creates the decision node with d, in one Multi with ops (the
// checks or writes of the votes the decision rests on). It returns the
// failing op's error: zk.ErrNodeExists when the transaction was decided
// already, zk.ErrBadVersion when a vote changed since it was read,
// zk.ErrNoNode when the transaction is gone.
func (t *Tx) decide(d Decision, ops ...any) error {
	data, err := json.Marshal(d)
	if err != nil {
		return err
	}
	ops = append(ops, &zk.CreateRequest{
		Path: path.Join(t.path, decisionName), Data: data, Acl: t.acl,
	})
	res, err := t.conn.Multi(ops...)
	if err == nil {
		if h := testHookDecided; h != nil {
			h(t.path, d)
		}
		return nil
	}
	return zkutil.MultiError(res, err)
}
