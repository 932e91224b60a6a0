package qbroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// SyncState is the state of a synchronizing queue's group.
type SyncState int

const (
	// SyncJoined: the member joined; the queue is not open yet.
	SyncJoined SyncState = iota + 1
	// SyncOpen: all members arrived; the queue is open for consumers.
	SyncOpen
)

// String returns "joined" or "open".
func (s SyncState) String() string {
	switch s {
	case SyncJoined:
		return "joined"
	case SyncOpen:
		return "open"
	}
	return fmt.Sprintf("SyncState(%d)", int(s))
}

// SyncEvent reports a synchronizing queue's group.
type SyncEvent struct {
	State SyncState
	// Joined is the number of members joined; Required the number that
	// opens the queue.
	Joined, Required int
}

// Membership is a member's place in a synchronizing queue's group. It
// lasts as long as its JoinSync stream: until Leave, until the context
// given to JoinSync ends, or until the stream breaks (see Err). It does
// not rejoin by itself: a broken membership may have let the group lose
// its quorum, which is for the application to handle.
//
// A Membership is safe for concurrent use.
type Membership struct {
	queue  string
	events chan SyncEvent
	open   chan struct{} // closed on the first SyncOpen event
	cancel context.CancelCauseFunc
	done   chan struct{}

	mu   sync.Mutex
	last SyncEvent
	err  error
}

// eventBuffer is how many events Events holds; when full, the oldest
// is dropped (each event is a complete snapshot).
const eventBuffer = 16

// JoinSync joins the group of a KindSync queue as memberID
// ([A-Za-z0-9._-]{1,200}, unique in the group) and waits, until ctx ends,
// for the broker to confirm. The membership lasts until Leave or until
// ctx ends. Errors: ErrNotFound, ErrFailedPrecondition (not a KindSync
// queue, or the group is full), ErrAlreadyExists (the member id is taken),
// ErrInvalidArgument (bad member id).
func (c *Client) JoinSync(ctx context.Context, queue, memberID string) (*Membership, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	s, err := c.rpc.JoinSync(ctx, &pb.JoinSyncRequest{Queue: queue, MemberId: memberID})
	var first *pb.SyncEvent
	if err == nil {
		first, err = s.Recv() // honours ctx: the stream ends with it
	}
	if err != nil {
		cancel(ErrClosed)
		return nil, errorf("qbroker: join sync %s as %s: %w", queue, memberID, convErr(err))
	}
	m := &Membership{
		queue:  queue,
		events: make(chan SyncEvent, eventBuffer),
		open:   make(chan struct{}),
		cancel: cancel,
		done:   make(chan struct{}),
	}
	m.deliver(eventFromPB(first))
	go m.run(ctx, s)
	return m, nil
}

func eventFromPB(e *pb.SyncEvent) SyncEvent {
	ev := SyncEvent{Joined: int(e.GetJoined()), Required: int(e.GetRequired()), State: SyncJoined}
	if e.GetState() == pb.SyncEvent_STATE_OPEN {
		ev.State = SyncOpen
	}
	return ev
}

// deliver records ev; only the owner goroutine (and JoinSync before it
// starts) calls it.
func (m *Membership) deliver(ev SyncEvent) {
	m.mu.Lock()
	m.last = ev
	m.mu.Unlock()
	if ev.State == SyncOpen {
		select {
		case <-m.open:
		default:
			close(m.open)
		}
	}
	for {
		select {
		case m.events <- ev:
			return
		default:
		}
		select {
		case <-m.events: // drop the oldest
		default:
		}
	}
}

func (m *Membership) run(ctx context.Context, s pb.Queue_JoinSyncClient) {
	defer close(m.done)
	var err error
	for {
		var e *pb.SyncEvent
		if e, err = s.Recv(); err != nil {
			break
		}
		m.deliver(eventFromPB(e))
	}
	switch {
	case errors.Is(context.Cause(ctx), ErrClosed):
		err = nil
	case ctx.Err() != nil:
		err = ctx.Err()
	default:
		err = convErr(err)
		if err == nil || errors.Is(err, io.EOF) {
			err = ErrUnavailable // the broker ended the membership
		}
	}
	if err != nil {
		err = errorf("qbroker: sync membership in %s: %w", m.queue, err)
	}
	m.mu.Lock()
	m.err = err
	m.mu.Unlock()
	close(m.events)
}

// Events returns the group's state changes, starting with the one that
// confirmed the join. It is closed when the membership ends. A slow
// reader loses the oldest events, never the latest.
func (m *Membership) Events() <-chan SyncEvent { return m.events }

// Last returns the latest event.
func (m *Membership) Last() SyncEvent {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// WaitOpen waits until the queue opens, ctx ends, or the membership ends
// (then it returns Err, or ErrClosed).
func (m *Membership) WaitOpen(ctx context.Context) error {
	select {
	case <-m.open:
		return nil
	default:
	}
	select {
	case <-m.open:
		return nil
	case <-m.done:
		select {
		case <-m.open:
			return nil
		default:
		}
		if err := m.Err(); err != nil {
			return err
		}
		return errorf("qbroker: sync membership in %s: %w", m.queue, ErrClosed)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Err returns why the membership ended: nil while it lasts and after
// Leave; the context's error; ErrUnavailable (or the broker's error) when
// the stream broke.
func (m *Membership) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Leave ends the membership (closes the stream) and waits for its
// goroutine. It returns the error that had ended the membership before,
// if any.
func (m *Membership) Leave() error {
	m.cancel(ErrClosed)
	<-m.done
	return m.Err()
}
