package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"time"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/syncqueue"
	"github.com/qbroker/qbroker/zkqueue"
)

// The barrier services map gRPC onto package syncqueue's Barrier and
// DoubleBarrier recipes:
//
//	/<root>/barriers/<name>                  PERSISTENT: the barrier is set while it exists
//	/<root>/doublebarriers/<name>/p@NNNNNNNNNN  EPHEMERAL_SEQUENTIAL participants
//	/<root>/doublebarriers/<name>/ready      made by the arrival that completes the count
//
// A barrier is state a client sets and removes; nothing else deletes it.
// A double barrier's participant is a node of the broker's primary
// session, present while its Enter stream is open: a client that goes
// away, or a broker that dies, leaves (the node goes with the stream or
// the session). The leader deletes idle double barriers
// (reapCoordination).

// maxBarrierCount bounds a double barrier's count: every arrival lists
// the participants, so the list must stay well under jute.maxbuffer.
const maxBarrierCount = syncqueue.MaxMembers

// participantID is every participant's id in its node's name: the
// participants of one broker share its session, and the node's sequence
// tells them apart.
const participantID = "p"

// errParticipantLost ends an Enter stream whose participant node went
// while it was entered.
var errParticipantLost = errors.New("double barrier participant lost")

// barrierServer serves qbroker.v1.Barrier (api/coord.proto) with
// syncqueue.Barrier.
type barrierServer struct {
	pb.UnimplementedBarrierServer
	b *Broker
}

var _ pb.BarrierServer = barrierServer{}

// barrierOf checks a barrier's name and returns its recipe.
func (s barrierServer) barrierOf(name string) (*syncqueue.Barrier, error) {
	b := s.b
	if err := validName("barrier name", name); err != nil {
		return nil, err
	}
	p, err := b.root.Barrier(name)
	if err != nil {
		return nil, invalidf("%v", err)
	}
	return syncqueue.NewBarrier(b.conn, p, zkqueue.WithACL(b.acl))
}

// Set implements pb.BarrierServer.
func (s barrierServer) Set(ctx context.Context, req *pb.SetBarrierRequest) (*pb.SetBarrierResponse, error) {
	b := s.b
	bar, err := s.barrierOf(req.GetName())
	if err == nil {
		err = b.zkmem.admitNode(0, "this barrier")
	}
	if err == nil {
		err = bar.Set(ctx)
	}
	if err != nil {
		return nil, b.fail(err)
	}
	b.ev.emitBarrier(events.BarrierSet, req.GetName(), "", "")
	return &pb.SetBarrierResponse{}, nil
}

// Remove implements pb.BarrierServer.
func (s barrierServer) Remove(ctx context.Context, req *pb.RemoveBarrierRequest) (*pb.RemoveBarrierResponse, error) {
	b := s.b
	bar, err := s.barrierOf(req.GetName())
	if err == nil {
		err = bar.Remove(ctx)
	}
	if err != nil {
		return nil, b.fail(err)
	}
	b.ev.emitBarrier(events.BarrierRemoved, req.GetName(), "", "")
	return &pb.RemoveBarrierResponse{}, nil
}

// Wait implements pb.BarrierServer. It waits on an exists watch of the
// barrier's node; it counts as a stream (MaxStreams) while it waits, and
// the broker's Shutdown ends it with Unavailable.
func (s barrierServer) Wait(ctx context.Context, req *pb.WaitBarrierRequest) (*pb.WaitBarrierResponse, error) {
	b := s.b
	bar, err := s.barrierOf(req.GetName())
	if err != nil {
		return nil, b.fail(err)
	}
	ctx, end, err := b.openStream(ctx)
	if err != nil {
		return nil, err
	}
	defer end()
	b.metrics.barrierWaits.Inc()
	defer b.metrics.barrierWaits.Dec()
	if err := bar.Wait(ctx); err != nil {
		if b.ctx.Err() != nil {
			return nil, b.fail(errClosing)
		}
		return nil, b.fail(err)
	}
	return &pb.WaitBarrierResponse{}, nil
}

// doubleBarrierServer serves qbroker.v1.DoubleBarrier (api/coord.proto)
// with syncqueue.DoubleBarrier.
type doubleBarrierServer struct {
	pb.UnimplementedDoubleBarrierServer
	b *Broker
}

var _ pb.DoubleBarrierServer = doubleBarrierServer{}

// doubleBarrierPathOf checks a double barrier's name and count and
// returns its node.
func (s doubleBarrierServer) doubleBarrierPathOf(name string, count int32) (string, error) {
	b := s.b
	if err := validName("double barrier name", name); err != nil {
		return "", err
	}
	if count < 1 || count > maxBarrierCount {
		return "", invalidf("count %d: want 1 to %d participants", count, maxBarrierCount)
	}
	p, err := b.root.DoubleBarrier(name)
	if err != nil {
		return "", invalidf("%v", err)
	}
	return p, nil
}

// Enter implements pb.DoubleBarrierServer. The participant is a node of
// the broker's primary session, present until the client leaves (leave:
// the recipe's Leave, waiting for the others) or goes (the stream's end:
// the node is deleted at once), the broker shuts down, or the node is
// lost.
func (s doubleBarrierServer) Enter(stream pb.DoubleBarrier_EnterServer) error {
	b := s.b
	ctx, end, err := b.openStream(stream.Context())
	if err != nil {
		return err
	}
	defer end()
	// The receiver's ended is the client's leave or its going away
	// (leaveAsked tells them apart).
	rx := newReceiver(b, ctx, stream.Recv, (*pb.DoubleBarrierRequest).GetLeave)
	defer rx.close()
	first, err := firstRequest(ctx, b, rx, "double barrier request")
	if errors.Is(err, io.EOF) || err != nil && rx.failed() {
		return nil
	}
	if err != nil {
		return err
	}
	rx.close() // after the first request, only the leave matters
	name := first.GetName()
	p, err := s.doubleBarrierPathOf(name, first.GetCount())
	if err != nil {
		return b.fail(err)
	}
	if first.GetLeave() {
		return nil // left before entering
	}
	if err := b.zkmem.admitNode(0, "this double barrier participant"); err != nil {
		return b.fail(err)
	}
	db, err := syncqueue.NewDoubleBarrier(b.conn, p, int(first.GetCount()), participantID, zkqueue.WithACL(b.acl))
	if err != nil {
		return b.fail(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			b.log.Warn("double barrier: leaving failed; the node goes with the session", "double_barrier", name, "err", err)
		}
	}()
	b.metrics.participants.Inc()
	defer b.metrics.participants.Dec()
	start := time.Now()
	if err := db.Enter(rx.ended); err != nil {
		if rx.ended.Err() != nil {
			return b.streamEnd() // left or gone while waiting
		}
		return b.fail(err)
	}
	b.metrics.barrierEnterWait.Observe(time.Since(start).Seconds())
	return s.holdParticipant(ctx, stream, rx, name, db)
}

// holdParticipant tells the client it entered, then waits for its leave
// (Leave, then LEFT), its going away or the participant's loss (LOST,
// then Aborted).
func (s doubleBarrierServer) holdParticipant(ctx context.Context, stream pb.DoubleBarrier_EnterServer, rx *receiver[*pb.DoubleBarrierRequest],
	name string, db *syncqueue.DoubleBarrier) error {
	b := s.b
	node := db.Key()
	key := path.Base(node)
	b.ev.emitBarrier(events.DoubleBarrierEntered, "", name, key)
	defer b.ev.emitBarrier(events.DoubleBarrierLeft, "", name, key)
	out := newOutbox(b, stream.Send)
	defer out.close()
	event := func(t pb.DoubleBarrierEvent_Type) error {
		return out.send(ctx, &pb.DoubleBarrierEvent{Type: t, Key: key})
	}
	if err := event(pb.DoubleBarrierEvent_TYPE_ENTERED); err != nil {
		return b.streamEnd()
	}
	switch err := db.Held(rx.ended); {
	case errors.Is(err, syncqueue.ErrParticipantLost):
		return s.participantLost(ctx, out, name, key, err)
	case rx.ended.Err() == nil:
		return b.fail(err)
	}
	if !leaveAsked(ctx, rx) {
		return b.streamEnd() // gone: the deferred Close leaves at once
	}
	if err := db.Leave(ctx); err != nil {
		if ctx.Err() != nil {
			return b.streamEnd()
		}
		return b.fail(err)
	}
	if err := event(pb.DoubleBarrierEvent_TYPE_LEFT); err != nil {
		return b.streamEnd()
	}
	return nil
}

// participantLost sends LOST and ends the stream with Aborted.
func (s doubleBarrierServer) participantLost(ctx context.Context, out *outbox[*pb.DoubleBarrierEvent], name, key string, why error) error {
	b := s.b
	_ = out.send(ctx, &pb.DoubleBarrierEvent{Type: pb.DoubleBarrierEvent_TYPE_LOST, Key: key})
	b.log.Debug("double barrier participant lost", "double_barrier", name, "znode", key, "err", why)
	return b.fail(fmt.Errorf("%w: %s", errParticipantLost, name))
}

// leaveAsked reports, once rx.ended is done, whether the client sent
// leave rather than went away. The receiver records Recv's failure before
// it ends ended, and a stream context still live means ended ended by the
// receiver's own hand.
func leaveAsked(ctx context.Context, rx *receiver[*pb.DoubleBarrierRequest]) bool {
	return ctx.Err() == nil && rx.err == nil
}

// emitBarrier emits a barrier event: kind of barrier or doubleBarrier
// name, for a participant's node name key (double barrier events).
func (em *emitter) emitBarrier(kind events.Kind, barrier, doubleBarrier, key string) {
	b := em.b
	if em.sink == nil {
		return
	}
	id := fmt.Sprintf("double_barrier/%s/%s/%s", doubleBarrier, kind, key)
	if barrier != "" {
		// Each Set and Remove is its own event.
		id = fmt.Sprintf("barrier/%s/%s/%s/%d", barrier, kind, b.cfg.ID, time.Now().UnixNano())
	}
	em.sink.Emit(events.Event{
		ID:            id,
		Kind:          kind,
		Barrier:       barrier,
		DoubleBarrier: doubleBarrier,
		Key:           key,
		Broker:        b.cfg.ID,
		Time:          time.Now(),
	})
}
