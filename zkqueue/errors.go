package zkqueue

import "errors"

// Sentinel errors shared by every queue kind. The recipe packages re-export
// them, so errors.Is works whichever package a caller uses.
var (
	ErrEmpty         = errors.New("zkqueue: queue is empty")
	ErrTooLarge      = errors.New("zkqueue: payload too large")
	ErrBatchTooLarge = errors.New("zkqueue: batch too large")
	ErrEmptyBatch    = errors.New("zkqueue: empty batch")
	ErrBadPriority   = errors.New("zkqueue: priority out of range")
	ErrUnknownLease  = errors.New("zkqueue: unknown or expired lease")
	ErrNotFound      = errors.New("zkqueue: message not found")
	ErrBadData       = errors.New("zkqueue: corrupt message data")
	// ErrNoRoom: a candidate did not fit the Room of its take and was
	// given back unclaimed.
	ErrNoRoom = errors.New("zkqueue: no room left for the message")

	// Errors of a Catalog.
	ErrQueueNotFound = errors.New("zkqueue: queue not found")
	ErrQueueExists   = errors.New("zkqueue: queue exists with another configuration")
	ErrQueueDeleting = errors.New("zkqueue: queue is being deleted")
	ErrTooManyQueues = errors.New("zkqueue: too many queues")
	ErrBadName       = errors.New("zkqueue: bad queue name")
	ErrBadSpec       = errors.New("zkqueue: invalid queue spec")
)
