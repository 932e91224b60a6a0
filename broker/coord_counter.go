package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/counter"
	"github.com/qbroker/qbroker/internal/events"
)

// counterServer serves qbroker.v1.Counter (api/coord.proto) with the
// counter recipe. A counter's state is its node alone; the broker keeps,
// per name with calls in progress, one counter.Counter, so that the Adds
// of its clients to one counter are combined into one write (the
// recipe's combine.go) and their version checks start from the state
// last seen here.
type counterServer struct {
	pb.UnimplementedCounterServer
	b *Broker
}

var _ pb.CounterServer = counterServer{}

// counters are the Counters of the names with calls in progress on this
// broker; a name's entry goes with its last call.
type counters struct {
	mu sync.Mutex
	m  map[string]*counterEntry
}

type counterEntry struct {
	c    *counter.Counter
	refs int
}

// counterOf checks a counter's name and returns its Counter for one
// call; release gives it back.
func (s counterServer) counterOf(name string) (c *counter.Counter, release func(), err error) {
	b := s.b
	if err := validName("counter name", name); err != nil {
		return nil, nil, err
	}
	p, err := b.root.Counter(name)
	if err != nil {
		return nil, nil, invalidf("%v", err)
	}
	cs := &b.coord.counters
	cs.mu.Lock()
	defer cs.mu.Unlock()
	e := cs.m[name]
	if e == nil {
		c, err := counter.New(b.conn, p, counter.WithACL(b.acl),
			counter.WithConflictHook(b.metrics.counterConflicts.Inc),
			counter.WithWriteHook(func(w counter.Write) { s.counterWritten(name, w) }))
		if err != nil {
			return nil, nil, err
		}
		if cs.m == nil {
			cs.m = make(map[string]*counterEntry)
		}
		e = &counterEntry{c: c}
		cs.m[name] = e
	}
	e.refs++
	return e.c, func() {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if e.refs--; e.refs == 0 {
			delete(cs.m, name)
		}
	}, nil
}

// counterWritten counts a write of counter name and emits its event: one
// per write, so Adds combined into one write make one event, with the
// value after them all. The event's id names the state the write made
// (value node and version), unique over the counter's life.
func (s counterServer) counterWritten(name string, w counter.Write) {
	b := s.b
	b.metrics.counterWrites.Inc()
	if w.Rollover {
		b.metrics.counterRollovers.Inc()
	}
	if b.ev.sink == nil {
		return
	}
	b.ev.sink.Emit(events.Event{
		ID:      fmt.Sprintf("counter/%s/%s/%s/%d", name, events.CounterChanged, w.Node, w.Version),
		Kind:    events.CounterChanged,
		Counter: name,
		Value:   w.New,
		Broker:  b.cfg.ID,
		Time:    time.Now(),
	})
}

// counterWrite admits a write that may create the counter's nodes.
func (s counterServer) counterWrite() error {
	b := s.b
	return b.zkmem.admitNode(20, "this counter write")
}

// Get implements pb.CounterServer.
func (s counterServer) Get(ctx context.Context, req *pb.CounterGetRequest) (*pb.CounterValue, error) {
	b := s.b
	c, release, err := s.counterOf(req.GetName())
	if err != nil {
		return nil, b.fail(err)
	}
	defer release()
	v, err := c.Get(ctx)
	if err != nil {
		return nil, b.fail(err)
	}
	b.metrics.counterOps.WithLabelValues("get").Inc()
	return &pb.CounterValue{Value: v}, nil
}

// Add implements pb.CounterServer.
func (s counterServer) Add(ctx context.Context, req *pb.CounterAddRequest) (*pb.CounterValue, error) {
	b := s.b
	c, release, err := s.counterOf(req.GetName())
	if err == nil {
		err = s.counterWrite()
	}
	if err != nil {
		return nil, b.fail(err)
	}
	defer release()
	v, err := c.Add(ctx, req.GetDelta())
	if errors.Is(err, counter.ErrOverflow) {
		err = invalidf("delta %d: %v", req.GetDelta(), err)
	}
	if err != nil {
		return nil, b.fail(err)
	}
	b.metrics.counterOps.WithLabelValues("add").Inc()
	return &pb.CounterValue{Value: v}, nil
}

// CompareAndSet implements pb.CounterServer.
func (s counterServer) CompareAndSet(ctx context.Context, req *pb.CounterCompareAndSetRequest) (*pb.CounterCompareAndSetResponse, error) {
	b := s.b
	c, release, err := s.counterOf(req.GetName())
	if err == nil {
		err = s.counterWrite()
	}
	if err != nil {
		return nil, b.fail(err)
	}
	defer release()
	ok, err := c.CompareAndSet(ctx, req.GetOldValue(), req.GetNewValue())
	if err != nil {
		return nil, b.fail(err)
	}
	b.metrics.counterOps.WithLabelValues("compare_and_set").Inc()
	return &pb.CounterCompareAndSetResponse{Swapped: ok}, nil
}

// Set implements pb.CounterServer.
func (s counterServer) Set(ctx context.Context, req *pb.CounterSetRequest) (*pb.CounterValue, error) {
	b := s.b
	c, release, err := s.counterOf(req.GetName())
	if err == nil {
		err = s.counterWrite()
	}
	if err != nil {
		return nil, b.fail(err)
	}
	defer release()
	old, err := c.Set(ctx, req.GetValue())
	if err != nil {
		return nil, b.fail(err)
	}
	b.metrics.counterOps.WithLabelValues("set").Inc()
	return &pb.CounterValue{Value: old}, nil
}
