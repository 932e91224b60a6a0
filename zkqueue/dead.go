package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/go-zookeeper/zk"
)

// Dead letters live in segments too, named as the segments of the items:
// a message of items segment k dies into dead/s<k> (dead/p<prio>-s<k> in a
// priority queue), under its base name:
//
//	<dead>/s0000000000000000007/qn-7-0000000042
//
// So a dead segment holds at most the messages of one items segment, no
// listing of the dead letters grows with their number, and a dead
// letter's id names its node. A dead segment is created by the first
// message that dies into it (requeue's re-creation, as for a redelivery
// into a removed segment) and deleted once redrive empties it.
//
// Dead letters written flat, as children of the dead parent (the layout
// before dead segments), are listed first and redriven as before.

// deadLetterPath is the node of message item as a dead letter.
func deadLetterPath(dead string, item Name) string {
	sg, prio := segmentOf(item)
	return segmentPath(dead, prio, sg) + "/" + item.Base
}

// deadUnit is one listing unit of the dead letters: a dead segment, or
// the flat letters (seg.k == 0, names known).
type deadUnit struct {
	path  string
	seg   segment
	flat  bool
	names []Name
}

// deadUnits lists the dead parent: the flat letters first, then the dead
// segments in queue order.
func (l *Leases) deadUnits() ([]deadUnit, error) {
	children, _, err := l.items.zk.Children(l.dead)
	if err != nil {
		return nil, fmt.Errorf("children %s: %w", l.dead, err)
	}
	names, rest := SortNames(children)
	units := []deadUnit{{path: l.dead, flat: true, names: names}}
	var segs []deadUnit
	for _, c := range rest {
		if sg, _, ok := parseSegment(c); ok {
			segs = append(segs, deadUnit{path: l.dead + "/" + c, seg: sg})
		}
	}
	slices.SortFunc(segs, func(a, b deadUnit) int { return compareSegments(a.seg, b.seg) })
	return append(units, segs...), nil
}

// namesOf returns u's letters in queue order.
func (l *Leases) namesOf(u deadUnit) ([]Name, error) {
	if u.flat {
		return u.names, nil
	}
	children, _, err := l.items.zk.Children(u.path)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil // emptied and deleted since the listing
	}
	if err != nil {
		return nil, fmt.Errorf("children %s: %w", u.path, err)
	}
	names, _ := SortNames(children)
	return names, nil
}

// deadAfter returns the paths and names of up to limit dead letters (0:
// all) that follow after in queue order (after.Raw == "": from the
// oldest). A flat letter named after resumes among the flat ones, which
// all precede the segments; otherwise the walk resumes in after's
// segment, and the segments before it are not listed.
func (l *Leases) deadAfter(ctx context.Context, after Name, limit int) (paths []string, names []Name, err error) {
	units, err := l.deadUnits()
	if err != nil {
		return nil, nil, err
	}
	afterSeg, _ := segmentOf(after)
	inFlat := after.Raw == "" || afterSeg.k == 0 ||
		slices.ContainsFunc(units[0].names, func(n Name) bool { return n.Raw == after.Raw })
	for _, u := range units {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		trim := false
		switch c := compareSegments(u.seg, afterSeg); {
		case u.flat:
			if !inFlat {
				continue
			}
			trim = after.Raw != ""
		case !inFlat && c < 0:
			continue
		case !inFlat && c == 0:
			trim = true
		}
		ns, err := l.namesOf(u)
		if err != nil {
			return nil, nil, err
		}
		if trim {
			i, _ := slices.BinarySearchFunc(ns, after, Compare)
			for i < len(ns) && Compare(ns[i], after) <= 0 {
				i++
			}
			ns = ns[i:]
		}
		for _, n := range ns {
			if limit > 0 && len(names) >= limit {
				return paths, names, nil
			}
			paths, names = append(paths, u.path+"/"+n.Raw), append(names, n)
		}
	}
	return paths, names, nil
}

// deadPathOf finds dead letter id: in its segment, or flat.
func (l *Leases) deadPathOf(n Name) (string, []byte, *zk.Stat, error) {
	p := deadLetterPath(l.dead, n)
	data, stat, err := l.items.zk.Get(p)
	if errors.Is(err, zk.ErrNoNode) && n.Seg != 0 {
		p = l.dead + "/" + n.Base
		data, stat, err = l.items.zk.Get(p)
	}
	return p, data, stat, err
}

// removeEmptyDeadSegments deletes the dead segments of names that are now
// empty; one a message died into meanwhile stays (NotEmpty).
func (l *Leases) removeEmptyDeadSegments(ctx context.Context, names []Name) {
	seen := map[segment]bool{}
	for _, n := range names {
		sg, prio := segmentOf(n)
		if sg.k == 0 || seen[sg] {
			continue
		}
		seen[sg] = true
		p := segmentPath(l.dead, prio, sg)
		if _, err := l.items.write(ctx, &zk.DeleteRequest{Path: p, Version: -1}); err != nil &&
			!errors.Is(err, zk.ErrNotEmpty) && !errors.Is(err, zk.ErrNoNode) {
			l.items.opt.logger.Warn("delete empty dead segment", "znode", p, "err", err)
		}
	}
}
