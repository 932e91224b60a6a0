package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/qbroker/qbroker/counter"
	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lock"
	"github.com/qbroker/qbroker/semaphore"
	"github.com/qbroker/qbroker/syncqueue"
	"github.com/qbroker/qbroker/zkqueue"
)

// Broker-level sentinel errors; toStatus maps them to gRPC codes.
var (
	errInvalid       = errors.New("invalid argument")
	errQueueNotFound = zkqueue.ErrQueueNotFound // the Catalog's, so one value means it
	errQueueExists   = zkqueue.ErrQueueExists
	errMemberExists  = errors.New("already joined") // a sync member id in use
	errWrongKind     = errors.New("wrong queue kind")
	errNotOpen       = errors.New("synchronizing queue is not open")
	errClosing       = errors.New("broker is shutting down")
	errLimit         = errors.New("broker limit reached")
	errQueueDeleting = zkqueue.ErrQueueDeleting
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInvalid, fmt.Sprintf(format, args...))
}

// detail is what err, which wraps sentinel, says beyond it: for a message
// of the broker's own that names what sentinel names.
func detail(err, sentinel error) string {
	return strings.TrimPrefix(err.Error(), sentinel.Error()+": ")
}

// toStatus is the one place where errors become gRPC statuses. Clients see
// the error's own text for the errors they caused, an engine's refusal in
// the broker's words (inWords); anything unexpected is Internal with a
// generic message (the details are logged, never sent).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	err = inWords(err)
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codeOf(err)
	msg := err.Error()
	if code == codes.Internal {
		msg = "internal error"
	}
	return status.Error(code, msg)
}

func codeOf(err error) codes.Code {
	switch {
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, errInvalid), errors.Is(err, zkqueue.ErrTooLarge), errors.Is(err, zkqueue.ErrBatchTooLarge),
		errors.Is(err, zkqueue.ErrEmptyBatch), errors.Is(err, zkqueue.ErrBadPriority), errors.Is(err, zkqueue.ErrBadAttributes), errors.Is(err, zkqueue.ErrBadCursor),
		errors.Is(err, zkqueue.ErrBadName), errors.Is(err, zkqueue.ErrBadSpec), errors.Is(err, election.ErrInvalid),
		errors.Is(err, lock.ErrInvalid), errors.Is(err, counter.ErrInvalid), errors.Is(err, semaphore.ErrInvalid):
		return codes.InvalidArgument
	case errors.Is(err, errQueueNotFound), errors.Is(err, election.ErrNoLeader), errors.Is(err, election.ErrNoCandidate),
		errors.Is(err, errNoSemaphore):
		return codes.NotFound
	case errors.Is(err, errQueueExists), errors.Is(err, errMemberExists):
		return codes.AlreadyExists
	case errors.Is(err, errWrongKind), errors.Is(err, errNotOpen), errors.Is(err, zkqueue.ErrUnknownLease),
		errors.Is(err, errSyncGroup), errors.Is(err, election.ErrNotLeader), errors.Is(err, lock.ErrNotHeld),
		errors.Is(err, lock.ErrLocked), errors.Is(err, counter.ErrCorrupt), errors.Is(err, semaphore.ErrNotHeld),
		errors.Is(err, semaphore.ErrNoPermit), errors.Is(err, semaphore.ErrOverLimit), errors.Is(err, errLimitMismatch):
		return codes.FailedPrecondition
	case errors.Is(err, errLimit), errors.Is(err, zkqueue.ErrTooManyQueues), errors.Is(err, zkqueue.ErrTooManyDelayed):
		return codes.ResourceExhausted
	case errors.Is(err, errClosing), errors.Is(err, zkqueue.ErrCommitterClosed), zkutil.IsUnavailable(err),
		errors.Is(err, errStalled):
		return codes.Unavailable
	case errors.Is(err, errLeadershipLost), errors.Is(err, errLockLost), errors.Is(err, election.ErrNodeLost),
		errors.Is(err, lock.ErrLost), errors.Is(err, errPermitsLost), errors.Is(err, semaphore.ErrLost), errors.Is(err, errParticipantLost):
		// The client may campaign or lock again.
		return codes.Aborted
	case errors.Is(err, errQueueDeleting):
		// Retry: the deletion is finished by the next call.
		return codes.Aborted
	case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
		// A race lost after the recipe's own retries.
		return codes.Aborted
	default:
		return codes.Internal
	}
}

// fail maps err for the client and logs what the client will not see.
func (b *Broker) fail(err error) error {
	if err == nil {
		return nil
	}
	st := toStatus(err)
	if status.Code(st) == codes.Internal {
		b.log.Error("internal error", "err", err)
	}
	return st
}

// engineErr is an error of an engine (zkqueue, syncqueue) with what the
// broker's words for it name: the queue, and the message's index in its
// publish or the sync member. inWords says it.
type engineErr struct {
	err    error
	q      *queue
	msg    int    // index of the message in its publish, -1 for none
	member string // the sync member, "" for none
}

func (e *engineErr) Error() string { return e.err.Error() }
func (e *engineErr) Unwrap() error { return e.err }

// ofMessage marks err as the engine's refusal of message i of a publish
// to q (zkqueue.Queue.CheckDraft).
func ofMessage(q *queue, i int, err error) error {
	return &engineErr{err: err, q: q, msg: i}
}

// ofMember marks err as syncqueue's answer to member of q.
func ofMember(q *queue, member string, err error) error {
	return &engineErr{err: err, q: q, msg: -1, member: member}
}

// callerErr is an error of a lock or election recipe with the caller and
// the name it concerns: a call by key on another identity's node is
// PermissionDenied, naming the action that would allow it (notOwned).
type callerErr struct {
	err                error
	id                 Identity
	action, kind, name string
}

func (e *callerErr) Error() string { return e.err.Error() }
func (e *callerErr) Unwrap() error { return e.err }

// ofCaller marks err as the answer of the recipe to id's call by key on
// the lock or election (kind) name, which adminAction would allow on any
// identity's node.
func ofCaller(id Identity, adminAction, kind, name string, err error) error {
	return &callerErr{err: err, id: id, action: adminAction, kind: kind, name: name}
}

// notOwned is the refusal of a call by key on another identity's node:
// it names the action that would allow it, and nothing of the node.
func notOwned(id Identity, adminAction, kind, name string) error {
	return status.Errorf(codes.PermissionDenied, "%s may not %s %s %q (it is another identity's)",
		id.Name, adminAction, kind, printable(name))
}

// inWords says an engine's refusal the way the broker says its own: it
// names the queue, message or member, and the option the client set,
// never a ZooKeeper path or a package prefix. Other errors are as they
// are.
func inWords(err error) error {
	if c := (*callerErr)(nil); errors.As(err, &c) {
		if errors.Is(c.err, lock.ErrNotOwner) || errors.Is(c.err, election.ErrNotOwner) || errors.Is(c.err, semaphore.ErrNotOwner) {
			return notOwned(c.id, c.action, c.kind, c.name)
		}
		return c.err
	}
	var e *engineErr
	if !errors.As(err, &e) {
		switch {
		case errors.Is(err, zkqueue.ErrTooManyDelayed):
			return fmt.Errorf("%w: %v", errLimit, err)
		case errors.Is(err, zkqueue.ErrTooManyQueues):
			return fmt.Errorf("%w (--max-queues)", err)
		}
		return err
	}
	q, i, cause := e.q, e.msg, e.err
	switch {
	case errors.Is(cause, syncqueue.ErrDuplicateMember):
		return fmt.Errorf("member %s %w queue %s", e.member, errMemberExists, q.name)
	case errors.Is(cause, syncqueue.ErrGroupFull):
		return fmt.Errorf("%w: queue %s admits no more members (it is open, or its group completed without %s)", errSyncGroup, q.name, e.member)
	case errors.Is(cause, syncqueue.ErrBadID):
		return invalidf("member id %q", printable(e.member))
	case i < 0:
		return cause
	case errors.Is(cause, zkqueue.ErrBadPriority):
		if q.meta.Kind != kindPriority {
			return wrongKind(q, "a priority needs a PRIORITY queue")
		}
		return cause // names the priority and the range
	case errors.Is(cause, zkqueue.ErrBadDedupID):
		return invalidf("message %d: dedup_id %s", i, detail(cause, zkqueue.ErrBadDedupID))
	case errors.Is(cause, zkqueue.ErrBadGroup):
		return invalidf("message %d: group %s", i, detail(cause, zkqueue.ErrBadGroup))
	}
	return fmt.Errorf("message %d: %w", i, cause)
}

func wrongKind(q *queue, what string) error {
	return fmt.Errorf("%w: queue %s is %s: %s", errWrongKind, q.name, q.meta.Kind, what)
}
