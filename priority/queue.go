package priority

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/qcore"
)

// Message is a message taken from or peeked at in a queue. Its Priority
// field holds the priority it was published with.
type Message = qcore.Message

// Sentinel errors, wrapped with the operation and path; use errors.Is. They
// are the values package zkqueue re-exports, so errors.Is works whichever
// package a caller checks against.
var (
	ErrEmpty         = qcore.ErrEmpty         // TryDequeue, Peek: nothing to take
	ErrTooLarge      = qcore.ErrTooLarge      // payload over the limit
	ErrBatchTooLarge = qcore.ErrBatchTooLarge // batch over the count or byte limit
	ErrEmptyBatch    = qcore.ErrEmptyBatch    // PublishBatch with no items
	ErrBadData       = qcore.ErrBadData       // a message node with a corrupt header
	ErrBadPriority   = qcore.ErrBadPriority   // priority outside [0, MaxPriority]
)

// Priorities: 0 is the most urgent, MaxPriority the least.
const (
	MinPriority = 0
	MaxPriority = qcore.MaxPriority
)

// Default limits.
const (
	DefaultMaxPayload    = qcore.DefaultMaxPayload
	DefaultMaxBatchBytes = qcore.DefaultMaxBatchBytes
	DefaultMaxBatchCount = qcore.DefaultMaxBatchCount
)

// Option configures a Queue.
type Option func(*qcore.Config)

// WithMaxPayload sets the largest payload Publish accepts (default 512 KiB;
// at most just under 1 MiB).
func WithMaxPayload(n int) Option { return func(c *qcore.Config) { c.MaxPayload = n } }

// WithMaxBatchBytes bounds the total size of one PublishBatch.
func WithMaxBatchBytes(n int) Option { return func(c *qcore.Config) { c.MaxBatchBytes = n } }

// WithMaxBatchCount bounds the number of messages in one PublishBatch.
func WithMaxBatchCount(n int) Option { return func(c *qcore.Config) { c.MaxBatchCount = n } }

// WithLogger sets the logger for skipped foreign nodes; default discards.
func WithLogger(l *slog.Logger) Option { return func(c *qcore.Config) { c.Logger = l } }

// WithConflictHook sets a function called once per lost race for the head.
func WithConflictHook(f func()) Option { return func(c *qcore.Config) { c.ConflictHook = f } }

// Item is one message of a PublishBatch.
type Item struct {
	Priority int // 0 (most urgent) to MaxPriority
	Payload  []byte
}

// Queue is a priority queue under one ZooKeeper path. It is safe for
// concurrent use; share one Queue among the goroutines of a process so they
// share one snapshot and never collide with each other.
type Queue struct {
	store *qcore.Store
}

// New returns the queue at path, creating path and its parents as needed.
func New(conn *zk.Conn, path string, opts ...Option) (*Queue, error) {
	var cfg qcore.Config
	for _, o := range opts {
		o(&cfg)
	}
	// Strict: a claim never works from a snapshot older than the last
	// change of the children (see the package doc).
	cfg.Strict = true
	s, err := qcore.NewStore(conn, path, cfg)
	if err != nil {
		return nil, fmt.Errorf("priority: %w", err)
	}
	return &Queue{store: s}, nil
}

// Path returns the queue's node.
func (q *Queue) Path() string { return q.store.Path() }

func (q *Queue) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("priority: %s %s: %w", op, q.store.Path(), err)
}

func checkPriority(p int) error {
	if p < MinPriority || p > MaxPriority {
		return fmt.Errorf("%w: %d not in [%d, %d]", ErrBadPriority, p, MinPriority, MaxPriority)
	}
	return nil
}

// Publish adds payload with the given priority and returns the message id
// (its node name, "p007-0000000042"). Errors: ErrBadPriority, ErrTooLarge
// (nothing written), or a ZooKeeper error.
func (q *Queue) Publish(ctx context.Context, priority int, payload []byte) (string, error) {
	if err := checkPriority(priority); err != nil {
		return "", q.wrap("publish", err)
	}
	id, err := q.store.Publish(ctx, qcore.PriorityPrefix(priority), payload)
	return id, q.wrap("publish", err)
}

// PublishBatch adds all items atomically in one Multi transaction: either
// all are published or none. Items of equal priority keep their order in
// the batch. Errors: ErrEmptyBatch, ErrBadPriority, ErrTooLarge,
// ErrBatchTooLarge (all before anything is written), or a ZooKeeper error
// (nothing written).
func (q *Queue) PublishBatch(ctx context.Context, items []Item) ([]string, error) {
	prefixes := make([]string, len(items))
	payloads := make([][]byte, len(items))
	for i, it := range items {
		if err := checkPriority(it.Priority); err != nil {
			return nil, q.wrap("publish batch", fmt.Errorf("item %d: %w", i, err))
		}
		prefixes[i] = qcore.PriorityPrefix(it.Priority)
		payloads[i] = it.Payload
	}
	ids, err := q.store.PublishBatch(ctx, prefixes, payloads)
	return ids, q.wrap("publish batch", err)
}

// TryDequeue takes the most urgent message (the oldest among equals) or
// returns ErrEmpty.
func (q *Queue) TryDequeue(ctx context.Context) (Message, error) {
	m, err := q.store.TryDequeue(ctx)
	return m, q.wrap("dequeue", err)
}

// Dequeue takes the most urgent message (the oldest among equals), waiting
// on a children watch until one is published or ctx ends (then it returns
// ctx.Err()).
func (q *Queue) Dequeue(ctx context.Context) (Message, error) {
	m, err := q.store.Dequeue(ctx)
	return m, q.wrap("dequeue", err)
}

// Peek returns the most urgent message without taking it, or ErrEmpty. It
// always reads a fresh child list.
func (q *Queue) Peek(ctx context.Context) (Message, error) {
	m, err := q.store.Peek(ctx)
	return m, q.wrap("peek", err)
}

// Len returns the number of messages, read from the queue node's Stat
// (NumChildren) without listing them.
func (q *Queue) Len(ctx context.Context) (int, error) {
	n, err := q.store.Len(ctx)
	return n, q.wrap("len", err)
}

// Purge deletes all messages present when it starts and returns how many.
func (q *Queue) Purge(ctx context.Context) (int, error) {
	n, err := q.store.Purge(ctx)
	return n, q.wrap("purge", err)
}
