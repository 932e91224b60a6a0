package broker

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/qcore"
)

// toPB converts a delivered message; token and lease deadline are set for
// at-least-once deliveries.
func toPB(queue string, m qcore.Message, l *qcore.Lease) *pb.Message {
	out := &pb.Message{
		Queue:         queue,
		Id:            m.ID,
		Payload:       m.Payload,
		Priority:      uint32(m.Priority),
		PublishedAt:   timestamppb.New(m.Published),
		DeliveryCount: uint32(m.Deliveries),
	}
	if l != nil {
		out.AckToken = makeToken(queue, *l)
		out.LeaseDeadline = timestamppb.New(l.Deadline)
	}
	return out
}
