package zkqueue

import (
	"context"

	"github.com/go-zookeeper/zk"
)

// releaser settles leases: back into their segment under the items
// parent under a new incarnation, into the dead letters, or away, by the
// policy. Leases and LeaseSweeper each have one, writing through their
// own transactions (tx).
type releaser struct {
	items, leases, dead string
	groups              string // the queue's WithGroups dir, "" without
	acl                 []zk.ACL
	tx                  txn
}

// txn is how a release writes: a transaction, a check that a node
// exists (requeue's, for a removed segment) and a plain delete.
type txn struct {
	write  writeFunc
	exists func(string) (bool, *zk.Stat, error)
	del    func(string, int32) error
}

// heldLease is a lease read for its release: its node's name (token) and
// version, and its message's name, data and decoded form.
type heldLease struct {
	token   string
	version int32
	item    Name
	data    []byte
	m       Message
}

// release runs the transaction of h's release, conditional on the
// lease's version; one that requeues re-creates the message's segment if
// it was removed (requeue), and one that dead-letters creates the dead
// segment the same way (dead.go). A grouped message's group, settled in
// the same transaction, is dropped when idle once its last entry went.
func (r releaser) release(ctx context.Context, h heldLease, p Policy) (Outcome, error) {
	ops, out := r.ops(h, p)
	var err error
	switch out {
	case Requeued:
		err = requeue(ctx, r.tx, r.items, h.item, ops)
	case DeadLettered:
		err = requeue(ctx, r.tx, r.dead, h.item, ops)
	default:
		_, err = r.tx.write(ctx, ops...)
	}
	if err != nil {
		return 0, err
	}
	if out != Requeued && r.grouped(h.m) {
		dropIdleGroup(r.tx.del, r.groups, h.m)
	}
	return out, nil
}

// ops is the transaction that releases h. A grouped message's group is
// settled in it (groups.go): its ops go before the create, which requeue
// wants last.
func (r releaser) ops(h heldLease, p Policy) ([]any, Outcome) {
	ops := []any{&zk.DeleteRequest{Path: r.leases + "/" + h.token, Version: h.version}}
	out := Requeued
	switch {
	case !tooMany(h.m, p):
	case p.DeadLetter:
		out = DeadLettered
	default:
		out = Dropped
	}
	if r.grouped(h.m) {
		ops = append(ops, groupReleaseOps(r.groups, h.m, out != Requeued)...)
	}
	switch out {
	case Requeued:
		ops = append(ops, requeueOp(r.items, h.item, h.data, r.acl))
	case DeadLettered:
		ops = append(ops, &zk.CreateRequest{Path: deadLetterPath(r.dead, h.item), Data: h.data, Acl: r.acl})
	}
	return ops, out
}

// grouped reports whether m's release settles a group: a grouped
// message of a queue with groups.
func (r releaser) grouped(m Message) bool {
	return r.groups != "" && m.Group != ""
}

// requeueOp creates message item again in its segment under itemsPath,
// under a new incarnation.
func requeueOp(itemsPath string, item Name, data []byte, acl []zk.ACL) *zk.CreateRequest {
	n := item
	n.Raw = newIncarnation(item)
	return &zk.CreateRequest{Path: itemPath(itemsPath, n), Data: data, Acl: acl}
}

// tooMany reports whether m, released, has been delivered as often as p
// allows.
func tooMany(m Message, p Policy) bool {
	return p.MaxDeliveries > 0 && m.Deliveries >= p.MaxDeliveries
}
