package broker

import (
	"context"
	"time"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/zkqueue"
)

// Idempotent publish: a message with a dedup_id is recorded under the
// queue's dedup/ node for the queue's window (zkqueue's dedup.go), in the
// same ZooKeeper transaction as the message, so any broker answers its
// repeat with the first message's id. The leader deletes the records of
// past windows, a bucket at a time (zkqueue.Catalog.Maintain).

// publishIdempotent publishes checked and admitted drafts of which some
// carry dedup ids, the delayed ones (due, when delayed) through the
// queue's delayed parent with their records in the same transaction;
// repeats are answered, with the first publish's id (a delayed one's
// "d-..." id, also after it joined the queue), not published (nor
// counted, nor announced).
func (b *Broker) publishIdempotent(ctx context.Context, q *queue, drafts []zkqueue.Draft, due []time.Time, delayed bool) (*pb.PublishResponse, error) {
	var rs []zkqueue.Receipt
	var err error
	if delayed {
		err = b.sched.withDelayedParent(ctx, q, func() error {
			rs, err = q.delayed.PublishReceipts(ctx, drafts, due)
			return err
		})
	} else {
		rs, err = q.items.PublishReceipts(ctx, drafts)
	}
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	resp := &pb.PublishResponse{Ids: make([]string, len(rs)), Duplicates: make([]bool, len(rs))}
	n := 0
	for i, r := range rs {
		resp.Ids[i], resp.Duplicates[i] = r.ID, r.Duplicate
		if r.Duplicate {
			continue
		}
		n++
		b.ev.emit(events.Published, q, zkqueue.Message{ID: r.ID, Payload: drafts[i].Payload, Priority: drafts[i].Priority,
			Attributes: drafts[i].Attributes}, "")
	}
	q.published(n)
	b.metrics.published.WithLabelValues(q.label).Add(float64(n))
	b.metrics.duplicates.WithLabelValues(q.label).Add(float64(len(rs) - n))
	return resp, nil
}
