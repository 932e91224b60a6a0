package broker

import (
	"context"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/zkqueue"
)

// Browse limits: as for dead letters.
const (
	defaultBrowse = 100
	maxBrowse     = 1000
)

// Browse implements pb.QueueServer: a page of the ready messages from the
// head, in delivery order, none claimed (zkqueue.Queue.Browse). The page
// token is the id of the last message of the previous page: a page starts
// after it, wherever the queue's head went since.
func (b *Broker) Browse(ctx context.Context, req *pb.BrowseRequest) (*pb.BrowseResponse, error) {
	q, err := b.handles.queue(ctx, req.GetQueue())
	if err != nil {
		return nil, b.fail(err)
	}
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = defaultBrowse
	}
	if limit > maxBrowse {
		return nil, b.fail(invalidf("limit %d > %d", limit, maxBrowse))
	}
	after := req.GetPageToken()
	if _, ok := zkqueue.ParseName(after); after != "" && !ok {
		return nil, b.fail(invalidf("malformed page_token %q", printable(after)))
	}
	ms, next, err := q.items.Browse(ctx, after, limit, room(q, MaxResponseBytes))
	if err != nil {
		return nil, b.fail(b.handles.gone(q, err))
	}
	resp := &pb.BrowseResponse{NextPageToken: next}
	for _, m := range ms {
		resp.Messages = append(resp.Messages, toPB(q.name, m, nil))
	}
	return resp, nil
}
