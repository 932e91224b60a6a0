package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/syncqueue"
	"github.com/qbroker/qbroker/zkqueue"
)

// errSyncGroup marks a join the group refuses (full, or opened).
var errSyncGroup = errors.New("sync group")

// syncGate gates a SYNC queue's consumers on its group: members join
// through JoinSync streams (ephemeral member nodes); the queue opens when
// the member that completes the group creates start (package syncqueue).
// Before that, Consume and Receive fail with FailedPrecondition. Once open
// the queue stays open when members leave.
type syncGate struct {
	sq *syncqueue.Queue
}

// newSyncGate returns the gate of the sync queue opened as h, over h's
// messages (no second handle of them).
func (b *Broker) newSyncGate(h *zkqueue.Handles) (*syncGate, error) {
	sq, err := syncqueue.Of(b.conn, h, zkqueue.WithACL(b.acl))
	if err != nil {
		return nil, err
	}
	return &syncGate{sq: sq}, nil
}

// checkOpen returns errNotOpen until the group is complete. The state is
// cached by syncqueue and refreshed by one exists watch.
func (g *syncGate) checkOpen(ctx context.Context) error {
	open, err := g.sq.IsOpen(ctx)
	if err != nil {
		return err
	}
	if !open {
		joined, _ := g.sq.Joined(ctx)
		return fmt.Errorf("%w: %d of %d members joined", errNotOpen, joined, g.sq.Members())
	}
	return nil
}

func (g *syncGate) state(ctx context.Context) (joined int, open bool, err error) {
	if joined, err = g.sq.Joined(ctx); err != nil {
		return 0, false, err
	}
	open, err = g.sq.IsOpen(ctx)
	return joined, open, err
}

// JoinSync implements pb.QueueServer. The membership lasts while the
// stream is open: closing it (or the broker's shutdown, or the broker's
// session ending) frees the place, if the group has not opened yet.
func (b *Broker) JoinSync(req *pb.JoinSyncRequest, stream pb.Queue_JoinSyncServer) error {
	ctx, end, err := b.openStream(stream.Context())
	if err != nil {
		return err
	}
	defer end()
	if err := validName("member id", req.GetMemberId()); err != nil {
		return b.fail(err)
	}
	q, err := b.handles.queue(ctx, req.GetQueue())
	if err != nil {
		return b.fail(err)
	}
	if q.sync == nil {
		return b.fail(wrongKind(q, "only a SYNC queue has members to join"))
	}
	m, err := q.sync.sq.JoinAsync(ctx, req.GetMemberId())
	if err != nil {
		err = b.fail(ofMember(q, req.GetMemberId(), err))
	}
	id, _ := IdentityFrom(ctx)
	b.gate.audit(ctx, pb.Queue_JoinSync_FullMethodName, req, id, err)
	if err != nil {
		return err
	}
	defer func() {
		lctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		if err := m.Leave(lctx); err != nil {
			b.log.Debug("sync leave", "queue", q.name, "member", req.GetMemberId(), "err", err)
		}
	}()
	b.ev.emit(events.SyncJoined, q, zkqueue.Message{}, req.GetMemberId())

	out := newOutbox(b, stream.Send)
	defer out.close()
	var last syncqueue.Status
	for {
		st, err := m.Progress(ctx, last)
		if err != nil {
			if ctx.Err() != nil {
				return b.streamEnd()
			}
			return b.fail(ofMember(q, req.GetMemberId(), err))
		}
		last = st
		ev := &pb.SyncEvent{State: pb.SyncEvent_STATE_JOINED, Joined: uint32(st.Joined), Required: uint32(st.Members)}
		if st.Open {
			ev.State = pb.SyncEvent_STATE_OPEN
		}
		if err := out.send(ctx, ev); err != nil {
			if ctx.Err() != nil {
				return b.streamEnd()
			}
			return nil // the client is gone
		}
		if st.Open {
			b.ev.emit(events.SyncOpened, q, zkqueue.Message{}, "")
			break
		}
	}
	<-ctx.Done() // membership lasts while the stream does
	return b.streamEnd()
}
