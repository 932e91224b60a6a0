package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
)

// Single active consumer.
//
// A queue created with Spec.SingleActive has an active/ parent
// (Handles.Active): the node of a leader election (package election)
// among its consumers. The one that leads receives the queue's messages;
// the others wait, each watching only the candidate ahead of it. A
// candidate is an EPHEMERAL_SEQUENTIAL node of its process's session, so
// a process that dies loses its candidacy when its session expires.
//
// Leading is not enough to start receiving: the consumer that led before
// may still hold at-least-once deliveries that it can settle (its leases
// outlive its session, and their ack tokens work on any process). A new
// leader therefore waits, with WaitUnheld, until no lease of the queue can
// be acked any more; only then does it claim. Together, at no time can
// two consumers ack deliveries of the queue.

// activeParent is the election node of a SingleActive queue.
const activeParent = "active"

// WaitUnheld waits until no delivery of the queue can be settled by the
// consumer that holds it: every lease node is gone (acked, released,
// requeued), settled by a delayed Nack, or past its deadline (Ack and
// Extend refuse it then). It lists leases/ with a watch and reads each
// lease; it then waits for the list to change or for the latest live
// deadline, whichever comes first, and looks again (an Extend moves a
// deadline later: the next look sees it).
//
// A lease found past its deadline is released at once, as the leader's
// sweep would (requeued at its place in the queue, or dead-lettered past
// p.MaxDeliveries; released, when set, is told of each), so that the
// messages the previous consumer held are back in the queue, in order,
// before the next one starts; when that fails (the sweep or another
// process released it first, or ZooKeeper is away) the sweep's release
// stands.
//
// Deadlines are compared with this process's clock, as every Ack compares
// them with its own: the processes' clocks are assumed to agree within a
// lease's send margin. Errors: the context's; ZooKeeper's, wrapped
// (zk.ErrNoNode when the queue was deleted).
func (l *Leases) WaitUnheld(ctx context.Context, p Policy, released func(Message, Outcome)) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		names, _, w, err := l.items.zk.ChildrenW(l.leases)
		if err != nil {
			return fmt.Errorf("zkqueue: wait unheld: children %s: %w", l.leases, err)
		}
		latest, err := l.latestLive(ctx, names, p, released)
		if err != nil {
			return err
		}
		if latest.IsZero() {
			return nil
		}
		t := time.NewTimer(time.Until(latest) + time.Millisecond)
		select {
		case <-w:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// latestLive returns the latest deadline of the live (not nacked, not
// expired) leases among names, zero when there is none, and releases the
// expired ones.
func (l *Leases) latestLive(ctx context.Context, names []string, p Policy, released func(Message, Outcome)) (time.Time, error) {
	var latest time.Time
	now := time.Now()
	for _, n := range names {
		lp := l.leases + "/" + n
		data, stat, err := l.items.zk.Get(lp)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("zkqueue: wait unheld: get %s: %w", lp, err)
		}
		if isPackLease(data) {
			item, ok := ParseLeaseName(n)
			if !ok {
				continue
			}
			es, next, err := sweepPack(ctx, l.packs.tx, n, item, data, stat.Version, now, p)
			if err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, zk.ErrBadVersion) {
				return time.Time{}, fmt.Errorf("zkqueue: wait unheld: %w", err)
			}
			l.packs.remember(n, leaseState{}, false)
			if released != nil {
				for _, e := range es {
					released(e.Message, e.Outcome)
				}
			}
			if next.After(latest) {
				latest = next
			}
			continue
		}
		deadline, itemData, nacked, err := decodeLeaseState(data)
		if err != nil || nacked {
			continue // unreadable leases cannot be acked either
		}
		if deadline.After(now) {
			if deadline.After(latest) {
				latest = deadline
			}
			continue
		}
		item, ok := ParseLeaseName(n)
		if !ok {
			continue
		}
		m, err := decodeMessage(item, itemData, 0)
		if err != nil {
			continue
		}
		out, err := l.release(ctx, heldLease{token: n, version: stat.Version, item: item, data: itemData, m: m}, p)
		if err == nil && released != nil {
			released(m, out)
		}
	}
	return latest, nil
}
