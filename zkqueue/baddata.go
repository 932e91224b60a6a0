package zkqueue

import (
	"slices"
	"sync"
	"sync/atomic"
)

// A node under a queue's items whose name is a message's but whose data
// does not decode (no header, another format version, garbage: written by
// something other than a Queue, where ACLs let it) is never delivered.
// Its claim fails with ErrBadData before anything is written; the Queue
// then skips the node for as long as it is listed, and reports it once:
// a warning with the node's path and WithBadDataHook. Purge deletes it.
// A sealed head segment that holds nothing else is passed over (kept),
// like one holding foreign nodes only, so a bad node never blocks the
// segments behind it.

// maxBad bounds the bad nodes a Queue remembers; beyond it, more are
// skipped again at every listing (and reported again).
const maxBad = 10_000

// badNodes is the set of a Queue's message nodes known not to decode. Its
// count is read without the lock: a listing asks the set only when it is
// not empty, so a queue without bad nodes never calls it. It is safe for
// concurrent use.
type badNodes struct {
	*core
	n   atomic.Int32 // len(set)
	mu  sync.Mutex
	set map[string]bool
}

// mark notes that candidate n does not decode and reports it, the first
// time.
func (b *badNodes) mark(n Name) {
	b.mu.Lock()
	first := !b.set[n.Raw] && len(b.set) < maxBad
	if first {
		if b.set == nil {
			b.set = map[string]bool{}
		}
		b.set[n.Raw] = true
		b.n.Store(int32(len(b.set)))
	}
	b.mu.Unlock()
	if !first {
		return
	}
	znode := itemPath(b.path, n)
	b.opt.logger.Warn("skipping a message node whose data does not decode; Purge deletes it", "znode", znode)
	if b.opt.badDataHook != nil {
		b.opt.badDataHook(znode)
	}
}

// without returns names without the nodes known bad. A bad node stays
// in its segment until a purge, so it is remembered (up to maxBad) rather
// than forgotten when a listing of another segment does not show it;
// Purge forgets them.
func (b *badNodes) without(names []Name) []Name {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.DeleteFunc(names, func(n Name) bool { return b.set[n.Raw] })
}

// forget empties the set (after a purge).
func (b *badNodes) forget() {
	b.mu.Lock()
	clear(b.set)
	b.n.Store(0)
	b.mu.Unlock()
}
