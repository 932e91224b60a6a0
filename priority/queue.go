package priority

import (
	"context"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/zkqueue"
)

// Message is a message taken from or peeked at in a queue. Its Priority
// field holds the priority it was published with.
type Message = zkqueue.Message

// Sentinel errors, wrapped with the operation and path; use errors.Is. They
// are package zkqueue's, so errors.Is works whichever package a caller
// checks against.
var (
	ErrEmpty         = zkqueue.ErrEmpty         // TryDequeue, Peek: nothing to take
	ErrTooLarge      = zkqueue.ErrTooLarge      // payload over the limit
	ErrBatchTooLarge = zkqueue.ErrBatchTooLarge // batch over the count or byte limit
	ErrEmptyBatch    = zkqueue.ErrEmptyBatch    // PublishBatch with no items
	ErrBadData       = zkqueue.ErrBadData       // a message node with a corrupt header
	ErrBadPriority   = zkqueue.ErrBadPriority   // priority outside [0, MaxPriority]
)

// Priorities: 0 is the most urgent, MaxPriority the least.
const (
	MinPriority = 0
	MaxPriority = zkqueue.MaxPriority
)

// Option configures a Queue: any of package zkqueue's options.
type Option = zkqueue.Option

// The options most used with a priority queue, package zkqueue's.
var (
	WithMaxPayload    = zkqueue.WithMaxPayload    // largest payload (default 512 KiB)
	WithMaxBatchBytes = zkqueue.WithMaxBatchBytes // bound on one PublishBatch's bytes
	WithMaxBatchCount = zkqueue.WithMaxBatchCount // bound on one PublishBatch's messages
	WithLogger        = zkqueue.WithLogger        // logger for skipped foreign nodes
	WithConflictHook  = zkqueue.WithConflictHook  // called per lost race for the head
)

// Item is one message of a PublishBatch.
type Item = zkqueue.Draft

// Queue is a priority queue under one ZooKeeper path: a zkqueue.Queue
// whose messages carry a priority (zkqueue.WithPriorities), with the
// priority in Publish's signature. Everything else (Take, TryDequeue,
// Dequeue, Peek, Len, Purge) is zkqueue's. It is safe for concurrent use;
// share one Queue among the goroutines of a process so they share one
// snapshot and never collide with each other.
type Queue struct {
	*zkqueue.Queue
}

// New returns the queue at path, creating path and its parents as needed.
func New(conn *zk.Conn, path string, opts ...Option) (*Queue, error) {
	// A claim never works from a snapshot older than the last change of
	// the children (see the package doc).
	q, err := zkqueue.New(conn, path, append(opts, zkqueue.WithPriorities())...)
	if err != nil {
		return nil, err
	}
	return &Queue{q}, nil
}

// Publish adds payload with the given priority and returns the message id
// (its node name, "p007-0000000042"). Errors: ErrBadPriority, ErrTooLarge
// (nothing written), or a ZooKeeper error.
func (q *Queue) Publish(ctx context.Context, priority int, payload []byte) (string, error) {
	return q.PublishPriority(ctx, priority, payload)
}

// PublishBatch adds all items atomically in one Multi transaction: either
// all are published or none. Items of equal priority keep their order in
// the batch. Errors: ErrEmptyBatch, ErrBadPriority, ErrTooLarge,
// ErrBatchTooLarge (all before anything is written), or a ZooKeeper error
// (nothing written).
func (q *Queue) PublishBatch(ctx context.Context, items []Item) ([]string, error) {
	return q.PublishAll(ctx, items)
}
