package qbroker

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/qbroker/qbroker/internal/errfmt"
)

// Sentinel errors. Errors returned by the broker are *Error values that
// match the sentinel of their gRPC code with errors.Is:
//
//	if errors.Is(err, qbroker.ErrNotFound) { ... }
var (
	// ErrNotFound: the queue does not exist.
	ErrNotFound = errors.New("qbroker: not found")
	// ErrAlreadyExists: the queue exists with another configuration.
	ErrAlreadyExists = errors.New("qbroker: already exists")
	// ErrInvalidArgument: bad queue name, payload over the limit, priority
	// out of range, bad batch, malformed ack token, bad option.
	ErrInvalidArgument = errors.New("qbroker: invalid argument")
	// ErrFailedPrecondition: wrong queue kind, synchronizing queue not
	// open, unknown or expired lease (an Ack after the visibility timeout,
	// or a second Ack).
	ErrFailedPrecondition = errors.New("qbroker: failed precondition")
	// ErrResourceExhausted: a broker limit, such as its open streams.
	ErrResourceExhausted = errors.New("qbroker: resource exhausted")
	// ErrUnavailable: no broker reachable, or the broker lost ZooKeeper or
	// is shutting down. Retry later.
	ErrUnavailable = errors.New("qbroker: unavailable")
	// ErrAborted: a claim was lost to other consumers too often. Retry.
	ErrAborted = errors.New("qbroker: aborted")
	// ErrInternal: a broker bug; the broker logged the details.
	ErrInternal = errors.New("qbroker: internal error")
	// ErrUnauthenticated: the broker requires credentials (a client
	// certificate or a bearer token) and got none, or a bad one.
	ErrUnauthenticated = errors.New("qbroker: unauthenticated")
	// ErrPermissionDenied: the broker's rules do not allow the caller's
	// identity this action on this queue (or lock, or election).
	ErrPermissionDenied = errors.New("qbroker: permission denied")

	// ErrClosed: the Client, Consumer or Membership was closed.
	ErrClosed = errors.New("qbroker: closed")
	// ErrNoLease: Ack, Nack or Extend of a message delivered at most once,
	// which has no lease.
	ErrNoLease = errors.New("qbroker: message has no lease (delivered at most once)")
)

// sentinels maps gRPC codes to sentinel errors.
var sentinels = map[codes.Code]error{
	codes.NotFound:           ErrNotFound,
	codes.AlreadyExists:      ErrAlreadyExists,
	codes.InvalidArgument:    ErrInvalidArgument,
	codes.FailedPrecondition: ErrFailedPrecondition,
	codes.ResourceExhausted:  ErrResourceExhausted,
	codes.Unavailable:        ErrUnavailable,
	codes.Aborted:            ErrAborted,
	codes.Internal:           ErrInternal,
	codes.Unauthenticated:    ErrUnauthenticated,
	codes.PermissionDenied:   ErrPermissionDenied,
	codes.Canceled:           context.Canceled,
	codes.DeadlineExceeded:   context.DeadlineExceeded,
}

// Error is an error status returned by a broker (or by gRPC on its
// behalf). errors.Is matches it against the sentinel of its code
// (ErrNotFound for codes.NotFound, ...; context.Canceled and
// context.DeadlineExceeded for those codes).
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Message is the status message.
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (%s)", e.Message, e.Code)
}

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	s, ok := sentinels[e.Code]
	return ok && s == target
}

// GRPCStatus returns e as a gRPC status, for status.FromError and
// status.Code.
func (e *Error) GRPCStatus() *status.Status {
	return status.New(e.Code, e.Message)
}

// convErr turns a gRPC status error into an *Error; other errors pass
// through.
func convErr(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &Error{Code: st.Code(), Message: st.Message()}
}

// errorf is fmt.Errorf for the package's "qbroker: ..." errors: a wrapped
// error of this package (a sentinel such as ErrInvalidArgument) keeps its
// meaning for errors.Is, but its own "qbroker: " is not repeated in the
// text ("qbroker: create q: negative option: invalid argument").
var errorf = errfmt.Errorf
