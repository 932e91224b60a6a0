package broker

import (
	"context"
	"sync"
	"sync/atomic"
)

// Consumer priority.
//
// A Consume stream may carry a priority (Subscribe.priority, default 0).
// Among the streams of one queue on this broker, a stream claims messages
// only while no stream of higher priority has credit (credit left, or a
// claim under way with the credit it took): lower ones get messages only
// when all higher ones are full. A lower stream's claim that waits for
// messages is cancelled as soon as a higher one gets credit (a claim
// already under way runs to its end: claims are never abandoned), so a
// message that arrives then goes to the higher stream.
//
// Priorities are compared among one broker's streams only: streams on
// different brokers share the queue as without priorities.
//
// All of a queue's streams join its board, so a stream of another
// priority arriving later is seen; but the board acts only while its
// streams' priorities differ (mixed): a queue whose streams all have the
// same priority pays no lock and no wake-up per message.

// Stream priorities.
const (
	minStreamPriority = -1000
	maxStreamPriority = 1000
)

// prioBoards are the broker's boards, one per queue with open streams.
type prioBoards struct {
	mu sync.Mutex
	m  map[string]*prioBoard
}

// prioBoard is one queue's Consume streams on this broker and their
// priorities.
type prioBoard struct {
	name    string
	mu      sync.Mutex
	members map[*consumeState]struct{}
	changed chan struct{} // closed and replaced when a member's credit changes
	mixed   atomic.Bool   // the members' priorities differ
}

// join adds st (its prio set) to the board of queue name.
func (p *prioBoards) join(name string, st *consumeState) *prioBoard {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]*prioBoard{}
	}
	bd := p.m[name]
	if bd == nil {
		bd = &prioBoard{name: name, members: map[*consumeState]struct{}{}, changed: make(chan struct{})}
		p.m[name] = bd
	}
	bd.mu.Lock()
	bd.members[st] = struct{}{}
	bd.update()
	bd.mu.Unlock()
	st.board = bd
	return bd
}

// leave takes st off its board, dropping the board when it was the last.
func (p *prioBoards) leave(st *consumeState) {
	bd := st.board
	p.mu.Lock()
	defer p.mu.Unlock()
	bd.mu.Lock()
	delete(bd.members, st)
	bd.update()
	empty := len(bd.members) == 0
	bd.mu.Unlock()
	if empty && p.m[bd.name] == bd {
		delete(p.m, bd.name)
	}
}

// update recomputes mixed and wakes the waiting members. bd.mu is held.
func (bd *prioBoard) update() {
	first, mixed := 0, false
	i := 0
	for st := range bd.members {
		if i == 0 {
			first = st.prio
		} else if st.prio != first {
			mixed = true
		}
		i++
	}
	bd.mixed.Store(mixed)
	bd.changedLocked()
}

// changedLocked wakes the members waiting in admit and cancels the
// waiting claims of members below a member with credit. bd.mu is held.
func (bd *prioBoard) changedLocked() {
	close(bd.changed)
	bd.changed = make(chan struct{})
	top, any := bd.topReady()
	if !any {
		return
	}
	for st := range bd.members {
		if st.prio < top {
			st.preemptTake()
		}
	}
}

// topReady returns the highest priority of a member with credit. bd.mu
// is held.
func (bd *prioBoard) topReady() (top int, any bool) {
	for st := range bd.members {
		if st.ready() && (!any || st.prio > top) {
			top, any = st.prio, true
		}
	}
	return top, any
}

// changed is called when st's credit changed.
func (bd *prioBoard) creditChanged() {
	if !bd.mixed.Load() {
		return
	}
	bd.mu.Lock()
	bd.changedLocked()
	bd.mu.Unlock()
}

// admit waits until no member of higher priority than st has credit and
// returns the context of st's next claim: it is cancelled (cancel must be
// called when the claim returns) as soon as a higher member gets credit.
// Without mixed priorities, or without a board (a stream of a
// single-active queue, where priority only orders the line), it returns
// ctx.
func (bd *prioBoard) admit(ctx context.Context, st *consumeState) (context.Context, context.CancelFunc, error) {
	for {
		if bd == nil || !bd.mixed.Load() {
			return ctx, func() {}, nil
		}
		bd.mu.Lock()
		blocked := false
		for m := range bd.members {
			if m.prio > st.prio && m.ready() {
				blocked = true
				break
			}
		}
		ch := bd.changed
		if !blocked {
			tctx, cancel := context.WithCancel(ctx)
			st.setPreempt(cancel)
			bd.mu.Unlock()
			return tctx, func() { st.setPreempt(nil); cancel() }, nil
		}
		bd.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}
