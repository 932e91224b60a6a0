package counter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/qbroker/qbroker/internal/errfmt"
)

// Adds through one Counter are combined: while one write is on its way,
// the Adds that come are queued, and the next write adds them all at
// once. Every Add of a write takes effect at that write, in queue order,
// and gets its own result (the value after it). The counter node is
// written serially (each write needs the version the last one made), so
// combining is what lets one Counter do more than one Add per round trip
// to ZooKeeper: a broker serving many clients' Adds to one counter keeps
// one Counter per counter for this.
//
// One goroutine, the combiner, runs the writes while Adds are queued and
// ends when none is.

// adds is a Counter's queue of Adds.
type adds struct {
	mu      sync.Mutex
	queue   []*pendingAdd
	running bool // a combiner runs
}

// An Add's stages, under adds.mu.
const (
	addQueued   = iota // waiting; the caller may leave
	addInFlight        // in a write on its way: its outcome is unknown until it is back
	addDone            // result and err set, done closed
	addGone            // its caller left while it was queued: skipped
	addLeft            // its caller left while it was in flight
)

type pendingAdd struct {
	delta  int64
	stage  int
	result int64
	err    error
	done   chan struct{}
}

// Add adds delta to the counter and returns the new value. Concurrent
// Adds through this Counter are combined into one write (combine.go).
// It returns ErrOverflow, changing nothing, when the sum is beyond int64.
// It returns an error wrapping ErrUnknownOutcome when the outcome cannot
// be known: the write's answer was lost with the connection, or ctx
// ended while the write was on its way. The add may then have been
// applied, and retrying it may add twice; see the package doc for
// exactly-once updates. When ctx ends before the write, it returns
// ctx.Err() and adds nothing.
func (c *Counter) Add(ctx context.Context, delta int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	p := &pendingAdd{delta: delta, done: make(chan struct{})}
	a := &c.adds
	a.mu.Lock()
	a.queue = append(a.queue, p)
	if !a.running {
		a.running = true
		go c.combine()
	}
	a.mu.Unlock()
	select {
	case <-p.done:
		return p.result, p.err
	case <-ctx.Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch p.stage {
	case addDone:
		return p.result, p.err
	case addInFlight:
		p.stage = addLeft
		return 0, errfmt.Errorf("counter: add: %w: %w", ErrUnknownOutcome, ctx.Err())
	default:
		p.stage = addGone
		return 0, ctx.Err()
	}
}

// combine runs writes until no Add is queued.
func (c *Counter) combine() {
	a := &c.adds
	var batch []*pendingAdd
	st, known := c.hint()
	for conflicts := 0; ; {
		_ = backoff(context.Background(), conflicts)
		// The Adds of this try: those still queued, old and new.
		a.mu.Lock()
		batch = append(batch, a.queue...)
		a.queue = nil
		live := batch[:0]
		for _, p := range batch {
			if p.stage == addQueued {
				live = append(live, p)
			}
		}
		batch = live
		if len(batch) == 0 {
			a.running = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		if !known {
			var err error
			if st, err = c.read(st.node); err != nil {
				c.finish(batch, err)
				batch = nil
				continue
			}
		}
		known = false
		// Each Add in turn: its result, or ErrOverflow.
		cur := st.value
		results := make([]int64, len(batch))
		errs := make([]error, len(batch))
		for i, p := range batch {
			d := p.delta
			if d > 0 && cur > math.MaxInt64-d || d < 0 && cur < math.MinInt64-d {
				errs[i] = fmt.Errorf("%w: %d%+d", ErrOverflow, cur, d)
				continue
			}
			cur += d
			results[i] = cur
		}
		a.mu.Lock()
		for _, p := range batch {
			p.stage = addInFlight
		}
		a.mu.Unlock()
		ns, err := c.settle(st, cur, cur != st.value)
		a.mu.Lock()
		for _, p := range batch {
			if p.stage == addInFlight {
				p.stage = addQueued
			}
		}
		a.mu.Unlock()
		if errors.Is(err, errStale) {
			if !st.absent {
				conflicts++
			}
			continue
		}
		conflicts = 0
		if err != nil {
			c.finish(batch, errfmt.Errorf("counter: add: %w", err))
		} else {
			st, known = ns, true
			a.mu.Lock()
			for i, p := range batch {
				if p.stage == addQueued {
					p.result, p.err, p.stage = results[i], errs[i], addDone
					close(p.done)
				}
			}
			a.mu.Unlock()
		}
		batch = nil
	}
}

// finish ends the Adds of batch still waiting with err.
func (c *Counter) finish(batch []*pendingAdd, err error) {
	c.adds.mu.Lock()
	defer c.adds.mu.Unlock()
	for _, p := range batch {
		if p.stage == addQueued {
			p.err, p.stage = err, addDone
			close(p.done)
		}
	}
}
