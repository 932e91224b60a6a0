package qbroker

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// QueueKind is how a queue orders and gates its messages. The zero value
// is KindFIFO.
type QueueKind int

const (
	// KindFIFO delivers in publish order.
	KindFIFO QueueKind = iota
	// KindPriority delivers by (priority, publish order); priority 0 is
	// the most urgent.
	KindPriority
	// KindSync is FIFO, opened for consumers only once
	// QueueOptions.SyncMembers members have joined (see JoinSync).
	KindSync
)

var kindNames = []string{"fifo", "priority", "sync"}

// String returns "fifo", "priority" or "sync".
func (k QueueKind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("QueueKind(%d)", int(k))
}

// MarshalText implements encoding.TextMarshaler.
func (k QueueKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: "fifo", "priority"
// or "sync".
func (k *QueueKind) UnmarshalText(b []byte) error {
	for i, n := range kindNames {
		if string(b) == n {
			*k = QueueKind(i)
			return nil
		}
	}
	return errorf("qbroker: unknown queue kind %q (want fifo, priority or sync): %w", b, ErrInvalidArgument)
}

func (k QueueKind) toPB() (pb.QueueKind, error) {
	switch k {
	case KindFIFO:
		return pb.QueueKind_QUEUE_KIND_FIFO, nil
	case KindPriority:
		return pb.QueueKind_QUEUE_KIND_PRIORITY, nil
	case KindSync:
		return pb.QueueKind_QUEUE_KIND_SYNC, nil
	}
	return 0, errorf("qbroker: unknown queue kind %d: %w", int(k), ErrInvalidArgument)
}

func kindFromPB(k pb.QueueKind) QueueKind {
	switch k {
	case pb.QueueKind_QUEUE_KIND_PRIORITY:
		return KindPriority
	case pb.QueueKind_QUEUE_KIND_SYNC:
		return KindSync
	}
	return KindFIFO
}

// QueueOptions configure a new queue. The zero value is a FIFO queue with
// the broker's default visibility timeout and unlimited deliveries.
type QueueOptions struct {
	// Kind of queue; default KindFIFO.
	Kind QueueKind
	// SyncMembers is the number of members that open a KindSync queue
	// (2..1000); 0 for other kinds.
	SyncMembers int
	// VisibilityTimeout is the default lease of at-least-once deliveries;
	// 0 means the broker's default (30s unless configured).
	VisibilityTimeout time.Duration
	// MaxDeliveries after which a message is dead-lettered (or dropped
	// without DeadLetter); 0 means unlimited.
	MaxDeliveries int
	// DeadLetter keeps messages past MaxDeliveries as dead letters.
	DeadLetter bool
	// MaxDepth is a quota: the most ready messages; publishing beyond it
	// fails with ErrResourceExhausted. 0 means none.
	MaxDepth int
	// MaxBytes is a quota: the most bytes of message data the queue holds
	// (ready, leased and dead-lettered payloads); publishing beyond it
	// fails with ErrResourceExhausted. 0 means none.
	MaxBytes int64
	// DedupWindow is how long the dedup ids of publishes are remembered
	// (WithDedupID), 1s..1h; 0 means 5 minutes.
	DedupWindow time.Duration
	// MessageTTL: ready messages older than this (from their publish, or
	// from when they became due or were redriven) are removed instead of
	// delivered; 0 means none, else 1s..14 days. A message in flight is
	// not expired: its lease is honoured.
	MessageTTL time.Duration
	// ExpireToDeadLetter keeps expired messages as dead letters.
	ExpireToDeadLetter bool
	// RetryBackoff, when set, is the queue's redelivery schedule; nil
	// redelivers at once.
	RetryBackoff *RetryBackoff
	// SingleActiveConsumer: one Consume stream at a time, across all
	// brokers, receives the queue's messages; the others wait and one
	// takes over when it ends or its broker dies. KindFIFO and
	// KindPriority queues only. Receive is refused (ErrFailedPrecondition).
	SingleActiveConsumer bool
	// Fairness: fair dispatch by key; the zero Fairness means none.
	Fairness Fairness
	// Packed: the messages of a Publish call, and of the concurrent
	// publishes one group commit gathers, are stored in one ZooKeeper node
	// holding many messages; acks stay per message. KindFIFO and
	// KindPriority queues, not with Fairness or MessageTTL
	// (ErrInvalidArgument).
	Packed bool
}

// QueueInfo is a queue's configuration.
type QueueInfo struct {
	Name              string
	Kind              QueueKind
	SyncMembers       int
	VisibilityTimeout time.Duration
	MaxDeliveries     int
	DeadLetter        bool
	MaxDepth          int   // quota; 0 none
	MaxBytes          int64 // quota; 0 none
	DedupWindow       time.Duration
	CreatedAt         time.Time
	// MessageTTL and ExpireToDeadLetter: see QueueOptions.
	MessageTTL         time.Duration
	ExpireToDeadLetter bool
	// RetryBackoff: see QueueOptions; nil when none.
	RetryBackoff *RetryBackoff
	// SingleActiveConsumer: see QueueOptions.
	SingleActiveConsumer bool
	// Fairness: see QueueOptions.
	Fairness Fairness
	// Packed: see QueueOptions.
	Packed bool
}

func infoFromPB(q *pb.QueueInfo) QueueInfo {
	return QueueInfo{
		Name:                 q.GetName(),
		Kind:                 kindFromPB(q.GetKind()),
		SyncMembers:          int(q.GetSyncMembers()),
		VisibilityTimeout:    q.GetVisibilityTimeout().AsDuration(),
		MaxDeliveries:        int(q.GetMaxDeliveries()),
		DeadLetter:           q.GetDeadLetter(),
		CreatedAt:            q.GetCreatedAt().AsTime(),
		MaxDepth:             int(q.GetMaxDepth()),
		MaxBytes:             int64(q.GetMaxBytes()),
		DedupWindow:          q.GetDedupWindow().AsDuration(),
		MessageTTL:           q.GetMessageTtl().AsDuration(),
		ExpireToDeadLetter:   q.GetExpireToDeadLetter(),
		RetryBackoff:         backoffFromPB(q.GetRetryBackoff()),
		SingleActiveConsumer: q.GetSingleActiveConsumer(),
		Fairness:             fairnessFromPB(q.GetFairness()),
		Packed:               q.GetPacked(),
	}
}

// Stats are a queue's counts at one moment.
type Stats struct {
	Name string
	// Ready messages, deliverable now.
	Ready int
	// InFlight at-least-once deliveries not yet acked (including nacks
	// with a delay).
	InFlight int
	// Dead letters.
	Dead int
	// OldestAge is the age of the oldest ready message; 0 when none.
	OldestAge time.Duration
	// Consumers: Consume streams open on all brokers.
	Consumers int
	// SyncJoined and SyncOpen: KindSync queues only.
	SyncJoined int
	SyncOpen   bool
	// Delayed messages, published with a delay and not due yet (not in
	// Ready).
	Delayed int
	// Expired counts the messages the queue's MessageTTL removed since its
	// creation.
	Expired int
}

// durationOrNil leaves zero durations unset ("the default").
func durationOrNil(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// CreateQueue creates a queue and returns its configuration. Creating an
// existing queue with the same configuration succeeds. Errors:
// ErrAlreadyExists (another configuration), ErrInvalidArgument (bad name
// or options). It is retried when no broker is available.
func (c *Client) CreateQueue(ctx context.Context, name string, o QueueOptions) (QueueInfo, error) {
	kind, err := o.Kind.toPB()
	if err != nil {
		return QueueInfo{}, err
	}
	if o.SyncMembers < 0 || o.MaxDeliveries < 0 || o.VisibilityTimeout < 0 || o.MaxDepth < 0 || o.MaxBytes < 0 || o.DedupWindow < 0 || o.MessageTTL < 0 {
		return QueueInfo{}, errorf("qbroker: create %s: negative option: %w", name, ErrInvalidArgument)
	}
	fair, ok := o.Fairness.toPB()
	if !ok {
		return QueueInfo{}, errorf("qbroker: create %s: negative fairness weight: %w", name, ErrInvalidArgument)
	}
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	q, err := c.rpc.CreateQueue(ctx, &pb.CreateQueueRequest{
		Name:                 name,
		Kind:                 kind,
		SyncMembers:          uint32(o.SyncMembers),
		VisibilityTimeout:    durationOrNil(o.VisibilityTimeout),
		MaxDeliveries:        uint32(o.MaxDeliveries),
		DeadLetter:           o.DeadLetter,
		MaxDepth:             uint64(o.MaxDepth),
		MaxBytes:             uint64(o.MaxBytes),
		DedupWindow:          durationOrNil(o.DedupWindow),
		MessageTtl:           durationOrNil(o.MessageTTL),
		ExpireToDeadLetter:   o.ExpireToDeadLetter,
		RetryBackoff:         o.RetryBackoff.toPB(),
		SingleActiveConsumer: o.SingleActiveConsumer,
		Fairness:             fair,
		Packed:               o.Packed,
	})
	if err != nil {
		return QueueInfo{}, errorf("qbroker: create queue %s: %w", name, convErr(err))
	}
	return infoFromPB(q), nil
}

// GetQueue returns a queue's configuration. Errors: ErrNotFound.
func (c *Client) GetQueue(ctx context.Context, name string) (QueueInfo, error) {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	q, err := c.rpc.GetQueue(ctx, &pb.GetQueueRequest{Name: name})
	if err != nil {
		return QueueInfo{}, errorf("qbroker: get queue %s: %w", name, convErr(err))
	}
	return infoFromPB(q), nil
}

// queuePage is the page size ListQueues asks for: the broker's largest.
const queuePage = 1000

// ListQueues lists the queues whose names start with prefix (all when
// empty), sorted by name. It follows the broker's pages, one call each.
func (c *Client) ListQueues(ctx context.Context, prefix string) ([]QueueInfo, error) {
	var out []QueueInfo
	token := ""
	for {
		resp, err := c.listQueues(ctx, &pb.ListQueuesRequest{Prefix: prefix, PageSize: queuePage, PageToken: token})
		if err != nil {
			op := "list queues"
			if prefix != "" {
				op += " " + prefix
			}
			return nil, errorf("qbroker: %s: %w", op, convErr(err))
		}
		for _, q := range resp.GetQueues() {
			out = append(out, infoFromPB(q))
		}
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

func (c *Client) listQueues(ctx context.Context, req *pb.ListQueuesRequest) (*pb.ListQueuesResponse, error) {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	return c.rpc.ListQueues(ctx, req)
}

// DeleteQueue deletes a queue with its messages, leases and dead letters.
// Errors: ErrNotFound. It is not retried.
func (c *Client) DeleteQueue(ctx context.Context, name string) error {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	if _, err := c.rpc.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: name}); err != nil {
		return errorf("qbroker: delete queue %s: %w", name, convErr(err))
	}
	return nil
}

// Purge deletes a queue's ready messages (not in-flight ones nor dead
// letters) and returns how many. Errors: ErrNotFound.
func (c *Client) Purge(ctx context.Context, name string) (int, error) {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	resp, err := c.rpc.Purge(ctx, &pb.PurgeRequest{Name: name})
	if err != nil {
		return 0, errorf("qbroker: purge %s: %w", name, convErr(err))
	}
	return int(resp.GetPurged()), nil
}

// Stats returns a queue's counts. Errors: ErrNotFound.
func (c *Client) Stats(ctx context.Context, name string) (Stats, error) {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	s, err := c.rpc.Stats(ctx, &pb.StatsRequest{Name: name})
	if err != nil {
		return Stats{}, errorf("qbroker: stats %s: %w", name, convErr(err))
	}
	return Stats{
		Name:       s.GetName(),
		Ready:      int(s.GetReady()),
		InFlight:   int(s.GetInFlight()),
		Dead:       int(s.GetDead()),
		OldestAge:  s.GetOldestAge().AsDuration(),
		Consumers:  int(s.GetConsumers()),
		SyncJoined: int(s.GetSyncJoined()),
		SyncOpen:   s.GetSyncOpen(),
		Delayed:    int(s.GetDelayed()),
		Expired:    int(s.GetExpired()),
	}, nil
}

// deadPage is the broker's largest page of dead letters.
const deadPage = 1000

// DeadLetters lists up to limit of a queue's dead letters, oldest first
// (limit 0 means 100). It follows the broker's pages, one call each; see
// DeadLettersPage to list them page by page. The messages have no lease.
// Errors: ErrNotFound, ErrInvalidArgument.
func (c *Client) DeadLetters(ctx context.Context, queue string, limit int) ([]*Message, error) {
	if limit < 0 {
		return nil, errorf("qbroker: dead letters of %s: negative limit: %w", queue, ErrInvalidArgument)
	}
	if limit == 0 {
		limit = 100
	}
	var out []*Message
	token := ""
	for len(out) < limit {
		ms, next, err := c.DeadLettersPage(ctx, queue, token, min(limit-len(out), deadPage))
		if err != nil {
			return nil, err
		}
		out = append(out, ms...)
		if token = next; token == "" {
			break
		}
	}
	return out, nil
}

// DeadLettersPage lists one page of a queue's dead letters, oldest first:
// up to limit of them (0 means 100; at most 1000), fewer when more would
// not fit one response. pageToken is "" for the first page, then the next
// token the previous page returned; next is "" after the last page. The
// messages have no lease. Errors: ErrNotFound, ErrInvalidArgument (limit
// out of range, malformed token).
func (c *Client) DeadLettersPage(ctx context.Context, queue, pageToken string, limit int) (ms []*Message, next string, err error) {
	if limit < 0 {
		return nil, "", errorf("qbroker: dead letters of %s: negative limit: %w", queue, ErrInvalidArgument)
	}
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	resp, err := c.rpc.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{Queue: queue, Limit: uint32(limit), PageToken: pageToken})
	if err != nil {
		return nil, "", errorf("qbroker: dead letters of %s: %w", queue, convErr(err))
	}
	return c.messages(resp.GetMessages(), nil, 0), resp.GetNextPageToken(), nil
}

// Browse returns a page of a queue's ready messages from the head, in
// delivery order (publish order; priority, then publish order, for
// KindPriority queues), without claiming them: no lease, delivery counts
// unchanged. limit is the page size (0: the broker's default, 100; at most
// 1000); a page holds fewer when more would not fit one response. Pass ""
// for the first page, then the next token the previous page returned;
// next is "" after the last page. The messages have no lease: Ack and
// Nack fail with ErrNoLease. Errors: ErrNotFound, ErrInvalidArgument
// (limit out of range, malformed token).
func (c *Client) Browse(ctx context.Context, queue, pageToken string, limit int) (ms []*Message, next string, err error) {
	if limit < 0 {
		return nil, "", errorf("qbroker: browse %s: negative limit: %w", queue, ErrInvalidArgument)
	}
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	resp, err := c.rpc.Browse(ctx, &pb.BrowseRequest{Queue: queue, Limit: uint32(limit), PageToken: pageToken})
	if err != nil {
		return nil, "", errorf("qbroker: browse %s: %w", queue, convErr(err))
	}
	return c.messages(resp.GetMessages(), nil, 0), resp.GetNextPageToken(), nil
}

// Redrive moves dead letters back to their queue with a fresh delivery
// count: those with the given ids, or all when none are given. It returns
// how many moved. Errors: ErrNotFound, ErrInvalidArgument (malformed id).
func (c *Client) Redrive(ctx context.Context, queue string, ids ...string) (int, error) {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	resp, err := c.rpc.Redrive(ctx, &pb.RedriveRequest{Queue: queue, Ids: ids})
	if err != nil {
		return 0, errorf("qbroker: redrive %s: %w", queue, convErr(err))
	}
	return int(resp.GetRedriven()), nil
}
