package qcore

import "errors"

// Sentinel errors shared by every queue kind. The recipe packages re-export
// them, so errors.Is works whichever package a caller uses.
var (
	ErrEmpty         = errors.New("queue is empty")
	ErrTooLarge      = errors.New("payload too large")
	ErrBatchTooLarge = errors.New("batch too large")
	ErrEmptyBatch    = errors.New("empty batch")
	ErrBadPriority   = errors.New("priority out of range")
	ErrUnknownLease  = errors.New("unknown or expired lease")
	ErrNotFound      = errors.New("message not found")
	ErrBadData       = errors.New("corrupt message data")
	// ErrNoRoom: a candidate did not fit the Room of its take and was
	// given back unclaimed.
	ErrNoRoom = errors.New("no room left for the message")
)
