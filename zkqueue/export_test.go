package zkqueue

import "github.com/go-zookeeper/zk"

// SetCatalogListedHook sets the function c's deletions run after each
// listing of a node's children, before deleting them (tests stage a
// concurrent writer there); nil removes it.
func SetCatalogListedHook(c *Catalog, f func(p string)) { c.listed = f }

// SetMaxBlockedGroups lowers the bound of q's blocked-group cache (0: the
// default).
func SetMaxBlockedGroups(q *Queue, n int) {
	q.disp.mu.Lock()
	q.groups.maxBlocked = n
	q.disp.mu.Unlock()
}

// SetGroupListedHook sets the function that sees every listing of one of
// q's groups and the watch it armed (nil: listed without a watch).
func SetGroupListedHook(q *Queue, f func(g string, w <-chan zk.Event)) {
	q.disp.mu.Lock()
	q.groups.listed = f
	q.disp.mu.Unlock()
}

// WithoutMultiRead makes q read as it does over a client that has no
// multiRead (the released go-zookeeper): a getData per node. Call it
// before q is used.
func WithoutMultiRead(q *Queue) { q.reads.off.Store(true) }
