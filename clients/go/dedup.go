package qbroker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// defaultPublishRetries is how often a Publish whose messages all carry
// dedup ids is retried after ErrUnavailable, unless WithPublishRetries
// says otherwise.
const defaultPublishRetries = 4

// WithDedupID sets a message's deduplication id, [A-Za-z0-9._-]{1,128},
// not "." or "..": a publish repeating it within the queue's dedup window
// (QueueConfig.DedupWindow, default 5 minutes), through any broker, is
// answered with the first message's id and publishes nothing. A Publish
// whose messages all carry one is retried when it fails ErrUnavailable.
func WithDedupID(id string) PublishOption {
	return func(m *OutMessage) { m.DedupID = id }
}

// WithPublishRetries makes every Publish and PublishBatch safe to retry:
// a message without a dedup id gets a random one (32 hex digits), and a
// call failing with ErrUnavailable (or its call timeout, WithCallTimeout,
// while its context lives) is sent again with the same ids, up to n more
// times, with the client's backoff (WithReconnectBackoff) in between; the
// broker publishes each message once. Each message then costs the broker
// its dedup record too. n = 0 turns retries off. Without this option, a
// publish is retried (up to 4 times) only when the caller gave every
// message a dedup id.
func WithPublishRetries(n int) Option {
	return func(o *options) {
		o.publishRetries, o.autoDedup = max(n, 0), n > 0
	}
}

// Receipt is the outcome of one message of PublishReceipts.
type Receipt struct {
	// ID is the message's id; for a duplicate, the first publish's
	// (empty in the rare case that the broker which published it failed
	// before recording it).
	ID string
	// Duplicate: the message repeated a dedup id within the queue's
	// window, so it was not published again. After a retry, the repeat may
	// be of this call's own earlier attempt, whose answer was lost.
	Duplicate bool
}

// PublishReceipts is PublishBatch telling which messages were repeats of
// a dedup id.
func (c *Client) PublishReceipts(ctx context.Context, queue string, msgs []OutMessage) ([]Receipt, error) {
	req := &pb.PublishRequest{Queue: queue, Messages: make([]*pb.OutMessage, len(msgs))}
	all := len(msgs) > 0
	for i, m := range msgs {
		if m.Priority < 0 {
			return nil, errorf("qbroker: publish to %s: negative priority %d: %w", queue, m.Priority, ErrInvalidArgument)
		}
		if m.DedupID == "" && c.opts.autoDedup {
			m.DedupID = newDedupID()
		}
		all = all && m.DedupID != ""
		// Protocol buffers cannot carry invalid UTF-8 in a string: say so
		// here rather than fail to encode the request.
		if err := checkUTF8(m); err != nil {
			return nil, errorf("qbroker: publish to %s: message %d: %w", queue, i, err)
		}
		req.Messages[i] = &pb.OutMessage{Payload: m.Payload, Priority: uint32(m.Priority), DedupId: m.DedupID,
			Headers: m.Headers, ContentType: m.ContentType, Group: m.Group}
		if m.Delay != 0 {
			req.Messages[i].Delay = durationpb.New(m.Delay)
		}
		if !m.DeliverAt.IsZero() {
			req.Messages[i].DeliverAt = timestamppb.New(m.DeliverAt)
		}
	}
	retries := 0
	if all {
		retries = c.opts.publishRetries
	}
	bo := newBackoff(c.opts.minBackoff, c.opts.maxBackoff)
	for attempt := 0; ; attempt++ {
		resp, err := c.publishOnce(ctx, req)
		if err == nil {
			return receipts(queue, resp, len(msgs))
		}
		err = convErr(err)
		if attempt >= retries || !retriablePublish(ctx, err) {
			return nil, errorf("qbroker: publish to %s: %w", queue, err)
		}
		t := time.NewTimer(bo.next())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, errorf("qbroker: publish to %s: %w (retrying after: %w)", queue, ctx.Err(), err)
		}
	}
}

func (c *Client) publishOnce(ctx context.Context, req *pb.PublishRequest) (*pb.PublishResponse, error) {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	return c.rpc.Publish(ctx, req)
}

// retriablePublish reports whether a publish with dedup ids that failed
// with err may be sent again: the broker was unavailable, or the call's
// own timeout ran out while the caller's context lives.
func retriablePublish(ctx context.Context, err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
}

func receipts(queue string, resp *pb.PublishResponse, n int) ([]Receipt, error) {
	ids, dups := resp.GetIds(), resp.GetDuplicates()
	if len(ids) != n || len(dups) != 0 && len(dups) != n {
		return nil, errorf("qbroker: publish to %s: %d ids and %d duplicate flags for %d messages: %w", queue, len(ids), len(dups), n, ErrInternal)
	}
	out := make([]Receipt, n)
	for i, id := range ids {
		out[i].ID = id
		if len(dups) > 0 {
			out[i].Duplicate = dups[i]
		}
	}
	return out, nil
}

// newDedupID returns 128 random bits in hex.
func newDedupID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return hex.EncodeToString(b[:])
}
