package qbroker

import (
	"context"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// Counter is a 64-bit signed counter of the brokers' Counter service,
// by name: linearizable (reads too), kept in ZooKeeper. A counter never
// written reads 0. A Counter is a name and a client: safe for concurrent
// use, free to make.
//
// Add, CompareAndSet and Set are not retried by the client: an answer
// lost with the connection (ErrUnavailable, or the context's end while
// the call was on its way) leaves their outcome unknown, and a blind
// retry of Add may add twice. For a change exactly once, Get the value v,
// then CompareAndSet(v, new); after an unknown outcome, Get again: still
// v means it was not applied.
type Counter struct {
	c    *Client
	name string
}

// Counter returns the counter name ([A-Za-z0-9._-]{1,200}).
func (c *Client) Counter(name string) *Counter { return &Counter{c: c, name: name} }

// Name returns the counter's name.
func (n *Counter) Name() string { return n.name }

// Get returns the counter's value at a moment during the call. Errors:
// ErrInvalidArgument (bad name), ErrPermissionDenied, ErrUnavailable.
func (n *Counter) Get(ctx context.Context) (int64, error) {
	ctx, cancel := n.c.callCtx(ctx, 0)
	defer cancel()
	r, err := n.c.count.Get(ctx, &pb.CounterGetRequest{Name: n.name})
	if err != nil {
		return 0, errorf("qbroker: get counter %s: %w", n.name, convErr(err))
	}
	return r.GetValue(), nil
}

// Add adds delta and returns the new value. Errors: ErrInvalidArgument
// (bad name; the sum beyond int64, which changes nothing),
// ErrPermissionDenied, ErrUnavailable (the outcome may be unknown: see
// Counter).
func (n *Counter) Add(ctx context.Context, delta int64) (int64, error) {
	ctx, cancel := n.c.callCtx(ctx, 0)
	defer cancel()
	r, err := n.c.count.Add(ctx, &pb.CounterAddRequest{Name: n.name, Delta: delta})
	if err != nil {
		return 0, errorf("qbroker: add to counter %s: %w", n.name, convErr(err))
	}
	return r.GetValue(), nil
}

// CompareAndSet sets the counter to new if it is old, and reports whether
// it did. Errors as Add's.
func (n *Counter) CompareAndSet(ctx context.Context, old, new int64) (bool, error) {
	ctx, cancel := n.c.callCtx(ctx, 0)
	defer cancel()
	r, err := n.c.count.CompareAndSet(ctx, &pb.CounterCompareAndSetRequest{Name: n.name, OldValue: old, NewValue: new})
	if err != nil {
		return false, errorf("qbroker: compare-and-set counter %s: %w", n.name, convErr(err))
	}
	return r.GetSwapped(), nil
}

// Set sets the counter to v and returns the value it replaced. Errors as
// Add's.
func (n *Counter) Set(ctx context.Context, v int64) (old int64, err error) {
	ctx, cancel := n.c.callCtx(ctx, 0)
	defer cancel()
	r, err := n.c.count.Set(ctx, &pb.CounterSetRequest{Name: n.name, Value: v})
	if err != nil {
		return 0, errorf("qbroker: set counter %s: %w", n.name, convErr(err))
	}
	return r.GetValue(), nil
}
