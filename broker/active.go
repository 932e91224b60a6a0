package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/zkqueue"
)

// Single active consumer (queues created with single_active_consumer).
//
// Across brokers, the queue's active/ node (zkqueue.Handles.Active) is a
// leader election (package election): a broker with Consume streams on
// the queue campaigns there once, with one EPHEMERAL_SEQUENTIAL node of
// its primary session, each waiting broker watching only the node ahead
// of its own. Within the broker, its streams wait in line (higher stream
// priority first, then arrival): while the broker leads, the first
// stream in line is the queue's one active stream; the others are
// standbys. When the active stream ends, the next one in line takes over;
// when none is left, the broker resigns and the next broker leads.
//
// A turn starts only when no delivery of the queue can still be settled
// (zkqueue.Leases.Revoke): a stream that ends normally released its
// unsettled leases before it leaves the line, and the leases of a stream
// whose broker died are revoked, whatever their deadline, so a takeover
// after a broker's death takes its session timeout. A stream's turn lasts
// while the broker keeps the ZooKeeper session under which the turn
// started: every claim is checked against that session, and a stream
// whose broker lost it (its candidate node may be gone, another broker
// leading) ends with Unavailable; its client consumes again, as a standby.

// activeGates are the broker's gates of single-active queues, by name.
type activeGates struct {
	b *Broker

	mu    sync.Mutex
	gates map[string]*activeGate
	last  map[string]chan struct{} // done of the latest gate of a name
}

// activeGate is one queue's line of streams on this broker and the
// broker's campaign for the queue (run).
type activeGate struct {
	b    *Broker
	name string
	path string // the election's node

	mu   sync.Mutex
	line []*activeTurn
	wake chan struct{} // a turn joined or left
	done chan struct{} // closed when run returned
	gone chan struct{} // closed when the election's node is gone: the queue was deleted
}

// activeTurn is one stream's place in its queue's line.
type activeTurn struct {
	g       *activeGate
	q       *queue
	prio    int
	ready   chan struct{} // closed when the turn starts
	lost    chan struct{} // closed when the turn ended under the stream
	left    chan struct{} // closed by leave
	session int64         // b.member.sessions when the turn started; set before ready
	once    sync.Once
}

// errTurnLost ends an active stream whose broker lost the session of its
// turn (Unavailable: consume again).
var errTurnLost = fmt.Errorf("this broker lost the ZooKeeper session under which the stream was the single active consumer: %w", zk.ErrSessionExpired)

// joinActive puts a stream of the single-active queue q in its line.
func (ag *activeGates) joinActive(q *queue, prio int) *activeTurn {
	b := ag.b
	t := &activeTurn{q: q, prio: prio, ready: make(chan struct{}), lost: make(chan struct{}), left: make(chan struct{})}
	a := &b.active
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.gates == nil {
		a.gates, a.last = map[string]*activeGate{}, map[string]chan struct{}{}
	}
	g := a.gates[q.name]
	if g == nil {
		g = &activeGate{b: b, name: q.name, path: q.h.Active, wake: make(chan struct{}, 1), done: make(chan struct{}),
			gone: make(chan struct{})}
		prev := a.last[q.name]
		a.gates[q.name], a.last[q.name] = g, g.done
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			if prev != nil {
				<-prev // one campaign per session in an election
			}
			g.run(b.ctx)
		}()
	}
	t.g = g
	g.mu.Lock()
	g.line = append(g.line, t)
	g.mu.Unlock()
	g.poke()
	return t
}

func (g *activeGate) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// leave takes the stream out of the line, after it released its leases.
func (t *activeTurn) leave() {
	g := t.g
	g.drop(t)
	t.once.Do(func() { close(t.left) })
	g.poke()
}

// wait blocks until the stream's turn has started; errTurnLost when it
// ended under the stream.
func (t *activeTurn) wait(ctx context.Context) error {
	select {
	case <-t.ready:
	case <-t.g.gone:
		return fmt.Errorf("%w: %s (deleted)", errQueueNotFound, t.g.name)
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-t.lost:
		return errTurnLost
	default:
	}
	if t.g.b.member.sessions.Load() != t.session || !t.g.b.member.hasSession.Load() {
		return errTurnLost
	}
	return nil
}

// fence makes unsendable the claims cs made under another session than
// the turn's (sendable compares a claim's session with the current one).
func (t *activeTurn) fence(cs []claimed) {
	for i := range cs {
		if cs[i].session != t.session {
			cs[i].session = 0 // never a session's count
		}
	}
}

// drop takes a turn that ended under its stream out of the line: its
// stream ends (errTurnLost) and its client consumes again.
func (g *activeGate) drop(t *activeTurn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, x := range g.line {
		if x == t {
			g.line = append(g.line[:i], g.line[i+1:]...)
			return
		}
	}
}

// next returns the first turn in line: the highest priority, then the
// earliest; nil when the line is empty.
func (g *activeGate) next() *activeTurn {
	g.mu.Lock()
	defer g.mu.Unlock()
	var best *activeTurn
	for _, t := range g.line {
		if best == nil || t.prio > best.prio {
			best = t
		}
	}
	return best
}

// idle ends the gate when its line is empty: it leaves the broker's
// gates, so a stream joining later starts a gate of its own.
func (g *activeGate) idle() bool {
	a := &g.b.active
	a.mu.Lock()
	defer a.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.line) > 0 {
		return false
	}
	delete(a.gates, g.name)
	return true
}

// activeRetry is the pause before campaigning again after a failure.
const activeRetry = 200 * time.Millisecond

// run campaigns for the queue while streams wait in line and serves
// their turns while leading, until the line is empty or ctx ends.
func (g *activeGate) run(ctx context.Context) {
	defer close(g.done)
	b := g.b
	var el *election.Election
	defer func() {
		if el != nil {
			_ = el.Close()
		}
	}()
	for !g.idle() {
		var err error
		if el == nil {
			el, err = election.New(b.conn, g.path, election.WithCreateParents(false), election.WithACL(b.acl),
				election.WithLogger(b.log), election.WithOwner(b.cfg.ID))
			if err != nil {
				el = nil
			}
		}
		if err == nil {
			err = g.campaign(ctx, el)
			if errors.Is(err, context.Canceled) && ctx.Err() == nil {
				continue // the line emptied while waiting
			}
		}
		if err == nil {
			b.log.Debug("single active consumer: leading", "queue", g.name, "znode", el.Key())
			err = g.serve(ctx, el)
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			if rerr := el.Resign(rctx); rerr != nil {
				b.log.Debug("single active consumer: resign", "queue", g.name, "err", rerr)
			}
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, zk.ErrNoNode) {
			g.deleted(ctx)
			return
		}
		if err != nil {
			b.log.Debug("single active consumer", "queue", g.name, "err", err)
			if !sleepCtx(ctx, activeRetry) {
				return
			}
		}
	}
}

// deleted ends the waits of the streams in line, whose queue was deleted
// (its election's node is gone), and waits for them to leave.
func (g *activeGate) deleted(ctx context.Context) {
	close(g.gone)
	for !g.idle() {
		select {
		case <-g.wake:
		case <-ctx.Done():
			return
		}
	}
}

// campaign waits to lead the queue's election; it gives up (Canceled)
// when the line empties meanwhile.
func (g *activeGate) campaign(ctx context.Context, el *election.Election) error {
	cctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-g.wake:
				if g.next() == nil {
					cancel()
					return
				}
			case <-cctx.Done():
				return
			}
		}
	}()
	err := el.Campaign(cctx, []byte(g.b.cfg.ID))
	cancel()
	<-stopped
	return err
}

// serve gives the turns in line one after the other while the broker
// leads; it returns nil when the line is empty, an error when the
// leadership was lost or a wait failed.
func (g *activeGate) serve(ctx context.Context, el *election.Election) error {
	b := g.b
	for {
		t := g.next()
		if t == nil {
			return nil
		}
		if err := g.clear(ctx, el, t); err != nil {
			return err
		}
		select {
		case <-t.left:
			continue // took itself out of the line before starting
		default:
		}
		if !b.member.hasSession.Load() {
			if !sleepCtx(ctx, activeRetry) {
				return ctx.Err()
			}
			continue // clear looks again once the session is back
		}
		select {
		case <-el.Done():
			return fmt.Errorf("single active consumer of %s: leadership lost", g.name)
		default:
		}
		t.session = b.member.sessions.Load()
		t.q.items.Rescan() // from the head: another broker may have put messages back
		close(t.ready)
		b.log.Debug("single active consumer: turn started", "queue", g.name)
		select {
		case <-t.left:
		case <-el.Done():
			close(t.lost)
			g.drop(t)
			return fmt.Errorf("single active consumer of %s: leadership lost", g.name)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// clear revokes every delivery of the queue that could still be settled
// (nil), or returns when the turn's stream left (nil) or the leadership
// is lost; a failed revocation is retried every activeRetry.
func (g *activeGate) clear(ctx context.Context, el *election.Election, t *activeTurn) error {
	b := g.b
	wctx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-el.Done():
		case <-t.left:
		case <-wctx.Done():
		}
		cancel()
	}()
	defer func() { cancel(); <-exited }()
	for {
		select {
		case <-el.Done():
			return fmt.Errorf("single active consumer of %s: leadership lost", g.name)
		case <-t.left:
			return nil
		default:
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		err := t.q.leases.Revoke(wctx, t.q.policy, func(m zkqueue.Message, out zkqueue.Outcome) { b.acks.released(t.q, m, out) })
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrNoNode):
			return fmt.Errorf("single active consumer of %s: %w", g.name, err)
		case wctx.Err() == nil:
			b.log.Debug("single active consumer: revoking the leases", "queue", g.name, "err", err)
			sleepCtx(wctx, activeRetry)
		}
	}
}

// sleepCtx waits d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
