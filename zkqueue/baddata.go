package zkqueue

import "slices"

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

// markBad notes that candidate n does not decode, and drops the snapshot's
// watches so that the next take lists the heads again without it: a head
// holding nothing else is then passed over instead of waited on.
func (s *Queue) markBad(n Name) {
	s.mu.Lock()
	first := !s.bad[n.Raw] && len(s.bad) < maxBad
	if first {
		s.bad[n.Raw] = true
	}
	s.watches = nil
	s.mu.Unlock()
	if !first {
		return
	}
	znode := itemPath(s.path, n)
	s.opt.logger.Warn("skipping a message node whose data does not decode; Purge deletes it", "znode", znode)
	if s.opt.badDataHook != nil {
		s.opt.badDataHook(znode)
	}
}

// withoutBad returns names without the nodes known bad. A bad node stays
// in its segment until a purge, so it is remembered (up to maxBad) rather
// than forgotten when a listing of another segment does not show it;
// Purge forgets them.
func (s *Queue) withoutBad(names []Name) []Name {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.bad) == 0 {
		return names
	}
	return slices.DeleteFunc(names, func(n Name) bool { return s.bad[n.Raw] })
}
