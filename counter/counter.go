package counter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
)

// Errors of the package.
var (
	// ErrInvalid: a bad argument (New's path).
	ErrInvalid = errors.New("counter: invalid argument")
	// ErrOverflow: an Add whose result is beyond int64; the counter is
	// unchanged.
	ErrOverflow = errors.New("counter: add overflows int64")
	// ErrCorrupt: the value node holds something other than a decimal
	// int64 (written by another program); nothing is changed.
	ErrCorrupt = errors.New("counter: value is not a 64-bit integer")
	// ErrUnknownOutcome: a write's answer was lost with the connection;
	// it may or may not have been applied. Errors wrapping it also wrap
	// the connection's error.
	ErrUnknownOutcome = errors.New("counter: outcome unknown")
)

// Counter is a 64-bit signed counter in ZooKeeper. It is safe for
// concurrent use; its operations on one Counter and on Counters of
// other sessions are linearizable (see the package doc).
type Counter struct {
	conn *zk.Conn
	path string
	opts options

	mu   sync.Mutex
	last state // the latest state this Counter knows of; a hint only

	adds adds // Adds waiting to be combined (combine.go)
}

// New returns the counter at p, an absolute ZooKeeper path. It does no
// I/O: the first write creates p and its missing parents. It returns
// ErrInvalid for a bad path.
func New(conn *zk.Conn, p string, opts ...Option) (*Counter, error) {
	if p == "" || p[0] != '/' || p == "/" || path.Clean(p) != p {
		return nil, fmt.Errorf("%w: path %q: want an absolute, clean ZooKeeper path other than /", ErrInvalid, p)
	}
	if conn == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrInvalid)
	}
	o := defaults()
	for _, opt := range opts {
		opt(&o)
	}
	return &Counter{conn: conn, path: p, opts: o}, nil
}

// Path returns the counter's node.
func (c *Counter) Path() string { return c.path }

// Get returns the counter's value: 0 for a counter never written. The
// value is confirmed by a ZooKeeper transaction (a version check), so it
// is the counter's value at a moment between the call and its return,
// never an older one. It creates nothing.
func (c *Counter) Get(ctx context.Context) (int64, error) {
	st, _, err := c.do(ctx, "get", func(cur int64) (int64, bool, error) { return cur, false, nil })
	return st.value, err
}

// CompareAndSet sets the counter to new if its value is old, and reports
// whether it did. A false answer is confirmed like Get's: the value was
// not old at a moment during the call. CompareAndSet(old, old) writes
// nothing. Errors as Add's.
func (c *Counter) CompareAndSet(ctx context.Context, old, new int64) (bool, error) {
	_, _, err := c.do(ctx, "compare-and-set", func(cur int64) (int64, bool, error) {
		if cur != old {
			return cur, false, errNoSwap
		}
		return new, new != old, nil
	})
	if errors.Is(err, errNoSwap) {
		return false, nil
	}
	return err == nil, err
}

// errNoSwap is CompareAndSet's answer of a value other than old.
var errNoSwap = errors.New("counter: value differs")

// Set sets the counter to v and returns the value it replaced. Errors as
// Add's.
func (c *Counter) Set(ctx context.Context, v int64) (old int64, err error) {
	var prev int64
	_, _, err = c.do(ctx, "set", func(cur int64) (int64, bool, error) {
		prev = cur
		return v, v != cur, nil
	})
	return prev, err
}

// update decides an operation's outcome from the counter's value cur:
// the value to write and whether to write it, or an error to return once
// cur is confirmed.
type update func(cur int64) (next int64, write bool, err error)

// do runs f against the counter until its outcome holds (settle). It
// returns the final state and whether it wrote.
func (c *Counter) do(ctx context.Context, op string, f update) (state, bool, error) {
	st, known := c.hint()
	for conflicts := 0; ; {
		if err := backoff(ctx, conflicts); err != nil {
			return state{}, false, err
		}
		if !known {
			var err error
			if st, err = c.read(st.node); err != nil {
				return state{}, false, err
			}
		}
		known = false
		next, write, ferr := f(st.value)
		ns, err := c.settle(st, next, write)
		if errors.Is(err, errStale) {
			if !st.absent {
				conflicts++
			}
			continue
		}
		if err != nil {
			return state{}, false, errfmt.Errorf("counter: %s: %w", op, err)
		}
		return ns, write, ferr
	}
}

// settle makes an outcome hold on the state st: a versioned write of
// next when write is set, else a check that st is still the counter's
// state. It returns the state then, or errStale when st is not the
// counter's any more (the conflict hook has run, except for an absent
// counter made by the write).
func (c *Counter) settle(st state, next int64, write bool) (state, error) {
	if !write {
		if err := c.confirm(st); err != nil {
			if errors.Is(err, errStale) {
				c.conflict()
			}
			return state{}, err
		}
		c.remember(st)
		return st, nil
	}
	ns, rolled, err := c.write(st, next)
	if err != nil {
		if errors.Is(err, errStale) && !st.absent {
			c.conflict()
		}
		return state{}, err
	}
	c.remember(ns)
	if c.opts.onWrite != nil {
		c.opts.onWrite(Write{Old: st.value, New: next, Node: ns.node, Version: ns.version, Rollover: rolled})
	}
	return ns, nil
}

func (c *Counter) conflict() {
	if c.opts.onConflict != nil {
		c.opts.onConflict()
	}
}

// hint returns the latest state this Counter knows of, and whether it
// knows one. An operation may try it without reading: a write or check
// on it succeeds only if it is still the counter's state.
func (c *Counter) hint() (state, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, c.last.node != ""
}

func (c *Counter) remember(st state) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = st // a later state may be overwritten: it costs a read
}

// backoff waits before the next try after conflicts conflicts in a row:
// a random time up to 1 ms doubled per conflict, at most 32 ms, so that
// contenders who all lost to one writer do not all come back at once.
func backoff(ctx context.Context, conflicts int) error {
	if conflicts < 2 {
		return ctx.Err() // the first retry at once: the conflict may be ours alone
	}
	limit := time.Millisecond << min(conflicts-2, 5)
	t := time.NewTimer(rand.N(limit))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
