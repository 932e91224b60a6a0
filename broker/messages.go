package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/zkqueue"
)

// Request limits.
const (
	maxReceive    = 100
	maxWait       = 60 * time.Second
	maxNackDelay  = 12 * time.Hour
	maxDeadLimit  = 1000
	defaultDeadLn = 100
)

const (
	modeAtMostOnce  = "at_most_once"
	modeAtLeastOnce = "at_least_once"
)

// Publish implements pb.QueueServer.
func (b *Broker) Publish(ctx context.Context, req *pb.PublishRequest) (*pb.PublishResponse, error) {
	q, err := b.handles.queue(ctx, req.GetQueue())
	if err != nil {
		return nil, b.fail(err)
	}
	msgs := req.GetMessages()
	if len(msgs) == 0 {
		return nil, b.fail(invalidf("no messages to publish"))
	}
	// Each option is looked for once here: a message without it does not
	// enter its feature's code (schedule.go, dedup.go, quota.go).
	drafts := make([]zkqueue.Draft, len(msgs))
	var timed, dedup bool
	var payload int64 // what the quotas and the data budget count
	for i, m := range msgs {
		drafts[i] = zkqueue.Draft{Payload: m.GetPayload(), Priority: int(m.GetPriority()), DedupID: m.GetDedupId(),
			Attributes: zkqueue.Attributes{ContentType: m.GetContentType(), Headers: m.GetHeaders(), Group: m.GetGroup()}}
		if drafts[i].Group != "" && q.meta.Kind == kindSync {
			return nil, b.fail(wrongKind(q, "message groups need a FIFO or PRIORITY queue"))
		}
	}
	// The engine checks each message, once: Check marks the drafts, and
	// the publish below does not check them again.
	if err := q.items.Check(drafts); err != nil {
		var de *zkqueue.DraftError
		if errors.As(err, &de) {
			err = ofMessage(q, de.Index, de.Err)
		}
		return nil, b.fail(err)
	}
	for i, m := range msgs {
		if err := checkOptions(q, i, m, drafts[i]); err != nil {
			return nil, b.fail(err)
		}
		timed = timed || m.GetDelay() != nil || m.GetDeliverAt() != nil
		dedup = dedup || drafts[i].DedupID != ""
		// A message's attributes are stored in its node beside the
		// payload: they count as payload bytes.
		payload += int64(drafts[i].Size())
	}
	var due []time.Time
	delayed := false
	if timed {
		var err error
		if due, delayed, err = b.sched.dueTimes(msgs); err != nil {
			return nil, b.fail(err)
		}
	}
	// A depth or data quota: the queue's own or the broker's --max-depth.
	quota := q.meta.MaxDepth > 0 || b.cfg.MaxDepth > 0 || q.meta.MaxBytes > 0
	if quota {
		if err := b.handles.admitQuota(ctx, q, len(drafts), payload); err != nil {
			return nil, b.fail(b.handles.gone(q, err))
		}
	}
	// The data budget counts the payloads with their headers and paths
	// (MessageOverhead), and the per-node charge.
	if b.zkmem.budget > 0 {
		charge := DataCharge*(payload+int64(len(drafts)*q.items.MessageOverhead())) + int64(len(drafts))*NodeCharge
		if err := b.zkmem.admit(charge); err != nil {
			return nil, b.fail(err)
		}
	}
	if quota && q.meta.MaxBytes > 0 {
		q.addData(payload)
	}
	if dedup {
		return b.publishIdempotent(ctx, q, drafts, due, delayed)
	}
	var ids []string
	if delayed {
		ids, err = b.sched.publishDue(ctx, q, drafts, due)
	} else if len(msgs) == 1 {
		var id string
		id, err = q.items.PublishDraft(ctx, drafts[0])
		ids = []string{id}
	} else {
		ids, err = q.items.PublishAll(ctx, drafts)
	}
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	if quota {
		q.published(len(ids))
	}
	b.metrics.published.WithLabelValues(q.label).Add(float64(len(ids)))
	if b.ev.sink != nil {
		for i, id := range ids {
			b.ev.emit(events.Published, q, zkqueue.Message{ID: id, Payload: drafts[i].Payload, Priority: drafts[i].Priority,
				Attributes: drafts[i].Attributes}, "")
		}
	}
	return &pb.PublishResponse{Ids: ids}, nil
}

// checkOptions checks how message i of a publish to q, d its draft
// (checked by the engine: zkqueue.Queue.Check), mixes a group with the
// delay and TTL options, before admit charges the quotas with it: a
// refused message changes nothing. The engine checks the message itself
// (priority, dedup id, group, attributes, size); the broker adds only
// what the engine does not know (queue kinds, the options), and toStatus
// says the engine's refusals in the broker's words.
func checkOptions(q *queue, i int, m *pb.OutMessage, d zkqueue.Draft) error {
	if d.Group == "" {
		return nil
	}
	// A delayed message joins the queue through the delayed parent and
	// an expired one is removed without its group entry: neither keeps a
	// group's order, so neither mixes with groups. Each refusal names
	// both options.
	if due := dueOption(m); due != "" {
		return invalidf("message %d: group and %s cannot be combined: a delayed message would join the queue outside its group's order", i, due)
	}
	if q.meta.MessageTTL > 0 {
		return wrongKind(q, fmt.Sprintf("message %d: a group needs a queue without message_ttl: an expired message would leave its group's entry behind", i))
	}
	return nil
}

// Receive implements pb.QueueServer.
func (b *Broker) Receive(ctx context.Context, req *pb.ReceiveRequest) (*pb.ReceiveResponse, error) {
	q, err := b.handles.queue(ctx, req.GetQueue())
	if err != nil {
		return nil, b.fail(err)
	}
	if q.meta.SingleActive {
		return nil, b.fail(fmt.Errorf("%w: queue %s has a single active consumer: consume it with a Consume stream", errWrongKind, q.name))
	}
	d, err := b.claims.deliverySettings(q, req.GetMode(), req.GetVisibilityTimeout().AsDuration())
	if err != nil {
		return nil, b.fail(err)
	}
	max := int(req.GetMaxMessages())
	if max == 0 {
		max = 1
	}
	if max > maxReceive {
		return nil, b.fail(invalidf("max_messages %d > %d", max, maxReceive))
	}
	wait := req.GetWait().AsDuration()
	if wait < 0 || wait > maxWait {
		return nil, b.fail(invalidf("wait %v out of range [0, %v]", wait, maxWait))
	}
	ctx, cancel := b.streamCtx(ctx)
	defer cancel()
	resp := &pb.ReceiveResponse{}
	// The first message may be waited for; the rest are taken only if
	// ready then.
	first := ctx
	if wait > 0 {
		var c context.CancelFunc
		first, c = context.WithTimeout(ctx, wait)
		defer c()
	}
	var a *ahead // the messages claimed ahead (ahead.go), for calls that may wait
	if b.cfg.ClaimAhead && wait > 0 {
		var done func()
		a, done = b.handles.receiveAhead(subscription{q: q, d: d, prefetch: max})
		defer done()
	}
	var cs []claimed
	if a != nil {
		cs, err = a.get(first, max, MaxResponseBytes)
	} else {
		cs, err = b.claims.take(first, q, d, want{max: max, maxBytes: MaxResponseBytes, block: wait > 0})
	}
	switch {
	case errors.Is(err, zkqueue.ErrEmpty), wait > 0 && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return resp, nil
	case err != nil:
		return nil, b.fail(err)
	}
	for i, c := range cs {
		if !b.claims.sendable(d, c) {
			if a != nil {
				// Back through the buffer, with the ones behind it,
				// as a stream's (sendBatch).
				b.metrics.expiredUnsent.WithLabelValues(q.label).Add(float64(len(cs) - i))
				a.putBack(cs[i:])
				break
			}
			b.claims.unsent(q, c)
			continue
		}
		b.claims.delivered(q, d, c)
		resp.Messages = append(resp.Messages, c.msg)
	}
	return resp, nil
}

// acks settles deliveries by their ack tokens, signed with the key the
// brokers of a root share: for Ack, Nack and ExtendLease calls and for the
// settlements a Consume stream carries.
type acks struct {
	b      *Broker
	tokens *tokenSigner
}

// leaseOf resolves an ack token to its queue.
func (ak *acks) leaseOf(ctx context.Context, token string) (*queue, string, error) {
	q, t, err := ak.tokenOf(ctx, token)
	return q, t.lease, err
}

func (ak *acks) tokenOf(ctx context.Context, token string) (*queue, ackToken, error) {
	b := ak.b
	t, err := parseToken(token)
	if err != nil {
		return nil, t, err
	}
	q, err := b.handles.queue(ctx, t.queue)
	return q, t, err
}

// ackMargin keeps the read-free ack clear of the deadline, for clock
// differences between brokers.
const ackMargin = 200 * time.Millisecond

func (ak *acks) ack(ctx context.Context, token string) error {
	q, t, err := ak.tokenOf(ctx, token)
	if err != nil {
		return err
	}
	return ak.ackLease(ctx, q, t)
}

// ackLease acks the lease of a parsed token.
func (ak *acks) ackLease(ctx context.Context, q *queue, t ackToken) error {
	ack, hinted := q.leases.Ack, ak.hinted(t)
	if hinted {
		ack = q.leases.AckUnread // the lease need not be read
	}
	m, err := ack(ctx, t.lease)
	if err != nil {
		return err
	}
	ak.acked(q, t, m, hinted)
	return nil
}

// hinted reports whether t's hint is to be used: trusted to skip the read
// of a lease, or for the ack's event. Only a hint a broker signed is
// trusted: an edited one could otherwise delete a lease past its
// deadline. The engine reads some leases anyway (a pack's, a group's):
// then the hint only counts for the event, and its mac is not checked
// without events.
func (ak *acks) hinted(t ackToken) bool {
	b := ak.b
	return (b.ev.sink != nil || !zkqueue.AckReads(t.lease)) && time.Until(t.deadline) > ackMargin && t.trusted(ak.tokens)
}

// acked counts a committed ack and reports its event.
func (ak *acks) acked(q *queue, t ackToken, m zkqueue.Message, hinted bool) {
	b := ak.b
	b.metrics.acked.WithLabelValues(q.label).Inc()
	switch {
	case b.ev.sink == nil:
	case hinted:
		m.Deliveries = t.deliveries
		b.ev.emitSized(events.Acked, q, m, t.size, "")
	default:
		b.ev.emit(events.Acked, q, m, "")
	}
}

// ackMany acks tokens as ack does each, and returns each one's error: the
// messages of one queue's pack leases together (zkqueue.Leases.AckMany:
// those of one lease share a write), the others one by one.
func (ak *acks) ackMany(ctx context.Context, tokens []string) []error {
	errs := make([]error, len(tokens))
	type batch struct {
		q      *queue
		toks   []ackToken
		hinted []bool
		at     []int // places in tokens
	}
	var batches []*batch
	for i, tok := range tokens {
		q, t, err := ak.tokenOf(ctx, tok)
		if err != nil {
			errs[i] = err
			continue
		}
		if !strings.Contains(t.lease, zkqueue.MemberSep) {
			errs[i] = ak.ackLease(ctx, q, t)
			continue
		}
		j := slices.IndexFunc(batches, func(x *batch) bool { return x.q == q })
		if j < 0 {
			j = len(batches)
			batches = append(batches, &batch{q: q})
		}
		bt := batches[j]
		bt.toks, bt.hinted, bt.at = append(bt.toks, t), append(bt.hinted, ak.hinted(t)), append(bt.at, i)
	}
	for _, bt := range batches {
		leases := make([]string, len(bt.toks))
		for k, t := range bt.toks {
			leases[k] = t.lease
		}
		ms, es := bt.q.leases.AckMany(ctx, leases)
		for k, t := range bt.toks {
			if errs[bt.at[k]] = es[k]; es[k] == nil {
				ak.acked(bt.q, t, ms[k], bt.hinted[k])
			}
		}
	}
	return errs
}

func (ak *acks) nack(ctx context.Context, token string, delay time.Duration) error {
	b := ak.b
	if delay < 0 || delay > maxNackDelay {
		return invalidf("delay %v out of range [0, %v]", delay, maxNackDelay)
	}
	q, lease, err := ak.leaseOf(ctx, token)
	if err != nil {
		return err
	}
	m, out, err := q.leases.Nack(ctx, lease, delay, q.policy)
	if err != nil {
		return err
	}
	b.metrics.nacked.WithLabelValues(q.label).Inc()
	if b.ev.sink != nil {
		b.ev.emit(events.Nacked, q, m, "")
	}
	ak.released(q, m, out)
	return nil
}

// released accounts for a message given back by nack, stream end or expiry.
func (ak *acks) released(q *queue, m zkqueue.Message, out zkqueue.Outcome) {
	b := ak.b
	if out == zkqueue.DeadLettered || out == zkqueue.Dropped {
		b.metrics.deadLettered.WithLabelValues(q.label).Inc()
		if b.ev.sink != nil {
			b.ev.emit(events.DeadLettered, q, m, "")
		}
	}
}

// Ack implements pb.QueueServer.
func (b *Broker) Ack(ctx context.Context, req *pb.AckRequest) (*pb.AckResponse, error) {
	if err := b.acks.ack(ctx, req.GetAckToken()); err != nil {
		return nil, b.fail(err)
	}
	return &pb.AckResponse{}, nil
}

// Nack implements pb.QueueServer.
func (b *Broker) Nack(ctx context.Context, req *pb.NackRequest) (*pb.NackResponse, error) {
	if err := b.acks.nack(ctx, req.GetAckToken(), req.GetDelay().AsDuration()); err != nil {
		return nil, b.fail(err)
	}
	return &pb.NackResponse{}, nil
}

// ExtendLease implements pb.QueueServer.
func (b *Broker) ExtendLease(ctx context.Context, req *pb.ExtendLeaseRequest) (*pb.ExtendLeaseResponse, error) {
	q, lease, err := b.acks.leaseOf(ctx, req.GetAckToken())
	if err != nil {
		return nil, b.fail(err)
	}
	ttl, err := clampDuration("visibility_timeout", req.GetVisibilityTimeout().AsDuration(), q.meta.Visibility, minVisibility, maxVisibility)
	if err != nil {
		return nil, b.fail(err)
	}
	deadline, err := q.leases.Extend(ctx, lease, ttl)
	if err != nil {
		return nil, b.fail(err)
	}
	return &pb.ExtendLeaseResponse{LeaseDeadline: timestamppb.New(deadline)}, nil
}

// ListDeadLetters implements pb.QueueServer.
func (b *Broker) ListDeadLetters(ctx context.Context, req *pb.ListDeadLettersRequest) (*pb.ListDeadLettersResponse, error) {
	q, err := b.handles.queue(ctx, req.GetQueue())
	if err != nil {
		return nil, b.fail(err)
	}
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = defaultDeadLn
	}
	if limit > maxDeadLimit {
		return nil, b.fail(invalidf("limit %d > %d", limit, maxDeadLimit))
	}
	// The page token is the id of the last dead letter of the previous
	// page: a page starts after it, wherever it went since.
	after := req.GetPageToken()
	if _, ok := zkqueue.ParseName(after); after != "" && !ok {
		return nil, b.fail(invalidf("malformed page_token %q", printable(after)))
	}
	ms, next, err := q.leases.DeadLettersAfter(ctx, after, limit, room(q, MaxResponseBytes))
	if err != nil {
		return nil, b.fail(err)
	}
	resp := &pb.ListDeadLettersResponse{NextPageToken: next}
	for _, m := range ms {
		resp.Messages = append(resp.Messages, toPB(q.name, m, nil))
	}
	return resp, nil
}

// Redrive implements pb.QueueServer.
func (b *Broker) Redrive(ctx context.Context, req *pb.RedriveRequest) (*pb.RedriveResponse, error) {
	q, err := b.handles.queue(ctx, req.GetQueue())
	if err != nil {
		return nil, b.fail(err)
	}
	for _, id := range req.GetIds() {
		if _, ok := zkqueue.ParseName(id); !ok {
			return nil, b.fail(invalidf("malformed message id %q", printable(id)))
		}
	}
	n, err := q.leases.Redrive(ctx, req.GetIds())
	if err != nil {
		return nil, b.fail(err)
	}
	return &pb.RedriveResponse{Redriven: uint64(n)}, nil
}
