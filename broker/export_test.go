package broker

import (
	"context"
	"time"
)

// SetAbandonedAfter sets how long the leader waits before finishing a
// deletion it takes for abandoned; the returned func restores it. Call it
// before starting brokers and restore after they stopped.
func SetAbandonedAfter(d time.Duration) (restore func()) {
	old := abandonedAfter.Swap(int64(d))
	return func() { abandonedAfter.Store(old) }
}

// SetCoordReapInterval sets how often the leader reaps idle locks and
// elections; the returned func restores it. Call it before starting
// brokers and restore after they stopped.
func SetCoordReapInterval(d time.Duration) (restore func()) {
	old := coordReapInterval.Swap(int64(d))
	return func() { coordReapInterval.Store(old) }
}

// RemoveQueueAt runs the second step of a deletion as a deleter that marked
// the queue at version would.
func (b *Broker) RemoveQueueAt(ctx context.Context, name string, version int32) error {
	return b.catalog.FinishDelete(ctx, name, version)
}

// MethodAuth reports how the broker authorizes method: public (no
// credentials), mapped (known; unknown methods are denied) and the actions
// one request msg needs.
func MethodAuth(method string, msg any) (public, mapped bool, actions []string) {
	ma, ok := authFor(method)
	if ma.needs != nil && msg != nil {
		for _, a := range ma.needs(msg) {
			actions = append(actions, a.action)
		}
	}
	return ma.public, ok, actions
}

// QueueHandle returns the handle the broker uses for queue name (loading
// it as a call would), to compare handles across events.
func (b *Broker) QueueHandle(ctx context.Context, name string) (any, error) {
	q, err := b.handles.queue(ctx, name)
	if err != nil {
		return nil, err
	}
	return q.h, nil
}
