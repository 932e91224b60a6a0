package broker

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/zkqueue"
)

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
	}
	return out
}

// leasedPB converts an at-least-once delivery, with its signed ack token.
func (b *Broker) leasedPB(queue string, l *zkqueue.Lease) *pb.Message {
	out := toPB(queue, l.Message, l)
	out.AckToken = makeToken(b.tokens, queue, *l)
	return out
}
