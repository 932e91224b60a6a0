package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/go-zookeeper/zk"
)

// ErrBadCursor is returned by Browse for an after that is not a message
// id.
var ErrBadCursor = errors.New("zkqueue: malformed browse cursor")

// Browse returns, in delivery order (publish order; priority, then
// publish order, in a priority queue), the ready messages that come after
// the message id after ("" starts at the head): up to limit of them (0: no
// limit), and no more than fit room (the first always does). It claims
// nothing: no lease, no delete, delivery counts unchanged. next is the id
// of the last message returned when more may follow, for the next call's
// after; it is "" once the queue's end was reached. A page is a snapshot
// of each message as read: messages claimed meanwhile are left out, and
// one put back before after (a redelivery) is not seen by the pages after
// it.
//
// It lists the parent once and then only the segments the page reaches,
// from the one holding after, so a page costs the same at any depth.
// Errors: ErrBadCursor, or a ZooKeeper error.
func (q *Queue) Browse(ctx context.Context, after string, limit int, room Room) (ms []Message, next string, err error) {
	var from Name
	if after != "" {
		var ok bool
		if from, ok = ParseName(after); !ok {
			return nil, "", fmt.Errorf("%w: %q", ErrBadCursor, after)
		}
	}
	l, err := q.insp.listNow()
	if err != nil {
		return nil, "", q.wrap("browse", err)
	}
	b := browser{q: q, limit: limit, room: room, after: after != "", from: from}
	for _, sg := range l.segs {
		if after != "" && compareSegments(sg, segment{from.Priority, from.Seg}) < 0 {
			continue // wholly before the cursor: not listed
		}
		if b.full() {
			return b.ms, b.last(), nil
		}
		names, err := q.insp.segmentNames(l, sg)
		if err != nil {
			return b.ms, "", q.wrap("browse", err)
		}
		if after != "" {
			// From the node holding after on: a pack's node sorts at its
			// first message, the rest of it after the cursor (add
			// leaves out what is not).
			node := from
			node.Index = 0
			i, _ := slices.BinarySearchFunc(names, node, Compare)
			names = names[i:]
		}
		done, err := b.add(ctx, names)
		if err != nil {
			return b.ms, "", q.wrap("browse", err)
		}
		if done {
			return b.ms, b.last(), nil
		}
	}
	return b.ms, "", nil
}

// browser collects one Browse page.
type browser struct {
	q     *Queue
	limit int
	room  Room
	used  int
	ms    []Message
	stop  bool // room ran out
	after bool // from is the cursor
	from  Name
}

func (b *browser) full() bool { return b.stop || (b.limit > 0 && len(b.ms) >= b.limit) }

func (b *browser) last() string {
	if len(b.ms) == 0 {
		return ""
	}
	return b.ms[len(b.ms)-1].ID
}

// add reads names in order, in chunks of what the page still has room
// for, and keeps the messages that are still there and fit. It reports
// whether the page is full with names left over.
func (b *browser) add(ctx context.Context, names []Name) (full bool, err error) {
	for len(names) > 0 {
		if b.full() {
			return true, nil
		}
		k := len(names)
		if b.limit > 0 {
			k = min(k, b.limit-len(b.ms))
		}
		read, err := b.q.readAll(ctx, names[:k])
		if err != nil {
			return false, err
		}
		for _, m := range flatten(read) {
			if b.full() {
				return true, nil // the rest of a pack is left for the next page
			}
			if b.after {
				if id, ok := ParseName(m.ID); ok && Compare(id, b.from) <= 0 {
					continue // at or before the cursor
				}
			}
			size := m.wireSize() + b.room.Overhead
			if b.room.Bytes > 0 && len(b.ms) > 0 && b.used+size > b.room.Bytes {
				b.stop = true // message i, at least, is left for the next page
				return true, nil
			}
			b.used += size
			b.ms = append(b.ms, m)
		}
		names = names[k:]
	}
	return false, nil
}

// flatten returns the messages of nodes, in order.
func flatten(nodes [][]Message) []Message {
	var out []Message
	for _, ms := range nodes {
		out = append(out, ms...)
	}
	return out
}

// readAll reads the nodes names in multiRead requests (readPaths): the
// messages of each (a pack's several), none for a node gone or whose data
// does not decode.
func (q *Queue) readAll(ctx context.Context, names []Name) ([][]Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i] = itemPath(q.path, n)
	}
	rs, err := q.reads.readPaths(paths)
	if err != nil {
		return nil, err
	}
	out := make([][]Message, len(names))
	for i, r := range rs {
		switch {
		case errors.Is(r.err, zk.ErrNoNode):
			continue
		case r.err != nil:
			return nil, r.err
		}
		if ms, _, err := decodeNode(names[i], r.data, 0); err == nil {
			out[i] = ms
		}
	}
	return out, nil
}
