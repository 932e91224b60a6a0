package broker

import (
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// queueMeta is a queue's configuration, stored as JSON in the data of
// /<root>/queues/<name>. V is the encoding version; readers reject
// versions they do not know.
//
// Deleting marks a queue that DeleteQueue is removing. The mark is set
// with a versioned setData, the only write of a queue's metadata after its
// creation, so the version it produces identifies this incarnation of the
// queue while its nodes are deleted, and the change fires every broker's
// metadata watch: handles are dropped, and a queue marked so is absent to
// every call but DeleteQueue and CreateQueue, which finish the deletion.
type queueMeta struct {
	V             int       `json:"v"`
	Kind          string    `json:"kind"` // fifo, priority, sync
	SyncMembers   int       `json:"sync_members,omitempty"`
	VisibilityMS  int64     `json:"visibility_ms"`
	MaxDeliveries int       `json:"max_deliveries,omitempty"`
	DeadLetter    bool      `json:"dead_letter,omitempty"`
	Created       time.Time `json:"created"`
	Deleting      bool      `json:"deleting,omitempty"`
}

const metaVersion = 1

const (
	kindFIFO     = "fifo"
	kindPriority = "priority"
	kindSync     = "sync"
)

func kindFromPB(k pb.QueueKind) (string, error) {
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

func kindToPB(k string) pb.QueueKind {
	switch k {
	case kindPriority:
		return pb.QueueKind_QUEUE_KIND_PRIORITY
	case kindSync:
		return pb.QueueKind_QUEUE_KIND_SYNC
	}
	return pb.QueueKind_QUEUE_KIND_FIFO
}

func (m queueMeta) visibility() time.Duration {
	return time.Duration(m.VisibilityMS) * time.Millisecond
}

// sameConfig reports whether two configurations are equal, creation time
// aside.
func (m queueMeta) sameConfig(o queueMeta) bool {
	m.Created, o.Created = time.Time{}, time.Time{}
	return m == o
}

func decodeMeta(data []byte) (queueMeta, error) {
	var m queueMeta
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("queue metadata: %w", err)
	}
	if m.Deleting {
		// Whatever else it says, the queue is going away (a mark over
		// metadata that did not decode carries nothing else).
		return m, nil
	}
	if m.V != metaVersion {
		return m, fmt.Errorf("queue metadata version %d, want %d", m.V, metaVersion)
	}
	switch m.Kind {
	case kindFIFO, kindPriority, kindSync:
	default:
		return m, fmt.Errorf("queue metadata: unknown kind %q", m.Kind)
	}
	return m, nil
}

func (m queueMeta) info(name string) *pb.QueueInfo {
	return &pb.QueueInfo{
		Name:              name,
		Kind:              kindToPB(m.Kind),
		SyncMembers:       uint32(m.SyncMembers),
		VisibilityTimeout: durationpb.New(m.visibility()),
		MaxDeliveries:     uint32(m.MaxDeliveries),
		DeadLetter:        m.DeadLetter,
		CreatedAt:         timestamppb.New(m.Created),
	}
}
