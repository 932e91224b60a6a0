package qbroker

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"
	"unicode/utf8"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// DeliveryMode is chosen per Consume or Receive call. The zero value is
// AtMostOnce.
type DeliveryMode int

const (
	// AtMostOnce: the claim deletes the message. It is never delivered
	// twice, and lost if the consumer dies before handling it.
	AtMostOnce DeliveryMode = iota
	// AtLeastOnce: the claim takes a lease. Ack deletes the message; Nack,
	// or the lease running out (the visibility timeout), redelivers it.
	AtLeastOnce
)

var modeNames = []string{"at-most-once", "at-least-once"}

// String returns "at-most-once" or "at-least-once".
func (m DeliveryMode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("DeliveryMode(%d)", int(m))
}

// MarshalText implements encoding.TextMarshaler.
func (m DeliveryMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: "at-most-once" or
// "at-least-once".
func (m *DeliveryMode) UnmarshalText(b []byte) error {
	for i, n := range modeNames {
		if string(b) == n {
			*m = DeliveryMode(i)
			return nil
		}
	}
	return errorf("qbroker: unknown delivery mode %q (want at-most-once or at-least-once): %w", b, ErrInvalidArgument)
}

func (m DeliveryMode) toPB() (pb.DeliveryMode, error) {
	switch m {
	case AtMostOnce:
		return pb.DeliveryMode_DELIVERY_MODE_AT_MOST_ONCE, nil
	case AtLeastOnce:
		return pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE, nil
	}
	return 0, errorf("qbroker: unknown delivery mode %d: %w", int(m), ErrInvalidArgument)
}

// maxNackDelay is the broker's bound on a nack's delay.
const maxNackDelay = 12 * time.Hour

// Message is a delivered message. Its fields are read-only. Its methods
// are safe for concurrent use; settle a message once (a second Ack fails
// with ErrFailedPrecondition).
type Message struct {
	// Queue the message came from.
	Queue string
	// ID is unique in its queue.
	ID string
	// Payload is the message body.
	Payload []byte
	// Priority (KindPriority queues; 0 otherwise).
	Priority int
	// PublishedAt is when the message was first published.
	PublishedAt time.Time
	// DeliveryCount is how many times the message was delivered, this
	// delivery included.
	DeliveryCount int
	// LeaseDeadline is when an at-least-once delivery's lease runs out
	// and the message becomes deliverable again (zero at most once).
	LeaseDeadline time.Time
	// Headers are the string key/value pairs published with the message
	// (nil when none).
	Headers map[string]string
	// ContentType is the content type published with the message.
	ContentType string
	// Group is the message's group (WithGroup); empty when none.
	Group string
	// FencingToken (at least once) is greater than that of every earlier
	// delivery of the same message, across redeliveries, brokers and
	// broker restarts; 0 at most once. Store it with the effect of
	// handling the message and refuse a write whose token is not greater
	// than the stored one: a consumer paused past its lease then cannot
	// overwrite the work of the message's next delivery (see
	// docs/fencing.md).
	FencingToken uint64

	client   *Client
	token    string    // opaque ack token; any broker accepts it
	consumer *Consumer // nil unless delivered by a Consumer
	gen      uint64    // the Consumer's stream that delivered it
	settled  atomic.Bool
}

func (c *Client) messages(ms []*pb.Message, cons *Consumer, gen uint64) []*Message {
	out := make([]*Message, len(ms))
	for i, m := range ms {
		out[i] = c.message(m, cons, gen)
	}
	return out
}

func (c *Client) message(m *pb.Message, cons *Consumer, gen uint64) *Message {
	msg := &Message{
		Queue:         m.GetQueue(),
		ID:            m.GetId(),
		Payload:       m.GetPayload(),
		Priority:      int(m.GetPriority()),
		PublishedAt:   m.GetPublishedAt().AsTime(),
		DeliveryCount: int(m.GetDeliveryCount()),
		Headers:       m.GetHeaders(),
		ContentType:   m.GetContentType(),
		Group:         m.GetGroup(),
		FencingToken:  m.GetFencingToken(),
		client:        c,
		token:         m.GetAckToken(),
		consumer:      cons,
		gen:           gen,
	}
	if m.GetLeaseDeadline() != nil {
		msg.LeaseDeadline = m.GetLeaseDeadline().AsTime()
	}
	return msg
}

// Ack acknowledges an at-least-once delivery: the message is gone. For a
// message from a Consumer whose stream is still open, the ack travels on
// the stream and Ack returns once the stream took it: it goes with the
// stream's next request, within a millisecond (the broker reports no
// outcome; an ack the stream's end leaves unsent is like one sent and not
// applied: the message is redelivered), or, with ConsumeOptions.Confirm,
// once the broker answered that it committed; otherwise Ack calls the
// broker, and returns once the ack committed. Errors: ErrNoLease
// (delivered at most once), ErrFailedPrecondition (the lease is unknown
// or expired, for example already acked or past its visibility timeout),
// with Confirm ErrUnavailable when the stream broke before the answer.
func (m *Message) Ack(ctx context.Context) error {
	return m.settle(ctx, false, 0)
}

// Nack releases an at-least-once delivery for redelivery, after delay (0:
// at once; at most 12h). It travels like Ack. Errors: as Ack, and
// ErrInvalidArgument for a delay out of range.
func (m *Message) Nack(ctx context.Context, delay time.Duration) error {
	return m.settle(ctx, true, delay)
}

func (m *Message) settle(ctx context.Context, nack bool, delay time.Duration) error {
	op := "ack"
	if nack {
		op = "nack"
	}
	if m.token == "" {
		return errorf("qbroker: %s %s/%s: %w", op, m.Queue, m.ID, ErrNoLease)
	}
	if delay < 0 || delay > maxNackDelay {
		return errorf("qbroker: nack %s/%s: delay %v out of range [0, %v]: %w", m.Queue, m.ID, delay, maxNackDelay, ErrInvalidArgument)
	}
	if m.consumer != nil && m.settled.CompareAndSwap(false, true) {
		sent, err := m.consumer.settle(ctx, m, nack, delay)
		switch {
		case sent && err != nil: // the broker's answer (ConsumeOptions.Confirm)
			return errorf("qbroker: %s %s/%s: %w", op, m.Queue, m.ID, err)
		case sent:
			return nil
		case err != nil:
			m.settled.Store(false) // not handed over: may be settled again
			return err
		}
	}
	ctx, cancel := m.client.callCtx(ctx, 0)
	defer cancel()
	var err error
	if nack {
		_, err = m.client.rpc.Nack(ctx, &pb.NackRequest{AckToken: m.token, Delay: durationOrNil(delay)})
	} else {
		_, err = m.client.rpc.Ack(ctx, &pb.AckRequest{AckToken: m.token})
	}
	if err != nil {
		return errorf("qbroker: %s %s/%s: %w", op, m.Queue, m.ID, convErr(err))
	}
	return nil
}

// Extend pushes the lease of an at-least-once delivery out to d from now
// (0: the queue's visibility timeout) and returns the new deadline.
// Errors: ErrNoLease, ErrFailedPrecondition (unknown or expired lease),
// ErrInvalidArgument (d out of the broker's range).
func (m *Message) Extend(ctx context.Context, d time.Duration) (time.Time, error) {
	if m.token == "" {
		return time.Time{}, errorf("qbroker: extend %s/%s: %w", m.Queue, m.ID, ErrNoLease)
	}
	if d < 0 {
		return time.Time{}, errorf("qbroker: extend %s/%s: negative lease %v: %w", m.Queue, m.ID, d, ErrInvalidArgument)
	}
	ctx, cancel := m.client.callCtx(ctx, 0)
	defer cancel()
	resp, err := m.client.rpc.ExtendLease(ctx, &pb.ExtendLeaseRequest{AckToken: m.token, VisibilityTimeout: durationOrNil(d)})
	if err != nil {
		return time.Time{}, errorf("qbroker: extend %s/%s: %w", m.Queue, m.ID, convErr(err))
	}
	return resp.GetLeaseDeadline().AsTime(), nil
}

// OutMessage is one message of PublishBatch.
type OutMessage struct {
	Payload []byte
	// Priority: KindPriority queues only, 0 (most urgent) .. 255.
	Priority int
	// DedupID makes the publish idempotent (see WithDedupID); empty:
	// none.
	DedupID string
	// Delay keeps the message invisible this long, then it joins the
	// tail of the queue (at most the broker's --max-delay, 15 minutes by
	// default). Not with DeliverAt.
	Delay time.Duration
	// DeliverAt keeps the message invisible until then (a past time means
	// now). Not with Delay.
	DeliverAt time.Time
	// Headers are string key/value pairs delivered with the message: at
	// most 64, keys non-empty and at most 256 bytes, keys and values
	// valid UTF-8, at most 16 KiB with ContentType. They count against
	// the broker's payload and batch byte limits.
	Headers map[string]string
	// ContentType describes the payload ("application/json"); free-form
	// UTF-8, delivered with the message.
	ContentType string
	// Group puts the message in a message group (see WithGroup); empty:
	// none.
	Group string
}

// PublishOption configures Publish.
type PublishOption func(*OutMessage)

// WithPriority sets a message's priority: 0 (most urgent) .. 255, for
// KindPriority queues only.
func WithPriority(p int) PublishOption {
	return func(m *OutMessage) { m.Priority = p }
}

// WithDelay delays a message's delivery by d: it stays invisible (counted
// in Stats.Delayed) until then, and joins the tail of the queue when due.
// Its publish id names the delayed message; it is delivered under the id
// it gets in the queue.
func WithDelay(d time.Duration) PublishOption {
	return func(m *OutMessage) { m.Delay = d }
}

// WithDeliverAt delays a message's delivery until t (see WithDelay).
func WithDeliverAt(t time.Time) PublishOption {
	return func(m *OutMessage) { m.DeliverAt = t }
}

// WithHeaders adds headers to a message (see OutMessage.Headers); later
// options add to and override earlier ones.
func WithHeaders(h map[string]string) PublishOption {
	return func(m *OutMessage) {
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(h))
		}
		maps.Copy(m.Headers, h)
	}
}

// WithHeader adds one header to a message.
func WithHeader(key, value string) PublishOption {
	return WithHeaders(map[string]string{key: value})
}

// WithContentType sets a message's content type.
func WithContentType(ct string) PublishOption {
	return func(m *OutMessage) { m.ContentType = ct }
}

// WithGroup puts a message in a message group, [A-Za-z0-9._-]{1,128},
// not "." or "..": the messages of one group are delivered in publish
// order and one at a time (the next once the previous is acked,
// dead-lettered or dropped; a nacked or expired one comes again first),
// by any broker; other groups and messages without a group are delivered
// in parallel. Not for KindSync queues.
func WithGroup(g string) PublishOption {
	return func(m *OutMessage) { m.Group = g }
}

// Publish publishes one message and returns its id. Without a dedup id
// (WithDedupID, or WithPublishRetries on the client) Publish is not
// retried: when it fails with ErrUnavailable, or with the context's
// DeadlineExceeded or Canceled (the broker may have applied it after the
// caller stopped waiting), the message may or may not have been
// published, so do not publish it again blindly. With one, it is retried
// when it fails ErrUnavailable (see WithPublishRetries), and may be
// repeated by the caller within the queue's dedup window: the message is
// published once. Errors: ErrNotFound, ErrInvalidArgument (payload over
// the limit, priority out of range, a malformed dedup id, a delay negative,
// over the broker's maximum or given with DeliverAt, headers or content
// type out of bounds or not UTF-8),
// ErrFailedPrecondition (a priority on a queue that is not KindPriority).
func (c *Client) Publish(ctx context.Context, queue string, payload []byte, opts ...PublishOption) (string, error) {
	m := OutMessage{Payload: payload}
	for _, o := range opts {
		o(&m)
	}
	ids, err := c.PublishBatch(ctx, queue, []OutMessage{m})
	if err != nil {
		return "", err
	}
	return ids[0], nil
}

// PublishBatch publishes messages atomically, all or none, in order, and
// returns their ids; a message repeating a dedup id gets the first
// publish's id (PublishReceipts tells them apart). Errors: as Publish, and
// ErrInvalidArgument for an empty batch or one over the broker's count or
// size limit.
func (c *Client) PublishBatch(ctx context.Context, queue string, msgs []OutMessage) ([]string, error) {
	rs, err := c.PublishReceipts(ctx, queue, msgs)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids, nil
}

// ReceiveOptions configure Receive. The zero value takes one message at
// most once, without waiting.
type ReceiveOptions struct {
	// Max messages to return: 0 means 1, at most 100.
	Max int
	// Wait for the first message up to this long (at most 60s); 0
	// returns at once.
	Wait time.Duration
	// Mode of delivery; default AtMostOnce.
	Mode DeliveryMode
	// Visibility is the lease of AtLeastOnce deliveries; 0 means the
	// queue's visibility timeout.
	Visibility time.Duration
}

// Receive takes up to o.Max messages, waiting up to o.Wait for the first
// one; it returns no messages and no error when the wait runs out. It
// returns fewer than o.Max when more would not fit one response (4 MiB);
// the rest stay in the queue. At least once, a message whose lease had run
// out by the time the answer arrived is left out: the broker redelivers
// it. Receive is not retried. Ack and Nack of its messages call the broker.
// Errors: ErrNotFound, ErrInvalidArgument (options out of range),
// ErrFailedPrecondition (a KindSync queue that is not open).
func (c *Client) Receive(ctx context.Context, queue string, o ReceiveOptions) ([]*Message, error) {
	mode, err := o.Mode.toPB()
	if err != nil {
		return nil, err
	}
	if o.Max < 0 || o.Wait < 0 || o.Visibility < 0 {
		return nil, errorf("qbroker: receive from %s: negative option: %w", queue, ErrInvalidArgument)
	}
	ctx, cancel := c.callCtx(ctx, o.Wait)
	defer cancel()
	resp, err := c.rpc.Receive(ctx, &pb.ReceiveRequest{
		Queue:             queue,
		MaxMessages:       uint32(o.Max),
		Wait:              durationOrNil(o.Wait),
		Mode:              mode,
		VisibilityTimeout: durationOrNil(o.Visibility),
	})
	if err != nil {
		return nil, errorf("qbroker: receive from %s: %w", queue, convErr(err))
	}
	ms := c.messages(resp.GetMessages(), nil, 0)
	now := time.Now()
	return slices.DeleteFunc(ms, func(m *Message) bool {
		return !m.LeaseDeadline.IsZero() && !now.Before(m.LeaseDeadline)
	}), nil
}

// checkUTF8 refuses attributes that are not valid UTF-8 with
// ErrInvalidArgument.
func checkUTF8(m OutMessage) error {
	if !utf8.ValidString(m.ContentType) {
		return fmt.Errorf("content type is not UTF-8: %w", ErrInvalidArgument)
	}
	for k, v := range m.Headers {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("header %q is not UTF-8: %w", k, ErrInvalidArgument)
		}
	}
	return nil
}
