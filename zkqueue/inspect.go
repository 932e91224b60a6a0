package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"sync"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Reading a queue without consuming it: Peek, Len, Purge. None of them
// lists every segment's children on every call: Peek stops at the first
// message, Len lists only the parent and reads the heads' and tails'
// counts (segment counts below).

// inspector is a Queue's part for reading it without consuming: fresh
// listings of the items parent and of segments, and the counts Len
// caches. It is safe for concurrent use.
type inspector struct {
	*core

	// n caches the message counts of sealed segments that are neither a
	// head nor a tail: nobody consumes from or publishes into those, so
	// their counts stand until they become heads (a redelivery re-creates
	// a removed segment, which then is a head).
	mu sync.Mutex
	n  map[segment]int

	// The listing of the parent Len last made, with its watch: listed
	// again only when the segments changed (a roll, a removal).
	listMu  sync.Mutex
	listing listing
	watch   <-chan zk.Event
}

// listCached returns the listing of the parent, listed again only when
// its watch fired.
func (in *inspector) listCached() (listing, error) {
	c := in
	c.listMu.Lock()
	defer c.listMu.Unlock()
	if c.watch != nil && !zkutil.Fired(c.watch) {
		return c.listing, nil
	}
	children, _, w, err := in.zk.ChildrenW(in.path)
	if err != nil {
		return listing{}, fmt.Errorf("children %s: %w", in.path, err)
	}
	c.listing, c.watch = in.parseListing(children), w
	return c.listing, nil
}

// listing is a fresh listing of the items parent: its segments and
// legacy messages, sorted.
type listing struct {
	segs    []segment // including segment{level, 0} for each level with legacy messages
	legacy  []Name
	foreign []string // children that are neither (Purge deletes them)
}

func (in *inspector) listNow() (listing, error) {
	children, _, err := in.zk.Children(in.path)
	if err != nil {
		return listing{}, fmt.Errorf("children %s: %w", in.path, err)
	}
	return in.parseListing(children), nil
}

func (in *inspector) parseListing(children []string) listing {
	var l listing
	l.segs, l.legacy, l.foreign = classify(children, in.opt.priorities)
	for _, n := range l.legacy {
		if sg := (segment{n.Priority, 0}); !slices.Contains(l.segs, sg) {
			l.segs = append(l.segs, sg)
		}
	}
	slices.SortFunc(l.segs, compareSegments)
	return l
}

// names returns the messages of sg, sorted.
func (in *inspector) segmentNames(l listing, sg segment) ([]Name, error) {
	if sg.k == 0 {
		return slices.DeleteFunc(slices.Clone(l.legacy), func(n Name) bool { return n.Priority != sg.level }), nil
	}
	p := segmentPath(in.path, in.opt.priorities, sg)
	children, _, err := in.zk.Children(p)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("children %s: %w", p, err)
	}
	names, _ := SortNames(children)
	return names, nil
}

// Peek returns the head message without claiming it, or ErrEmpty. It always
// reads fresh listings: of the parent, then of the segments in order up to
// the first that holds a message.
func (q *Queue) Peek(ctx context.Context) (Message, error) {
	l, err := q.insp.listNow()
	if err != nil {
		return Message{}, err
	}
	for _, sg := range l.segs {
		names, err := q.insp.segmentNames(l, sg)
		if err != nil {
			return Message{}, err
		}
		for _, n := range names {
			if err := ctx.Err(); err != nil {
				return Message{}, err
			}
			p := itemPath(q.path, n)
			data, _, err := q.zk.Get(p)
			if errors.Is(err, zk.ErrNoNode) {
				continue
			}
			if err != nil {
				return Message{}, fmt.Errorf("get %s: %w", p, err)
			}
			ms, _, err := decodeNode(n, data, 0)
			if errors.Is(err, ErrBadData) {
				continue // never delivered: the next is the head
			}
			if err != nil {
				return Message{}, err
			}
			return ms[0], nil
		}
	}
	return Message{}, ErrEmpty
}

// Len returns the number of messages: the legacy ones in a listing of the
// parent, plus each segment's from its Stat (NumChildren), cached for the
// sealed segments between a level's head and tail. The listing is watched
// and made again only when the segments changed, so a FIFO queue costs
// one or two Stats per call. Foreign children of segments, if any, are
// counted too.
func (q *Queue) Len(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	l, err := q.insp.listCached()
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	total := len(l.legacy)
	seen := make(map[segment]bool, len(l.segs))
	for i, sg := range l.segs {
		if sg.k == 0 {
			continue
		}
		seen[sg] = true
		inner := i > 0 && l.segs[i-1].level == sg.level && i+1 < len(l.segs) && l.segs[i+1].level == sg.level
		n, err := q.insp.segmentLen(sg, inner)
		if err != nil {
			return 0, err
		}
		total += n
	}
	q.insp.mu.Lock()
	deleteUnseen(q.insp.n, seen)
	q.insp.mu.Unlock()
	return total, nil
}

// segmentLen returns the message count of sg, cached when inner (neither
// head nor tail) and sealed.
func (in *inspector) segmentLen(sg segment, inner bool) (int, error) {
	in.mu.Lock()
	n, ok := in.n[sg]
	in.mu.Unlock()
	if ok && inner {
		return n, nil
	}
	p := segmentPath(in.path, in.opt.priorities, sg)
	found, stat, err := in.zk.Exists(p)
	if err != nil {
		return 0, fmt.Errorf("exists %s: %w", p, err)
	}
	if !found {
		return 0, nil
	}
	count := int(stat.NumChildren)
	if in.opt.packing != nil && count > 0 {
		// A pack's name counts its messages: the segment is listed.
		children, _, err := in.zk.Children(p)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return 0, fmt.Errorf("children %s: %w", p, err)
		}
		count = 0
		for _, c := range children {
			n, ok := ParseName(c)
			if !ok {
				count++ // foreign, counted as above
				continue
			}
			count += weight(n)
		}
	}
	if inner && segmentSealed(stat) {
		in.mu.Lock()
		in.n[sg] = count
		in.mu.Unlock()
	}
	return count, nil
}

func deleteUnseen(m map[segment]int, seen map[segment]bool) {
	for sg := range m {
		if !seen[sg] {
			delete(m, sg)
		}
	}
}

// Purge deletes every message present when it starts and returns how many
// it deleted, segment by segment, and removes the sealed segments it
// emptied (conditionally, as consumers do: one that got a message back
// stays), so no count cached by Len outlives them. The nodes that are not
// messages (foreign names, data that does not decode), never delivered,
// are deleted and counted too. Messages claimed concurrently are not
// counted.
func (q *Queue) Purge(ctx context.Context) (int, error) {
	l, err := q.insp.listNow()
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, sg := range l.segs {
		raw, err := q.insp.segmentChildren(l, sg)
		if err != nil {
			return deleted, err
		}
		if q.groups != nil {
			var n int
			raw, n, err = q.groups.purge(ctx, raw)
			deleted += n
			if err != nil {
				return deleted, err
			}
		}
		n, err := zkutil.DeleteNodes(ctx, q.conn, raw)
		deleted += q.purgedMessages(raw, n)
		if err != nil {
			return deleted, err
		}
		if sg.k > 0 {
			q.insp.removeIfDrained(sg)
		}
	}
	raw := make([]string, len(l.foreign))
	for i, f := range l.foreign {
		raw[i] = q.path + "/" + f
	}
	n, err := zkutil.DeleteNodes(ctx, q.conn, raw)
	q.disp.bad.forget()
	return deleted + n, err
}

// purgedMessages is the number of messages Purge deleted with n of the
// nodes at paths: n, or in a packed queue the messages the packs' names
// count when all went (else n: each node held one at least).
func (q *Queue) purgedMessages(paths []string, n int) int {
	if q.opt.packing == nil || n != len(paths) {
		return n
	}
	total := 0
	for _, p := range paths {
		if name, ok := ParseName(path.Base(p)); ok {
			total += weight(name)
		} else {
			total++
		}
	}
	return total
}

// segmentChildren returns the paths of every child of sg: its messages and
// whatever else is there (sg.k 0: the legacy messages of its level).
func (in *inspector) segmentChildren(l listing, sg segment) ([]string, error) {
	if sg.k == 0 {
		var raw []string
		for _, n := range l.legacy {
			if n.Priority == sg.level {
				raw = append(raw, in.path+"/"+n.Raw)
			}
		}
		return raw, nil
	}
	p := segmentPath(in.path, in.opt.priorities, sg)
	children, _, err := in.zk.Children(p)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("children %s: %w", p, err)
	}
	raw := make([]string, len(children))
	for i, c := range children {
		raw[i] = p + "/" + c
	}
	return raw, nil
}

// removeIfDrained deletes segment sg if it is sealed and empty. Failures
// leave it to the consumers.
func (in *inspector) removeIfDrained(sg segment) {
	p := segmentPath(in.path, in.opt.priorities, sg)
	ok, stat, err := in.zk.Exists(p)
	if err == nil && ok && segmentSealed(stat) && stat.NumChildren == 0 {
		_ = in.zk.Delete(p, stat.Version)
	}
}
