package broker

import (
	"context"
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// Limits on queue configuration.
const (
	minVisibility  = 100 * time.Millisecond
	maxVisibility  = 12 * time.Hour
	maxSyncMembers = 1000
	// maxQuota keeps a quota within int64 (and any int).
	maxQuota = 1 << 62
)

// CreateQueue implements pb.QueueServer.
func (b *Broker) CreateQueue(ctx context.Context, req *pb.CreateQueueRequest) (*pb.QueueInfo, error) {
	if err := validName("queue name", req.GetName()); err != nil {
		return nil, b.fail(err)
	}
	kind, err := kindFromPB(req.GetKind())
	if err != nil {
		return nil, b.fail(err)
	}
	members := int(req.GetSyncMembers())
	switch {
	case kind == kindSync && (members < 2 || members > maxSyncMembers):
		return nil, b.fail(invalidf("sync_members %d out of range [2, %d]", members, maxSyncMembers))
	case kind != kindSync && members != 0:
		return nil, b.fail(invalidf("sync_members is only for SYNC queues"))
	}
	vis, err := clampDuration("visibility_timeout", req.GetVisibilityTimeout().AsDuration(), b.cfg.DefaultVisibility, minVisibility, maxVisibility)
	if err != nil {
		return nil, b.fail(err)
	}
	// The default window is stored as 0, so queues created before
	// windows were configurable keep their configuration (Create compares
	// it).
	dedup, err := clampDuration("dedup_window", req.GetDedupWindow().AsDuration(), zkqueue.DefaultDedupWindow, zkqueue.MinDedupWindow, zkqueue.MaxDedupWindow)
	if err != nil {
		return nil, b.fail(err)
	}
	if dedup == zkqueue.DefaultDedupWindow {
		dedup = 0
	}
	if req.GetMaxDepth() > maxQuota || req.GetMaxBytes() > maxQuota {
		return nil, b.fail(invalidf("max_depth %d or max_bytes %d over %d", req.GetMaxDepth(), req.GetMaxBytes(), uint64(maxQuota)))
	}
	ttl, err := ttlToSpec(req.GetMessageTtl(), req.GetExpireToDeadLetter())
	if err != nil {
		return nil, b.fail(err)
	}
	if req.GetSingleActiveConsumer() && kind == kindSync {
		return nil, b.fail(invalidf("single_active_consumer is for FIFO and PRIORITY queues, not SYNC"))
	}
	var backoff *zkqueue.Backoff
	if r := req.GetRetryBackoff(); r != nil {
		if backoff, err = backoffToSpec(r); err != nil {
			return nil, b.fail(err)
		}
	}
	fair, err := fairnessToSpec(req.GetFairness(), kind)
	if err != nil {
		return nil, b.fail(err)
	}
	if err := checkPacked(req, kind); err != nil {
		return nil, b.fail(err)
	}
	s := zkqueue.Spec{
		Kind: kind, SyncMembers: members, Visibility: vis,
		MaxDeliveries: int(req.GetMaxDeliveries()), DeadLetter: req.GetDeadLetter(),
		MaxDepth: int(req.GetMaxDepth()), MaxBytes: int64(req.GetMaxBytes()),
		DedupWindow: dedup,
		Created:     time.Now().UTC().Truncate(time.Millisecond),
	}
	s.MessageTTL, s.ExpireToDeadLetter = ttl, req.GetExpireToDeadLetter()
	s.Backoff = backoff
	s.SingleActive = req.GetSingleActiveConsumer()
	s.Fairness = fair
	s.Packed = req.GetPacked()
	s, err = b.catalog.Create(ctx, req.GetName(), s)
	if err != nil {
		return nil, b.fail(err)
	}
	if s.MaxBytes > 0 {
		// ZooKeeper counts the queue's bytes from now on (quota.go). A
		// failure fails the call; repeating it sets them up (a publish
		// would too).
		if err := zkutil.EnsureQuota(b.conn, b.catalog.Path(req.GetName()), b.acl); err != nil {
			return nil, b.fail(err)
		}
	}
	return queueInfo(req.GetName(), s), nil
}

// checkPacked refuses packed storage where the engine does not pack
// (zkqueue.Spec.Validate): a SYNC queue, fair dispatch (its key tags each
// message's node) and a message TTL (expired by node). The error names
// both fields.
func checkPacked(req *pb.CreateQueueRequest, kind zkqueue.Kind) error {
	if !req.GetPacked() {
		return nil
	}
	switch {
	case kind == kindSync:
		return invalidf("packed is for FIFO and PRIORITY queues, not SYNC")
	case req.GetFairness().GetKey() != "":
		return invalidf("packed does not combine with fairness (fair dispatch keeps one message per node)")
	case req.GetMessageTtl().AsDuration() != 0:
		return invalidf("packed does not combine with message_ttl (messages expire node by node)")
	}
	return nil
}

// GetQueue implements pb.QueueServer.
func (b *Broker) GetQueue(ctx context.Context, req *pb.GetQueueRequest) (*pb.QueueInfo, error) {
	q, err := b.handles.queue(ctx, req.GetName())
	if err != nil {
		return nil, b.fail(err)
	}
	return queueInfo(q.name, q.meta), nil
}

// Pages of ListQueues. A QueueInfo takes under 400 bytes, so a full page
// stays far below MaxResponseBytes.
const (
	defaultQueuePage = 100
	maxQueuePage     = 1000
)

// ListQueues implements pb.QueueServer.
func (b *Broker) ListQueues(ctx context.Context, req *pb.ListQueuesRequest) (*pb.ListQueuesResponse, error) {
	size := int(req.GetPageSize())
	if size == 0 {
		size = defaultQueuePage
	}
	if size > maxQueuePage {
		return nil, b.fail(invalidf("page_size %d > %d", size, maxQueuePage))
	}
	// The page token is the last name the previous page returned: never a
	// name the caller may not view.
	after := req.GetPageToken()
	if after != "" {
		if err := validName("page_token", after); err != nil {
			return nil, b.fail(err)
		}
	}
	names, err := b.catalog.List(ctx, req.GetPrefix())
	if err != nil {
		return nil, b.fail(err)
	}
	names = names[sort.Search(len(names), func(i int) bool { return names[i] > after }):]
	view := b.viewFilter(ctx)
	resp := &pb.ListQueuesResponse{}
	for _, n := range names {
		if ctx.Err() != nil {
			return nil, b.fail(ctx.Err())
		}
		if !view(n) {
			continue
		}
		s, err := b.handles.spec(n)
		if err != nil {
			continue // deleted meanwhile, or being deleted
		}
		if len(resp.Queues) == size {
			resp.NextPageToken = resp.Queues[size-1].GetName()
			break
		}
		resp.Queues = append(resp.Queues, queueInfo(n, s))
	}
	return resp, nil
}

// viewFilter reports which queues the caller of ctx may view: all
// without authentication, none for a caller without an identity.
func (b *Broker) viewFilter(ctx context.Context) func(name string) bool {
	if b.cfg.Auth == nil {
		return func(string) bool { return true }
	}
	id, ok := IdentityFrom(ctx)
	if !ok {
		return func(string) bool { return false }
	}
	rules := b.cfg.Auth.rules.Get()
	return func(name string) bool { return rules.Allowed(id.Name, ActView, name) }
}

// DeleteQueue implements pb.QueueServer.
func (b *Broker) DeleteQueue(ctx context.Context, req *pb.DeleteQueueRequest) (*pb.DeleteQueueResponse, error) {
	if err := validName("queue name", req.GetName()); err != nil {
		return nil, b.fail(err)
	}
	err := b.catalog.Delete(ctx, req.GetName())
	// This broker's handle went stale with the mark; drop it now.
	b.handles.evict(req.GetName())
	if err != nil {
		return nil, b.fail(err)
	}
	// The queue's byte counting, if it had a max_bytes, goes with it; one
	// left behind (a failure here) costs ZooKeeper a little bookkeeping
	// per write under the path, and serves a queue created again under
	// the name.
	if err := zkutil.RemoveQuota(b.conn, b.catalog.Path(req.GetName())); err != nil {
		b.log.Warn("queue deleted, its quota statistics not", "queue", req.GetName(), "err", err)
	}
	return &pb.DeleteQueueResponse{}, nil
}

// Purge implements pb.QueueServer.
func (b *Broker) Purge(ctx context.Context, req *pb.PurgeRequest) (*pb.PurgeResponse, error) {
	q, err := b.handles.queue(ctx, req.GetName())
	if err != nil {
		return nil, b.fail(err)
	}
	n, err := q.items.Purge(ctx)
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	d, err := q.delayed.Purge(ctx)
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	return &pb.PurgeResponse{Purged: uint64(n + d)}, nil
}

// Stats implements pb.QueueServer.
func (b *Broker) Stats(ctx context.Context, req *pb.StatsRequest) (*pb.QueueStats, error) {
	q, err := b.handles.queue(ctx, req.GetName())
	if err != nil {
		return nil, b.fail(err)
	}
	st := &pb.QueueStats{Name: q.name}
	ready, err := q.items.Len(ctx)
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	inFlight, err := q.leases.InFlight(ctx)
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	dead, err := q.leases.DeadCount(ctx)
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	age, err := q.items.OldestAge(ctx)
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	consumers, err := b.handles.countConsumers(q)
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	delayed, err := q.delayed.Len(ctx)
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	expired, err := q.items.ExpiredCount(ctx)
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	st.Ready, st.InFlight, st.Dead, st.Consumers = uint64(ready), uint64(inFlight), uint64(dead), uint64(consumers)
	st.Delayed, st.Expired = uint64(delayed), uint64(expired)
	st.OldestAge = durationpb.New(age)
	if q.sync != nil {
		joined, open, err := q.sync.state(ctx)
		if err != nil {
			return nil, b.fail(b.handles.gone(q, err))
		}
		st.SyncJoined, st.SyncOpen = uint32(joined), open
	}
	if q.stale() {
		// Marked for deletion during the reads (the watch event comes
		// before any read that sees the deletion): answer as of now.
		if _, err := b.handles.queue(ctx, q.name); err != nil {
			return nil, b.fail(err)
		}
	}
	return st, nil
}
