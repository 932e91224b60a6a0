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
// may still hold at-least-once deliveries that it could settle (its leases
// outlive its session, and their ack tokens work on any process). A new
// leader therefore first revokes them all (Revoke): each live lease is
// released at once, whatever its deadline, so that none of them can be
// settled any more; only then does it claim. Together, at no time can two
// consumers settle deliveries of the queue, and the takeover after a
// consumer's death takes its session timeout, not its leases' time.

// activeParent is the election node of a SingleActive queue.
const activeParent = "active"

// Revoke makes every delivery of the queue impossible to settle, so that
// the next single active consumer can start at once: it releases every
// live lease now, whatever its deadline (requeued at its place in the
// queue, or dead-lettered past p.MaxDeliveries; released, when set, is
// told of each). A consumer that still holds a revoked delivery finds its
// Ack, Nack and Extend refused (ErrUnknownLease), as after the deadline.
// Leases settled by a delayed Nack are not deliveries any more and stay
// until their delay.
//
// It lists leases/ again until a listing finds none live, so that a lease
// created meanwhile (a claim under way on a process that just lost its
// turn, which that process gives back unsent) is released too; a lease
// settled meanwhile by its holder (a version conflict) is read again.
// Errors: the context's; ZooKeeper's, wrapped (zk.ErrNoNode when the
// queue was deleted).
func (l *Leases) Revoke(ctx context.Context, p Policy, released func(Message, Outcome)) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		names, _, err := l.items.zk.Children(l.leases)
		if err != nil {
			return fmt.Errorf("zkqueue: revoke: children %s: %w", l.leases, err)
		}
		live, err := l.revokeLive(ctx, names, p, released)
		if err != nil {
			return err
		}
		if live == 0 {
			return nil
		}
	}
}

// revokeLive releases the live (not nacked) leases among names and
// returns how many it found; a release that lost a race with the lease's
// holder counts too, so that the caller looks again.
func (l *Leases) revokeLive(ctx context.Context, names []string, p Policy, released func(Message, Outcome)) (int, error) {
	live := 0
	for _, n := range names {
		lp := l.leases + "/" + n
		data, stat, err := l.items.zk.Get(lp)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("zkqueue: revoke: get %s: %w", lp, err)
		}
		item, ok := ParseLeaseName(n)
		if !ok {
			continue
		}
		if isPackLease(data) {
			// Every message of the pack still leased expires now.
			h := heldLease{token: n, version: stat.Version, item: item, data: data}
			es, _, err := l.packs.tx.sweepPack(ctx, h, farFuture, time.Now(), p)
			switch {
			case errors.Is(err, zk.ErrNoNode):
				continue
			case errors.Is(err, zk.ErrBadVersion):
				live++
				continue
			case err != nil:
				return 0, fmt.Errorf("zkqueue: revoke: %w", err)
			}
			l.packs.remember(n, leaseState{}, false)
			if len(es) > 0 {
				live++
			}
			if released != nil {
				for _, e := range es {
					released(e.Message, e.Outcome)
				}
			}
			continue
		}
		_, itemData, nacked, err := decodeLeaseState(data)
		if err != nil || nacked {
			continue // unreadable leases cannot be settled either
		}
		m, err := decodeMessage(item, itemData, 0)
		if err != nil {
			continue
		}
		live++
		out, err := l.release(ctx, heldLease{token: n, version: stat.Version, item: item, data: itemData, m: m}, p)
		switch {
		case err == nil:
			if released != nil {
				released(m, out)
			}
		case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
			// Settled or extended meanwhile: the next listing tells.
		default:
			return 0, fmt.Errorf("zkqueue: revoke: %w", err)
		}
	}
	return live, nil
}
