package broker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/zkqueue"
)

// Delayed delivery and message TTL (zkqueue delay.go, ttl.go).
//
// Every broker that has a queue open (a handle: any call on the queue
// opens it, and it stays open while the queue exists) runs the queue's
// jobs (zkqueue.Handles.Run): the mover of due delayed messages and, when
// the queue has a message TTL, the expiry timer of its heads. They stop
// when the handle goes stale (the queue is deleted or its metadata
// changes: the next call opens a new handle, which runs its own) and on
// Shutdown.
//
// A delayed message counts against the queue's quotas from its publish:
// its data is under the queue's node (max_bytes, the data budget), and
// the depth quota counts delayed messages with the ready ones. Its move
// into the queue is therefore not admitted again.

// Delay bounds. The default is SQS's (15 minutes); --max-delay raises it
// up to HardMaxDelay: a delayed message holds ZooKeeper memory until due,
// and a queue's delayed messages are listed whole (zkqueue.
// DefaultMaxDelayed of them at most), so delays are for minutes or hours,
// not for storing messages.
const (
	DefaultMaxDelay = 15 * time.Minute
	HardMaxDelay    = 7 * 24 * time.Hour
)

// schedulers owns the goroutines of the queues' jobs: started while the
// broker runs, all stopped and waited for by stop.
type schedulers struct {
	b *Broker

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// run runs f in a goroutine unless stop was called; f must return once
// the broker's context ends.
func (s *schedulers) run(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

func (s *schedulers) stop() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
}

// startSchedulers runs q's jobs (zkqueue.Handles.Run) until q's handle
// goes stale or the broker shuts down.
func (sc *schedulers) startSchedulers(q *queue) {
	b := sc.b
	log := b.log.With("queue", q.name)
	b.sched.run(func() {
		q.h.Run(b.ctx, func(err error) { log.Warn("queue upkeep", "err", err) })
	})
}

// dueTimes returns each message's due time (zero: at once) from its delay
// or deliver_at, checked against MaxDelay.
func (sc *schedulers) dueTimes(msgs []*pb.OutMessage) ([]time.Time, bool, error) {
	b := sc.b
	now := time.Now()
	due := make([]time.Time, len(msgs))
	any := false
	for i, m := range msgs {
		switch {
		case m.GetDelay() != nil && m.GetDeliverAt() != nil:
			return nil, false, invalidf("message %d: delay and deliver_at are exclusive", i)
		case m.GetDelay() != nil:
			if err := m.GetDelay().CheckValid(); err != nil {
				return nil, false, invalidf("message %d: delay: %v", i, err)
			}
			d := m.GetDelay().AsDuration()
			if d < 0 || d > b.cfg.MaxDelay {
				return nil, false, invalidf("message %d: delay %v out of range [0, %v] (--max-delay)", i, d, b.cfg.MaxDelay)
			}
			if d > 0 {
				due[i] = now.Add(d)
			}
		case m.GetDeliverAt() != nil:
			if err := m.GetDeliverAt().CheckValid(); err != nil {
				return nil, false, invalidf("message %d: deliver_at: %v", i, err)
			}
			at := m.GetDeliverAt().AsTime()
			if at.Sub(now) > b.cfg.MaxDelay {
				return nil, false, invalidf("message %d: deliver_at %s is more than %v ahead (--max-delay)", i, at.Format(time.RFC3339), b.cfg.MaxDelay)
			}
			if at.After(now) {
				due[i] = at
			}
		}
		any = any || !due[i].IsZero()
	}
	return due, any, nil
}

// dueOption names the option that delays m ("" when none).
func dueOption(m *pb.OutMessage) string {
	switch {
	case m.GetDelay() != nil:
		return "delay"
	case m.GetDeliverAt() != nil:
		return "deliver_at"
	}
	return ""
}

// publishDue publishes drafts with their due times (zkqueue.Scheduled).
func (sc *schedulers) publishDue(ctx context.Context, q *queue, drafts []zkqueue.Draft, due []time.Time) ([]string, error) {
	var ids []string
	err := sc.withDelayedParent(ctx, q, func() (err error) {
		ids, err = q.delayed.PublishAll(ctx, drafts, due)
		return err
	})
	return ids, err
}

// withDelayedParent runs publish, a publish through q's delayed parent; a
// queue created before delayed delivery gets its parent first, then
// publish runs again.
func (sc *schedulers) withDelayedParent(ctx context.Context, q *queue, publish func() error) error {
	b := sc.b
	err := publish()
	if errors.Is(err, zk.ErrNoNode) {
		if rerr := b.catalog.Repair(ctx, q.name, "delayed"); rerr != nil {
			return rerr
		}
		err = publish()
	}
	return err
}

// ttlToSpec checks a CreateQueueRequest's message TTL.
func ttlToSpec(d *durationpb.Duration, toDead bool) (time.Duration, error) {
	if d == nil {
		if toDead {
			return 0, invalidf("expire_to_dead_letter needs a message_ttl")
		}
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalidf("message_ttl: %v", err)
	}
	ttl := d.AsDuration()
	switch {
	case ttl == 0 && toDead:
		return 0, invalidf("expire_to_dead_letter needs a message_ttl")
	case ttl != 0 && (ttl < zkqueue.MinMessageTTL || ttl > zkqueue.MaxMessageTTL):
		return 0, invalidf("message_ttl %v not 0 nor in [%v, %v]", ttl, zkqueue.MinMessageTTL, zkqueue.MaxMessageTTL)
	}
	return ttl, nil
}
