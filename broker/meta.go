package broker

import (
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/zkqueue"
)

// A queue's configuration is a zkqueue.Spec, stored by the Catalog in the
// data of /<root>/queues/<name>; this file maps it to and from the API.

const (
	kindFIFO     = zkqueue.KindFIFO
	kindPriority = zkqueue.KindPriority
	kindSync     = zkqueue.KindSync
)

func kindFromPB(k pb.QueueKind) (zkqueue.Kind, error) {
	switch k {
	case pb.QueueKind_QUEUE_KIND_UNSPECIFIED, pb.QueueKind_QUEUE_KIND_FIFO:
		return kindFIFO, nil
	case pb.QueueKind_QUEUE_KIND_PRIORITY:
		return kindPriority, nil
	case pb.QueueKind_QUEUE_KIND_SYNC:
		return kindSync, nil
	}
	return "", invalidf("unknown queue kind %d", k)
}

func kindToPB(k zkqueue.Kind) pb.QueueKind {
	switch k {
	case kindPriority:
		return pb.QueueKind_QUEUE_KIND_PRIORITY
	case kindSync:
		return pb.QueueKind_QUEUE_KIND_SYNC
	}
	return pb.QueueKind_QUEUE_KIND_FIFO
}

func queueInfo(name string, s zkqueue.Spec) *pb.QueueInfo {
	info := &pb.QueueInfo{
		Name:              name,
		Kind:              kindToPB(s.Kind),
		SyncMembers:       uint32(s.SyncMembers),
		VisibilityTimeout: durationpb.New(s.Visibility),
		MaxDeliveries:     uint32(s.MaxDeliveries),
		DeadLetter:        s.DeadLetter,
		CreatedAt:         timestamppb.New(s.Created),
		MaxDepth:          uint64(s.MaxDepth),
		MaxBytes:          uint64(s.MaxBytes),
		DedupWindow:       durationpb.New(s.Dedup()),
	}
	info.MessageTtl, info.ExpireToDeadLetter = durationpb.New(s.MessageTTL), s.ExpireToDeadLetter
	if s.Backoff != nil {
		info.RetryBackoff = backoffToPB(s.Backoff)
	}
	info.SingleActiveConsumer = s.SingleActive
	info.Packed = s.Packed
	if s.Fairness.Key != "" {
		info.Fairness = fairnessToPB(s.Fairness)
	}
	return info
}
