package twophase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// Sentinel errors, wrapped with the operation and node; use errors.Is.
var (
	// ErrInvalid: a bad argument (path, participant name, timeout, vote).
	ErrInvalid = errors.New("twophase: invalid argument")
	// ErrExists: Begin found a node at the transaction's path already.
	ErrExists = errors.New("twophase: transaction exists")
	// ErrNoTransaction: no transaction at the path (never begun, or
	// deleted), or the node there is not one.
	ErrNoTransaction = errors.New("twophase: no transaction")
	// ErrNotParticipant: Join with a name the transaction does not list,
	// or Vote by the coordinator's or an observer's Tx.
	ErrNotParticipant = errors.New("twophase: not a participant")
	// ErrVoted: Vote by a participant whose node holds another vote.
	ErrVoted = errors.New("twophase: voted already")
	// ErrLate: Vote after the deadline closed the ballot: the decider
	// recorded the missing vote as an abort (a timeout).
	ErrLate = errors.New("twophase: vote after the deadline")
	// ErrUndecided: Outcome or Delete of a transaction not decided yet.
	ErrUndecided = errors.New("twophase: not decided")
	// ErrClosed: Wait on a Tx closed before it learned the decision.
	ErrClosed = errors.New("twophase: closed")
	// ErrCorrupt: the decision node's data does not parse (it was not
	// written by this package).
	ErrCorrupt = errors.New("twophase: decision does not parse")
)

// MaxParticipants bounds a transaction's participants: Begin creates the
// whole tree in one Multi, which must stay far below jute.maxbuffer, and a
// commit decision checks every vote in one Multi too.
const MaxParticipants = 256

// Vote is a participant's vote.
type Vote int

// The votes.
const (
	Commit Vote = iota + 1
	Abort
)

func (v Vote) String() string {
	switch v {
	case Commit:
		return voteCommit
	case Abort:
		return voteAbort
	}
	return fmt.Sprintf("Vote(%d)", int(v))
}

// Vote node data: empty until the participant votes; written once.
const (
	voteCommit  = "commit"
	voteAbort   = "abort"
	voteTimeout = "timeout" // not cast before the deadline: written by the decider, counts as abort
)

// Node names under the transaction node. Participants' nodes are
// prefixed, so no participant name can collide with the decision.
const (
	decisionName = "decision"
	votePrefix   = "p-"
)

// Coordinator is the decider's name in a Decision made by the
// coordinator's or an observer's Tx (one not joined as a participant); a
// participant named so cannot be told from it.
const Coordinator = "coordinator"

// Decision is a transaction's outcome, read from its decision node.
type Decision struct {
	// Committed is true when every participant voted commit.
	Committed bool `json:"committed"`
	// Reason says why: "all voted commit", "<name> voted abort",
	// "deadline passed: <names> did not vote", or an Abort's reason.
	Reason string `json:"reason"`
	// By names who created the decision: a participant or Coordinator.
	By string `json:"by"`
}

// txRecord is the transaction node's data.
type txRecord struct {
	Participants []string `json:"participants"`
	// Deadline is in Unix milliseconds, by the coordinator's clock.
	Deadline int64 `json:"deadline_unix_ms"`
}

// Plan is what Begin starts: the participants, each of which votes, and
// how long they have to (the decision is abort once Timeout has passed
// without every vote).
type Plan struct {
	Participants []string
	Timeout      time.Duration
}

// Begin creates the transaction of plan at txPath, as the coordinator: the
// transaction node (its data records the participants and the deadline,
// now + plan.Timeout) and one empty child per participant, in one Multi, so a
// participant never sees half a transaction. Missing parents of txPath
// are created. Begin returns a Tx that watches the transaction and helps
// decide it (as Coordinator) until it is decided or closed; the
// transaction needs no coordinator after Begin: closing the Tx, or the
// coordinator's death, leaves the decision to the participants.
//
// Errors: ErrInvalid (txPath not absolute and clean, no participants,
// more than MaxParticipants, a name CheckName refuses or given twice,
// timeout <= 0), ErrExists (txPath exists: never reuse a path). A Begin
// that fails with the connection may have created the transaction: a
// retry then gets ErrExists, and Watch follows the transaction.
func Begin(ctx context.Context, conn *zk.Conn, txPath string, plan Plan, opts ...Option) (*Tx, error) {
	participants, timeout := plan.Participants, plan.Timeout
	o := applyOptions(opts)
	if err := checkBegin(conn, txPath, participants, timeout); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rec := txRecord{Participants: participants, Deadline: time.Now().Add(timeout).UnixMilli()}
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, errfmt.Errorf("twophase: begin %s: %w", txPath, err)
	}
	if err := zkutil.EnsurePath(conn, path.Dir(txPath), o.acl); err != nil {
		return nil, errfmt.Errorf("twophase: begin %s: %w", txPath, err)
	}
	acl := o.acl
	ops := []any{&zk.CreateRequest{Path: txPath, Data: data, Acl: acl}}
	for _, p := range participants {
		ops = append(ops, &zk.CreateRequest{Path: votePath(txPath, p), Acl: acl})
	}
	if err := zkutil.MultiError(conn.Multi(ops...)); err != nil {
		if errors.Is(err, zk.ErrNodeExists) {
			return nil, errfmt.Errorf("twophase: begin %s: %w", txPath, ErrExists)
		}
		return nil, errfmt.Errorf("twophase: begin %s: %w", txPath, err)
	}
	return start(conn, txPath, "", rec, o), nil
}

func checkBegin(conn *zk.Conn, txPath string, participants []string, timeout time.Duration) error {
	if err := checkPath(conn, txPath); err != nil {
		return err
	}
	if len(participants) == 0 || len(participants) > MaxParticipants {
		return fmt.Errorf("%w: %d participants, want 1 to %d", ErrInvalid, len(participants), MaxParticipants)
	}
	seen := make(map[string]bool, len(participants))
	for _, p := range participants {
		if err := zkutil.CheckName(p); err != nil {
			return fmt.Errorf("%w: participant name %v", ErrInvalid, err)
		}
		if seen[p] {
			return fmt.Errorf("%w: participant %q given twice", ErrInvalid, p)
		}
		seen[p] = true
	}
	if timeout <= 0 {
		return fmt.Errorf("%w: timeout %v, want > 0", ErrInvalid, timeout)
	}
	return nil
}

func checkPath(conn *zk.Conn, txPath string) error {
	if conn == nil {
		return fmt.Errorf("%w: nil connection", ErrInvalid)
	}
	if txPath == "" || txPath[0] != '/' || txPath == "/" || path.Clean(txPath) != txPath {
		return fmt.Errorf("%w: path %q: want an absolute, clean ZooKeeper path other than /", ErrInvalid, zkutil.Printable(txPath))
	}
	return nil
}

// Join opens the transaction at txPath as participant name. The returned
// Tx watches the transaction and helps decide it (see the package doc)
// until it is decided or closed; Vote casts the participant's vote. A
// participant restarted after a crash joins again: Vote then repeats its
// recorded vote harmlessly, and Wait returns the decision made meanwhile.
//
// Errors: ErrInvalid, ErrNoTransaction, ErrNotParticipant.
func Join(ctx context.Context, conn *zk.Conn, txPath, name string, opts ...Option) (*Tx, error) {
	if err := checkPath(conn, txPath); err != nil {
		return nil, err
	}
	if err := zkutil.CheckName(name); err != nil {
		return nil, fmt.Errorf("%w: participant name %v", ErrInvalid, err)
	}
	rec, err := readRecord(ctx, conn, txPath)
	if err != nil {
		return nil, err
	}
	for _, p := range rec.Participants {
		if p == name {
			return start(conn, txPath, name, rec, applyOptions(opts)), nil
		}
	}
	return nil, errfmt.Errorf("twophase: join %s as %q: %w", txPath, name, ErrNotParticipant)
}

// Watch opens the transaction at txPath without taking part: the Tx
// learns the decision and helps make it (as Coordinator), like the one
// Begin returns; a coordinator restarted after Begin watches with it.
//
// Errors: ErrInvalid, ErrNoTransaction.
func Watch(ctx context.Context, conn *zk.Conn, txPath string, opts ...Option) (*Tx, error) {
	if err := checkPath(conn, txPath); err != nil {
		return nil, err
	}
	rec, err := readRecord(ctx, conn, txPath)
	if err != nil {
		return nil, err
	}
	return start(conn, txPath, "", rec, applyOptions(opts)), nil
}

func readRecord(ctx context.Context, conn *zk.Conn, txPath string) (txRecord, error) {
	var rec txRecord
	if err := ctx.Err(); err != nil {
		return rec, err
	}
	data, _, err := conn.Get(txPath)
	if errors.Is(err, zk.ErrNoNode) {
		return rec, errfmt.Errorf("twophase: %s: %w", txPath, ErrNoTransaction)
	}
	if err != nil {
		return rec, errfmt.Errorf("twophase: get %s: %w", txPath, err)
	}
	if err := json.Unmarshal(data, &rec); err != nil || len(rec.Participants) == 0 || rec.Deadline == 0 {
		return rec, errfmt.Errorf("twophase: %s: not a transaction record: %w", txPath, ErrNoTransaction)
	}
	return rec, nil
}

// Outcome reads the decision of the transaction at txPath without waiting:
// what a participant restarted after a crash reads to learn what to apply
// (Join and Wait also wait for it). It returns ErrUndecided before the
// decision, ErrNoTransaction when there is no transaction (never begun,
// or deleted: see the package doc on cleanup).
func Outcome(ctx context.Context, conn *zk.Conn, txPath string) (Decision, error) {
	if err := checkPath(conn, txPath); err != nil {
		return Decision{}, err
	}
	if _, err := readRecord(ctx, conn, txPath); err != nil {
		return Decision{}, err
	}
	d, err := readDecision(conn, txPath)
	if errors.Is(err, zk.ErrNoNode) {
		// Deleted between the two reads, or not decided yet.
		if _, err := readRecord(ctx, conn, txPath); err != nil {
			return Decision{}, err
		}
		return Decision{}, errfmt.Errorf("twophase: outcome %s: %w", txPath, ErrUndecided)
	}
	return d, err
}

// readDecision reads the decision node; it returns zk.ErrNoNode (wrapped)
// when there is none.
func readDecision(conn *zk.Conn, txPath string) (Decision, error) {
	p := path.Join(txPath, decisionName)
	data, _, err := conn.Get(p)
	if err != nil {
		return Decision{}, errfmt.Errorf("twophase: get %s: %w", p, err)
	}
	var d Decision
	if err := json.Unmarshal(data, &d); err != nil {
		return Decision{}, errfmt.Errorf("twophase: decision %s: %w: %v", p, ErrCorrupt, err)
	}
	return d, nil
}

// Delete deletes the decided transaction at txPath and everything below
// it. It refuses an undecided transaction (ErrUndecided): only the
// decision makes it safe to forget. Call it once every participant has
// applied the outcome (see the package doc on cleanup): a participant that
// looks for a deleted transaction cannot learn its outcome. A transaction
// already gone is not an error.
func Delete(ctx context.Context, conn *zk.Conn, txPath string) error {
	if err := checkPath(conn, txPath); err != nil {
		return err
	}
	_, err := Outcome(ctx, conn, txPath)
	switch {
	case errors.Is(err, ErrNoTransaction):
		return nil
	case err != nil:
		return err
	}
	if err := zkutil.DeleteTree(ctx, conn, txPath, nil); err != nil {
		return errfmt.Errorf("twophase: delete %s: %w", txPath, err)
	}
	return nil
}

func votePath(txPath, name string) string { return txPath + "/" + votePrefix + name }
