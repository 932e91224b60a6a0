package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sync"

	"github.com/go-zookeeper/zk"
)

// Producers append to the tail segment of a level's chain (segments.go).
//
// Each publish transaction carries a version check of its segment at
// version 0, so it commits only while the segment is the tail. A publish
// whose sequence number reaches SegmentSize-1 rolls the chain: one
// transaction seals the segment (setData at version 0) and creates its
// successor, whose name follows from the segment's. Of producers rolling
// at once one transaction commits; the others fail on the version and
// move on, as does every publish that carries the old tail's check.
//
// That keeps FIFO order linearizable across a roll: a publish that
// returned committed before the seal (its check passed), and a publish
// that starts after it commits in the same segment, later in its
// sequence, or in a later segment, never before it.
//
// A segment holds at most SegmentSize messages plus those of the
// transactions that passed their check before the seal committed: the
// transactions in flight when it did, each at most MaxBatchCount
// messages (a group-committed Multi carries several), plus redelivered
// messages put back into it.

// tails caches the tail segment number of each level.
type tails struct {
	mu sync.Mutex
	k  map[int]int64
}

// maxTailSteps bounds the walk from a sealed segment to the tail before
// the segments are listed again.
const maxTailSteps = 64

// tail returns the tail segment of level, finding it when not cached.
func (s *Queue) tail(level int) (int64, error) {
	s.tails.mu.Lock()
	k, ok := s.tails.k[level]
	s.tails.mu.Unlock()
	if ok {
		return k, nil
	}
	k, err := s.findTail(level, 0)
	if err != nil {
		return 0, err
	}
	return s.setTail(level, k), nil
}

// setTail caches k as level's tail unless a later one is cached (a tail
// only moves forward); it returns the tail cached.
func (s *Queue) setTail(level int, k int64) int64 {
	s.tails.mu.Lock()
	defer s.tails.mu.Unlock()
	if cur := s.tails.k[level]; cur > k {
		return cur
	}
	s.tails.k[level] = k
	return k
}

// moveOn is called when a publish found segment k of level sealed (or
// removed): it walks to the tail from k's successor.
func (s *Queue) moveOn(level int, k int64) error {
	s.tails.mu.Lock()
	cur, ok := s.tails.k[level]
	s.tails.mu.Unlock()
	if ok && cur > k {
		return nil // another caller moved on already
	}
	next, err := s.findTail(level, k+1)
	if err != nil {
		return err
	}
	s.setTail(level, next)
	return nil
}

// findTail returns the tail of level's chain, walking from segment from
// (a successor of a sealed segment, so it was created) or, with from 0,
// from the last segment of a listing of the parent. A level without
// segments gets its first.
func (s *Queue) findTail(level int, from int64) (int64, error) {
	k, listed := from, int64(-1) // listed: the last segment of a listing made here
	for steps := 0; ; steps++ {
		if k == 0 || steps == maxTailSteps {
			var err error
			if k, err = s.lastSegment(level); err != nil {
				return 0, err
			}
			listed = k
		}
		if k == 0 {
			k, listed = 1, 1
			_, err := s.zk.Create(segmentPath(s.path, s.opt.priorities, segment{level, 1}), nil, 0, s.opt.acl)
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return 0, fmt.Errorf("create segment: %w", err)
			}
		}
		p := segmentPath(s.path, s.opt.priorities, segment{level, k})
		ok, stat, err := s.zk.Exists(p)
		switch {
		case err != nil:
			return 0, fmt.Errorf("exists %s: %w", p, err)
		case ok && !segmentSealed(stat):
			return k, nil
		case !ok && k == listed, steps > 2*maxTailSteps:
			// The last segment is never removed but with the queue:
			// the queue is being deleted.
			return 0, fmt.Errorf("no tail segment at %s: %w", p, zk.ErrNoNode)
		}
		// Sealed, or drained and removed: its successor exists or was
		// itself drained.
		k++
	}
}

// lastSegment lists the parent and returns the last segment of level, 0
// when it has none.
func (s *Queue) lastSegment(level int) (int64, error) {
	children, _, err := s.zk.Children(s.path)
	if err != nil {
		return 0, fmt.Errorf("children %s: %w", s.path, err)
	}
	var last int64
	for _, c := range children {
		if sg, prio, ok := parseSegment(c); ok && prio == s.opt.priorities && sg.level == level && sg.k > last {
			last = sg.k
		}
	}
	return last, nil
}

// appendMessages creates one message per data in the tail segment of its
// level (levels[i] for datas[i]), in one transaction with a version check
// of each tail and the extra ops (a publish's dedup records); a sealed
// tail sends the whole transaction to the successor. It returns the
// created nodes' paths, in order. A failing extra op fails it with an
// *extraOpError.
func (s *Queue) appendMessages(ctx context.Context, levels []int, datas [][]byte, extra ...any) ([]string, error) {
	_, paths, err := s.appendWith(ctx, nil, levels, datas, extra...)
	return paths, err
}

// appendWith is appendMessages with the ops pre ahead of the checks and
// creates, in the same transaction (a delayed message's move, delayed
// creates: delay.go). A failure of one of pre is returned as it is, not
// retried; res are pre's responses.
func (s *Queue) appendWith(ctx context.Context, pre []any, levels []int, datas [][]byte, extra ...any) (res []zk.MultiResponse, paths []string, err error) {
	ticket := s.pubs.begin()
	defer s.pubs.end(ticket)
	for attempt := 0; ; attempt++ {
		segs := map[int]int64{}
		prefixes := map[int]string{} // of each level's new nodes' paths
		tag := s.publisherTag()
		var checks, creates []any
		for i, level := range levels {
			prefix, ok := prefixes[level]
			if !ok {
				k, err := s.tail(level)
				if err != nil {
					return nil, nil, err
				}
				sg := segment{level, k}
				sp := segmentPath(s.path, s.opt.priorities, sg)
				segs[level] = k
				prefix = sp + "/" + messagePrefix(s.opt.priorities, sg, tag)
				prefixes[level] = prefix
				checks = append(checks, &zk.CheckVersionRequest{Path: sp, Version: 0})
			}
			creates = append(creates, &zk.CreateRequest{
				Path:  prefix,
				Data:  datas[i],
				Acl:   s.opt.acl,
				Flags: zk.FlagSequence,
			})
		}
		ops := append(append(append(append([]any{}, pre...), checks...), creates...), extra...)
		res, err := s.write(ctx, ops...)
		if err != nil && len(extra) > 0 {
			if i, cause := failedIndex(res); i >= len(pre)+len(checks)+len(creates) {
				return nil, nil, &extraOpError{Index: i - len(pre) - len(checks) - len(creates), Err: cause}
			}
		}
		if err == nil {
			paths := make([]string, len(creates))
			for i, r := range res[len(pre)+len(checks) : len(pre)+len(checks)+len(creates)] {
				paths[i] = r.String
			}
			s.remember(paths, datas)
			s.pubs.end(ticket)
			s.rollPast(ctx, paths)
			return res[:len(pre)], paths, nil
		}
		if preFailed(res, len(pre)) || !errors.Is(err, zk.ErrBadVersion) && !errors.Is(err, zk.ErrNoNode) || attempt >= 2*maxTailSteps {
			return res, nil, err
		}
		for level, k := range segs {
			if err := s.moveOn(level, k); err != nil {
				return nil, nil, err
			}
		}
	}
}

// rollPast rolls each segment that the messages just created at paths
// filled: a message whose sequence number reached SegmentSize-1.
func (s *Queue) rollPast(ctx context.Context, paths []string) {
	rolled := map[segment]bool{}
	for _, p := range paths {
		n, ok := ParseName(path.Base(p))
		if !ok || int(n.Seq) < s.opt.segmentSize-1 {
			continue
		}
		sg, _ := segmentOf(n)
		if !rolled[sg] {
			rolled[sg] = true
			s.roll(ctx, sg)
		}
	}
}

// roll seals sg and creates its successor in one transaction. A failure is
// not the publisher's: someone else rolled, or the next publish past the
// size rolls.
func (s *Queue) roll(ctx context.Context, sg segment) {
	s.tails.mu.Lock()
	cur := s.tails.k[sg.level]
	s.tails.mu.Unlock()
	if cur > sg.k {
		return // rolled from here already
	}
	p := segmentPath(s.path, s.opt.priorities, sg)
	next := segmentPath(s.path, s.opt.priorities, segment{sg.level, sg.k + 1})
	_, err := s.write(ctx, &zk.SetDataRequest{Path: p, Data: sealedData, Version: 0}, createSegmentOp(next, s.opt.acl))
	if err == nil || errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNodeExists) {
		s.setTail(sg.level, sg.k+1)
		return
	}
	s.opt.logger.Warn("rolling segment failed", "znode", p, "err", err)
}
