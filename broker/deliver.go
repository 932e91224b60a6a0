package broker

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/zkqueue"
)

// MaxResponseBytes bounds every message the broker sends: 4 MiB, gRPC's
// default receive limit in every language, less a 64 KiB margin for what
// the size estimate of a response leaves out. Receive answers with fewer
// messages than asked for rather than more bytes, and list calls page,
// so a client with default settings can receive every answer. The
// largest payload (under 1 MiB) always fits.
const MaxResponseBytes = 4<<20 - 64<<10

// consumeBatchBytes bounds what a Consume stream claims at once beyond
// what it has sent: about one HTTP/2 stream window (64 KiB), so that the
// messages it holds claimed can be handed to the transport at once (the
// first one always fits, whatever its size).
const consumeBatchBytes = 64 << 10

// msgOverhead bounds what a delivered message of queue costs on the wire
// beyond its payload: the queue name (twice: in the message and in the
// ack token), id, lease name, timestamps, counts and protobuf framing.
func msgOverhead(queue string) int { return 2*len(queue) + 512 }

// room is the byte budget of one answer's messages from q.
func room(q *queue, bytes int) zkqueue.Room {
	return zkqueue.Room{Bytes: bytes, Overhead: msgOverhead(q.name)}
}

// sendMargin is how much of a lease must be left for the broker to hand
// the delivery to the transport: max(200ms, ttl/10), but at most half the
// lease. It covers the time to reach the consumer and clock differences.
func sendMargin(ttl time.Duration) time.Duration {
	return min(max(200*time.Millisecond, ttl/10), ttl/2)
}

// claimed is one message taken for a consumer and not yet sent.
type claimed struct {
	msg     *pb.Message
	m       zkqueue.Message
	lease   string    // at least once: the lease node's name
	expires time.Time // at least once: the lease deadline
	session int64     // the broker's session count when claimed
}

// sendable reports whether a claimed delivery may still be handed to the
// transport. At most once always (the message is deleted: not sending it
// would lose it). At least once only if its lease has sendMargin left and
// the broker has kept its ZooKeeper session since the claim: a broker
// paused (or cut off) long enough may find its leases expired and their
// messages redelivered elsewhere.
func (b *Broker) sendable(d delivery, c claimed) bool {
	if !d.ack {
		return true
	}
	return time.Until(c.expires) > sendMargin(d.ttl) && b.hasSession.Load() && b.sessions.Load() == c.session
}

// unsent gives back at once, and counts, an at-least-once delivery that
// will not be sent. The claim is undone: the message keeps its place and
// its delivery count. If the sweep has released the lease already, or the
// release fails, the sweep's release stands.
func (b *Broker) unsent(q *queue, c claimed) {
	b.metrics.expiredUnsent.WithLabelValues(q.label).Inc()
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := q.leases.Unclaim(ctx, c.lease); err != nil {
		b.log.Debug("giving back an unsent delivery failed; the sweep releases it", "queue", q.name, "err", err)
	}
}

// releaseTimeout bounds a release that runs without the caller's context.
const releaseTimeout = 10 * time.Second

// delivered accounts for a delivery handed to the transport.
func (b *Broker) delivered(q *queue, d delivery, c claimed) {
	mode := modeAtMostOnce
	if d.ack {
		mode = modeAtLeastOnce
	}
	b.metrics.delivered.WithLabelValues(q.label, mode).Inc()
	b.metrics.queueTime.WithLabelValues(q.label).Observe(time.Since(c.m.Published).Seconds())
	if c.m.Deliveries > 1 {
		b.metrics.redelivered.WithLabelValues(q.label).Inc()
	}
	if b.events != nil {
		b.emit(events.Delivered, q, c.m, "")
	}
}

// delivery settings of one consume or receive call.
type delivery struct {
	ack bool          // at-least-once
	ttl time.Duration // lease
}

func (b *Broker) deliverySettings(q *queue, mode pb.DeliveryMode, vis time.Duration) (delivery, error) {
	switch mode {
	case pb.DeliveryMode_DELIVERY_MODE_UNSPECIFIED, pb.DeliveryMode_DELIVERY_MODE_AT_MOST_ONCE:
		return delivery{}, nil
	case pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE:
		ttl, err := clampDuration("visibility_timeout", vis, q.meta.Visibility, minVisibility, maxVisibility)
		return delivery{ack: true, ttl: ttl}, err
	}
	return delivery{}, invalidf("unknown delivery mode %d", mode)
}

// want is what a take asks for: up to max messages, at most maxBytes of
// them on the wire, waiting for the first when block is set.
type want struct {
	max, maxBytes int
	block         bool
}

// take claims up to w.max messages, and no more than w.maxBytes of them on the
// wire (see MaxResponseBytes; the first always fits), in queue order,
// waiting for the first when w.block is set (zkqueue.Queue.Take: the claims
// run concurrently and their writes share a Multi). A message that does
// not fit is not claimed: it stays at its place in the queue. The caller
// sends each (see sendable) and accounts for it with delivered.
func (b *Broker) take(ctx context.Context, q *queue, d delivery, w want) ([]claimed, error) {
	if q.sync != nil {
		if err := q.sync.checkOpen(ctx); err != nil {
			return nil, err
		}
	}
	session := b.sessions.Load()
	var out []claimed
	if d.ack {
		ls, err := q.leases.Take(ctx, w.max, room(q, w.maxBytes), d.ttl, w.block)
		if err != nil {
			return nil, b.gone(q, err)
		}
		return b.leased(q, ls, session), nil
	}
	ms, err := q.items.Take(ctx, w.max, room(q, w.maxBytes), w.block)
	if err != nil {
		return nil, b.gone(q, err)
	}
	out = make([]claimed, 0, len(ms))
	for _, m := range ms {
		out = append(out, claimed{msg: toPB(q.name, m, nil), m: m, session: session})
	}
	return out, nil
}

// leased wraps at-least-once claims made while the broker's session count
// was session.
func (b *Broker) leased(q *queue, ls []zkqueue.Lease, session int64) []claimed {
	out := make([]claimed, 0, len(ls))
	for i := range ls {
		out = append(out, claimed{msg: b.leasedPB(q.name, &ls[i]), m: ls[i].Message,
			lease: ls[i].Token, expires: ls[i].Deadline, session: session})
	}
	return out
}

// toPB converts a delivered message; the lease deadline is set for
// at-least-once deliveries (leasedPB adds their token).
func toPB(queue string, m zkqueue.Message, l *zkqueue.Lease) *pb.Message {
	out := &pb.Message{
		Queue:         queue,
		Id:            m.ID,
		Payload:       m.Payload,
		Priority:      uint32(m.Priority),
		PublishedAt:   timestamppb.New(m.Published),
		DeliveryCount: uint32(m.Deliveries),
		Headers:       m.Headers,
		ContentType:   m.ContentType,
		Group:         m.Group,
	}
	if l != nil {
		out.LeaseDeadline = timestamppb.New(l.Deadline)
		out.FencingToken = l.FencingToken
	}
	return out
}

// leasedPB converts an at-least-once delivery, with its signed ack token.
func (b *Broker) leasedPB(queue string, l *zkqueue.Lease) *pb.Message {
	out := toPB(queue, l.Message, l)
	out.AckToken = makeToken(b.tokens, queue, *l)
	return out
}
