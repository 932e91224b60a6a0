package twophase

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// The goroutine of a Tx: it waits, on watches, for the decision node and
// for the first vote still missing; at each wake-up it reads the votes
// not yet known (a cast vote never changes, so each is read until seen
// cast) and decides when it can: abort on an abort vote, commit when every
// vote is commit, abort when the deadline passed with votes missing. One
// timer wakes it at the deadline. Connection errors are retried with
// backoff; the transaction's deletion, a decision that does not parse, or
// the connection's Close end it.

const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
)

type watchState struct {
	votes  map[string]string // cast votes by participant
	decW   <-chan zk.Event   // armed on the decision node while it does not exist
	voteW  <-chan zk.Event   // armed on the node of voteOn, the first vote missing
	voteOn string
}

func (t *Tx) run() {
	defer t.wg.Done()
	defer close(t.done)
	s := watchState{votes: make(map[string]string, len(t.parts))}
	timer := time.NewTimer(time.Until(t.deadline))
	defer timer.Stop()
	backoff := minBackoff
	for {
		select {
		case <-t.closed:
			t.err = ErrClosed
			return
		default:
		}
		d, again, err := t.step(&s)
		switch {
		case d != nil:
			t.dec = *d
			return
		case errors.Is(err, ErrNoTransaction), errors.Is(err, ErrCorrupt):
			t.err = err
			return
		case err != nil:
			if !sleep(backoff, t.closed) {
				t.err = ErrClosed
				return
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
		if again {
			continue
		}
		var ev zk.Event
		select {
		case ev = <-s.decW:
			s.decW = nil
		case ev = <-s.voteW:
			s.voteW = nil
		case <-timer.C:
		case <-t.closed:
			t.err = ErrClosed
			return
		}
		if errors.Is(ev.Err, zk.ErrClosing) {
			t.err = errfmt.Errorf("twophase: watch %s: %w", t.path, ev.Err)
			return
		}
	}
}

// step reads the transaction and decides it when it can. It returns the
// decision once known; again when it should run again at once (a vote
// arrived while deciding); otherwise the watches in s are armed.
func (t *Tx) step(s *watchState) (*Decision, bool, error) {
	if zkutil.Fired(s.decW) {
		p := path.Join(t.path, decisionName)
		ok, _, w, err := t.conn.ExistsW(p)
		if err != nil {
			return nil, false, errfmt.Errorf("twophase: exists %s: %w", p, err)
		}
		s.decW = w
		if ok {
			return t.readDecided()
		}
	}
	missing, err := t.readVotes(s)
	if err != nil {
		return nil, false, err
	}
	d, ops := t.verdict(s, missing)
	if d == nil {
		again, err := t.watchVote(s, missing[0])
		return nil, again, err
	}
	if h := testHookBeforeDecide; h != nil {
		h(t.path, t.by(), *d)
	}
	err = t.decide(*d, ops...)
	switch {
	case err == nil, errors.Is(err, zk.ErrNodeExists):
		return t.readDecided()
	case errors.Is(err, zk.ErrBadVersion):
		return nil, true, nil // a vote was cast since the read
	case errors.Is(err, zk.ErrNoNode):
		return nil, false, errfmt.Errorf("twophase: decide %s: %w", t.path, ErrNoTransaction)
	}
	return nil, false, errfmt.Errorf("twophase: decide %s: %w", t.path, err)
}

// readDecided reads the decision known to exist.
func (t *Tx) readDecided() (*Decision, bool, error) {
	d, err := readDecision(t.conn, t.path)
	if errors.Is(err, zk.ErrNoNode) {
		// Only Delete removes a decision, with the whole transaction.
		return nil, false, errfmt.Errorf("twophase: %s: %w", t.path, ErrNoTransaction)
	}
	if err != nil {
		return nil, false, err
	}
	return &d, false, nil
}

// readVotes reads the votes not known yet into s.votes and returns the
// participants that have not voted, in the transaction's order.
func (t *Tx) readVotes(s *watchState) ([]string, error) {
	var missing []string
	for _, p := range t.parts {
		if _, ok := s.votes[p]; ok {
			continue
		}
		vp := votePath(t.path, p)
		data, _, err := t.conn.Get(vp)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return nil, errfmt.Errorf("twophase: %s: %w", vp, ErrNoTransaction)
		case err != nil:
			return nil, errfmt.Errorf("twophase: get %s: %w", vp, err)
		case len(data) == 0:
			missing = append(missing, p)
		default:
			s.votes[p] = string(data)
		}
	}
	return missing, nil
}

// verdict returns the decision the votes allow, with the ops that make it
// conditional on them, or nil while it must wait. Only a vote reading
// exactly "commit" counts as commit.
func (t *Tx) verdict(s *watchState, missing []string) (*Decision, []any) {
	by := t.by()
	for _, p := range t.parts {
		v, ok := s.votes[p]
		if !ok || v == voteCommit {
			continue
		}
		reason := p + " voted " + v
		if v == voteTimeout {
			reason = p + " did not vote before the deadline"
		}
		check := &zk.CheckVersionRequest{Path: votePath(t.path, p), Version: 1}
		return &Decision{Reason: reason, By: by}, []any{check}
	}
	if len(missing) == 0 {
		ops := make([]any, 0, len(t.parts))
		for _, p := range t.parts {
			ops = append(ops, &zk.CheckVersionRequest{Path: votePath(t.path, p), Version: 1})
		}
		return &Decision{Committed: true, Reason: "all voted commit", By: by}, ops
	}
	if time.Now().Before(t.deadline) {
		return nil, nil
	}
	// The deadline closes the ballot: the missing votes are recorded as
	// timeouts in the decision's Multi, which fails if one of them was
	// cast meanwhile; a late Vote then finds its node written (ErrLate).
	ops := make([]any, 0, len(missing))
	for _, p := range missing {
		ops = append(ops, &zk.SetDataRequest{Path: votePath(t.path, p), Data: []byte(voteTimeout), Version: 0})
	}
	return &Decision{Reason: "deadline passed: " + names(missing) + " did not vote", By: by}, ops
}

// names lists up to ten names, then how many more.
func names(ps []string) string {
	if len(ps) <= 10 {
		return strings.Join(ps, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ps[:10], ", "), len(ps)-10)
}

// watchVote arms the watch on p's vote node unless it is armed there
// already. It returns again when p voted since readVotes.
func (t *Tx) watchVote(s *watchState, p string) (bool, error) {
	if s.voteOn == p && s.voteW != nil && !zkutil.Fired(s.voteW) {
		return false, nil
	}
	vp := votePath(t.path, p)
	data, _, w, err := t.conn.GetW(vp)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return false, errfmt.Errorf("twophase: %s: %w", vp, ErrNoTransaction)
	case err != nil:
		return false, errfmt.Errorf("twophase: get %s: %w", vp, err)
	}
	s.voteW, s.voteOn = w, p
	if len(data) > 0 {
		s.votes[p] = string(data)
		return true, nil
	}
	return false, nil
}

// sleep waits d; it returns false when stop closes first.
func sleep(d time.Duration, stop <-chan struct{}) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-stop:
		return false
	}
}
