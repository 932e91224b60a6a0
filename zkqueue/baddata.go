package zkqueue

import "slices"

// A node under a queue's items whose name is a message's but whose data
// does not decode (no header, another format version, garbage: written by
// something other than a Queue, where ACLs let it) is never delivered.
// Its claim fails with ErrBadData before anything is written; the Queue
// then skips the node for as long as it is listed, and reports it once:
// a warning with the node's path and WithBadDataHook. Purge deletes it.

// maxBad bounds the bad nodes a Queue remembers; beyond it, more are
// skipped again at every listing (and reported again).
const maxBad = 10_000

// markBad notes that candidate n does not decode.
func (s *Queue) markBad(n Name) {
	s.mu.Lock()
	first := !s.bad[n.Raw] && len(s.bad) < maxBad
	if first {
		s.bad[n.Raw] = true
	}
	s.mu.Unlock()
	if !first {
		return
	}
	znode := s.path + "/" + n.Raw
	s.opt.logger.Warn("skipping a message node whose data does not decode; Purge deletes it", "znode", znode)
	if s.opt.badDataHook != nil {
		s.opt.badDataHook(znode)
	}
}

// dropBadLocked returns names without the nodes known bad, and forgets
// the bad nodes no longer listed. s.mu is held.
func (s *Queue) dropBadLocked(names []Name) []Name {
	if len(s.bad) == 0 {
		return names
	}
	listed := make(map[string]bool, len(s.bad))
	names = slices.DeleteFunc(names, func(n Name) bool {
		if s.bad[n.Raw] {
			listed[n.Raw] = true
			return true
		}
		return false
	})
	for raw := range s.bad {
		if !listed[raw] {
			delete(s.bad, raw)
		}
	}
	return names
}
