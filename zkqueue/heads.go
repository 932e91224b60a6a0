package zkqueue

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Consumers read a queue by its heads: the first segment of each level's
// chain (names.go). The segments themselves are known from a listing of
// the items parent, watched: it changes only when a segment is created or
// removed (a roll, a drained segment, a redelivery re-creating one), or
// when legacy messages are claimed. Only a head is listed, so a listing is
// bounded by the segment size however deep the queue.
//
// A head that is empty and sealed is drained: it is removed (delete fails
// while a redelivery has put a message back, which is then consumed) and
// its successor becomes the head. A head that is empty and unsealed is its
// chain's tail: the level is empty, and the consumer waits on the head's
// watch. A priority queue serves the most urgent levels whose heads hold
// messages (their heads merged into one snapshot, up to mergeNames); it
// watches the empty heads of the more urgent levels, so a message
// published there drops the snapshot.

// chain is what a Queue knows of its segments. Its mutex is held across
// the requests of one listing of the heads, which the dispatcher runs one
// at a time.
type chain struct {
	*core
	bad     *badNodes
	mu      sync.Mutex
	segs    []segment       // sorted, from the last listing of the parent
	legacy  []Name          // legacy messages in that listing, sorted
	foreign []string        // foreign children in that listing
	watch   <-chan zk.Event // children watch of the parent; nil when none
	stale   atomic.Bool     // Rescan asked for a new listing of the parent
	// empty holds the tails found empty, by level, with their armed
	// watches: while such a tail is still its level's head, the level is
	// not listed again until the watch fires, so a priority queue with
	// many levels lists one head per listing, not every more urgent
	// level's.
	empty map[int]emptyTail
}

type emptyTail struct {
	seg   segment
	watch <-chan zk.Event
}

func newChain(c *core, bad *badNodes) *chain {
	return &chain{core: c, bad: bad, empty: map[int]emptyTail{}}
}

// stillEmpty reports whether level's head is a tail found empty whose
// watch has not fired, and returns that watch. A tail found empty that is
// no longer the last segment of its level was sealed since (a roll only
// changes its data, which no children watch sees), so it is listed again:
// sealed and empty, it is removed and its successor becomes the head.
func (c *chain) stillEmpty(level int) (<-chan zk.Event, bool) {
	e, ok := c.empty[level]
	if !ok {
		return nil, false
	}
	if !zkutil.Fired(e.watch) && c.head(level) == e.seg && c.last(level) == e.seg {
		return e.watch, true
	}
	delete(c.empty, level)
	return nil, false
}

// last returns the last listed segment of level; the zero segment when
// there is none.
func (c *chain) last(level int) segment {
	for i := len(c.segs) - 1; i >= 0; i-- {
		if c.segs[i].level == level {
			return c.segs[i]
		}
	}
	return segment{}
}

// head returns the first segment of level, legacy or listed; the zero
// segment when there is none.
func (c *chain) head(level int) segment {
	for _, n := range c.legacy {
		if n.Priority == level {
			return segment{level, 0}
		}
	}
	for _, sg := range c.segs {
		if sg.level == level {
			return sg
		}
	}
	return segment{}
}

// listSegments lists the items parent into c, with a watch unless watch
// is false. c.mu is held.
func (c *chain) listSegments(watch bool) error {
	var children []string
	var w <-chan zk.Event
	var err error
	if watch {
		children, _, w, err = c.zk.ChildrenW(c.path)
	} else {
		children, _, err = c.zk.Children(c.path)
	}
	if err != nil {
		return fmt.Errorf("children %s: %w", c.path, err)
	}
	c.segs, c.legacy, c.foreign = classify(children, c.opt.priorities)
	c.watch = w
	return nil
}

// classify sorts the children of the items parent of a priority queue
// (prio) or a FIFO queue into its segments and legacy messages, both
// sorted, and the rest (foreign).
func classify(children []string, prio bool) (segs []segment, legacy []Name, foreign []string) {
	for _, name := range children {
		if sg, p, ok := parseSegment(name); ok && p == prio {
			segs = append(segs, sg)
		} else if n, ok := ParseName(name); ok && n.Seg == 0 {
			legacy = append(legacy, n)
		} else {
			foreign = append(foreign, name)
		}
	}
	slices.SortFunc(segs, compareSegments)
	slices.SortFunc(legacy, Compare)
	return segs, legacy, foreign
}

// levels returns the levels that have segments or legacy messages, in
// order. c.mu is held.
func (c *chain) levels() []int {
	var ls []int
	add := func(l int) {
		if i, found := slices.BinarySearch(ls, l); !found {
			ls = slices.Insert(ls, i, l)
		}
	}
	for _, sg := range c.segs {
		add(sg.level)
	}
	for _, n := range c.legacy {
		add(n.Priority)
	}
	return ls
}

// head is what a listing of the heads found: the messages of the first
// head holding some, in order, and the watches whose firing makes them
// stale.
type head struct {
	names   []Name
	foreign []string
	watches []<-chan zk.Event
}

// listHeads lists the heads, level by level, until one holds messages
// (a priority queue merges a few, see mergeNames), removing the drained
// ones on the way.
//
// Levels skipped as still empty were judged by their watches before any
// request: a notification on its way then was not seen. ZooKeeper delivers
// a session's notifications before the answer to its later requests, so
// once a head was listed, those watches tell the truth; if one fired (or
// the parent's), the listing is made again, so a more urgent message
// published before it began is not passed over.
func (c *chain) listHeads() (head, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		h, skipped, err := c.listHeadsOnce()
		if err != nil || attempt >= 3 || !anyFired(append(skipped, c.watch)) {
			return h, err
		}
	}
}

func anyFired(ws []<-chan zk.Event) bool {
	for _, w := range ws {
		if w != nil && zkutil.Fired(w) {
			return true
		}
	}
	return false
}

// listHeadsOnce is one pass of listHeads; skipped are the watches of the
// levels it skipped as still empty. c.mu is held.
func (c *chain) listHeadsOnce() (h head, skipped []<-chan zk.Event, err error) {
	if c.stale.Swap(false) || c.watch == nil || zkutil.Fired(c.watch) {
		if err := c.listSegments(true); err != nil {
			return head{}, nil, err
		}
	}
	h = head{foreign: slices.Clone(c.foreign), watches: []<-chan zk.Event{c.watch}}
	levels := 0 // non-empty levels merged
	for _, level := range c.levels() {
		if w, ok := c.stillEmpty(level); ok {
			h.watches = append(h.watches, w)
			skipped = append(skipped, w)
			continue
		}
		names, foreign, w, err := c.levelHead(level)
		if err != nil {
			return head{}, nil, err
		}
		h.foreign = append(h.foreign, foreign...)
		if w != nil {
			h.watches = append(h.watches, w)
		}
		if len(names) > 0 {
			h.names = append(h.names, names...)
			levels++
			if len(h.names) >= mergeNames || levels >= mergeLevels {
				return h, skipped, nil
			}
		}
	}
	return h, skipped, nil
}

// A priority queue's snapshot merges the heads of the most urgent
// non-empty levels until it holds mergeNames messages or mergeLevels
// levels, so that a take of several messages (a Receive, a prefetch) gets
// them across levels, most urgent first, as from one sorted listing; a
// listing then costs at most mergeLevels head listings besides the empty
// levels' (which are listed again only when they change).
const (
	mergeNames  = 1000
	mergeLevels = 8
)

// levelHead returns the messages of level's head, with a watch on it; no
// messages and a watch when the level is empty. Drained heads are removed
// on the way. c.mu is held.
func (c *chain) levelHead(level int) (names []Name, foreign []string, w <-chan zk.Event, err error) {
	var legacy []Name
	for _, n := range c.legacy {
		if n.Priority == level {
			legacy = append(legacy, n)
		}
	}
	if c.bad.n.Load() > 0 {
		legacy = c.bad.without(legacy)
	}
	if len(legacy) > 0 {
		return legacy, nil, nil, nil // the parent's watch covers them
	}
	for i := 0; i < len(c.segs); {
		sg := c.segs[i]
		if sg.level != level {
			i++
			continue
		}
		p := segmentPath(c.path, c.opt.priorities, sg)
		children, stat, w, err := c.zk.ChildrenW(p)
		if errors.Is(err, zk.ErrNoNode) {
			c.drop(i) // drained and removed by another consumer
			continue
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("children %s: %w", p, err)
		}
		names, fgn := SortNames(children)
		foreign = append(foreign, prefixed(sg, c.opt.priorities, fgn)...)
		listed := len(names)
		if c.bad.n.Load() > 0 {
			names = c.bad.without(names)
		}
		if len(children) == 0 && !segmentSealed(stat) {
			c.empty[level] = emptyTail{sg, w}
		}
		if len(names) > 0 || !segmentSealed(stat) {
			return names, foreign, w, nil
		}
		if len(fgn) > 0 || listed > 0 {
			i++ // sealed, holding foreign or bad nodes only: passed over, kept
			continue
		}
		err = c.zk.Delete(p, stat.Version)
		if errors.Is(err, zk.ErrNotEmpty) {
			continue // a message was put back: list it again
		}
		if err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, zk.ErrBadVersion) {
			return nil, nil, nil, fmt.Errorf("delete drained segment %s: %w", p, err)
		}
		c.drop(i)
	}
	return nil, foreign, nil, nil
}

// drop forgets segment i of c.segs, gone.
func (c *chain) drop(i int) {
	c.segs = slices.Delete(c.segs, i, i+1)
}

// prefixed names foreign children of segment sg relative to the parent,
// for the log.
func prefixed(sg segment, prio bool, foreign []string) []string {
	out := make([]string, len(foreign))
	for i, f := range foreign {
		out[i] = segmentName(prio, sg) + "/" + f
	}
	return out
}
