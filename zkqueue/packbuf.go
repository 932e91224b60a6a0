package zkqueue

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/go-zookeeper/zk"
)

// The buffer of a packed queue's takes (pack.go). A claim takes a whole
// pack; what the take does not hand out waits here, in queue order, and
// the next take of this process hands it out first, before it claims
// again. A take waiting for messages wakes when a buffer fills, as it does
// on its watches.
//
// The Queue's buffer holds messages claimed at most once: they are out of
// ZooKeeper, so a process that dies with a full buffer loses them (the
// at-most-once loss window is the messages in transit, and these);
// Queue.Flush puts them back. The Leases' buffer holds leases: a process
// that dies leaves them to the sweep, as it does the leases its consumers
// hold; one whose lease has less than half its time left is given back
// (Leases.Unclaim) rather than handed out, and Leases.Flush gives them all
// back.
type packBuf[T any] struct {
	// claiming is held by the one take claiming for the buffer: claims
	// one at a time complete in queue order, so the buffer holds its
	// items in queue order, and a take never hands out a message older
	// than one an earlier take handed out (unless it was put back).
	claiming chan struct{}
	waiting  atomic.Int32 // takes waiting for claiming: the claim takes for them too
	minClaim int          // the least a claim takes (weighed): minClaimAhead, or 0 in a priority queue

	size     func(T) int                // an item's bytes, weighed against a take's room
	giveBack func(context.Context, []T) // puts back the items a take's keep refused; nil when none is

	mu    sync.Mutex
	items []T
	wake  chan zk.Event // closed and replaced when items arrive
}

func newPackBuf[T any](minClaim int, size func(T) int, giveBack func(context.Context, []T)) *packBuf[T] {
	return &packBuf[T]{wake: make(chan zk.Event), claiming: make(chan struct{}, 1), minClaim: minClaim,
		size: size, giveBack: giveBack}
}

// maxClaimAhead bounds the messages one claim takes for the takes
// waiting on it (weighed by the candidates' names).
const maxClaimAhead = 1000

// minClaimAhead is the least a claim takes (weighed likewise): a few packs,
// so takes asking a few messages each do not pay a claim's round trip per
// pack. Not in a priority queue: what a buffer holds goes out before a
// more urgent message published after its claim, so a priority queue's
// claims take what the takes ask (a pack, at least).
const minClaimAhead = 400

// errBuffered ends a take's wait: its buffer has messages.
var errBuffered = errors.New("zkqueue: buffered messages")

// ready reports whether the buffer holds messages, and otherwise returns
// the channel closed when it next does.
func (b *packBuf[T]) ready() (bool, <-chan zk.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.items) > 0, b.wake
}

// push appends items, in queue order after those held.
func (b *packBuf[T]) push(items []T) {
	if len(items) == 0 {
		return
	}
	b.mu.Lock()
	b.items = append(b.items, items...)
	close(b.wake)
	b.wake = make(chan zk.Event)
	b.mu.Unlock()
}

// take removes and returns up to max items from the front within room
// (the first always fits), skipping (and returning as stale) the items
// keep refuses, with every item behind the first refused one: they are
// given back together, so none comes back behind a younger one handed out.
func (b *packBuf[T]) take(max int, room Room, keep func(T) bool) (out, stale []T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.items) > 0 {
		out = make([]T, 0, min(max, len(b.items)))
	}
	used, i := 0, 0
	for ; i < len(b.items) && len(out) < max; i++ {
		it := b.items[i]
		if keep != nil && !keep(it) {
			stale = append(stale, b.items[i:]...)
			b.items = nil
			return out, stale
		}
		s := b.size(it) + room.Overhead
		if room.Bytes > 0 && len(out) > 0 && used+s > room.Bytes {
			break
		}
		used += s
		out = append(out, it)
	}
	b.items = b.items[i:]
	if len(b.items) == 0 {
		b.items = nil
	}
	return out, stale
}

// drain removes and returns every item held.
func (b *packBuf[T]) drain() []T {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.items
	b.items = nil
	return out
}

// takePacked is takeWithin for a packed queue: it hands out the items of
// buf first; else it claims candidates of d (weighed by the messages their
// names count) whole, hands out up to t.max of their items within t.room
// and buffers the rest. Items keep refuses (nil: none) are given back
// with buf.giveBack.
func takePacked[T any](ctx context.Context, d *dispatcher, t takeReq, buf *packBuf[T], claim fitClaimFunc[[]T], keep func(T) bool) ([]T, error) {
	for {
		out, stale := buf.take(t.max, t.room, keep)
		if len(stale) > 0 {
			buf.giveBack(context.WithoutCancel(ctx), stale)
		}
		if len(out) > 0 {
			return out, nil
		}
		_, wake := buf.ready()
		buf.waiting.Add(1)
		select {
		case buf.claiming <- struct{}{}:
		case <-wake:
			buf.waiting.Add(-1)
			continue
		case <-ctx.Done():
			buf.waiting.Add(-1)
			return nil, ctx.Err()
		}
		waiting := int(buf.waiting.Add(-1))
		if ready, _ := buf.ready(); ready {
			<-buf.claiming // filled meanwhile: hand that out first
			continue
		}
		t.wake = buf.ready
		c := t
		c.max = min(t.max*(1+waiting), maxClaimAhead) // what the takes waiting meanwhile ask too
		c.max = max(c.max, t.max, buf.minClaim)
		vals, err := takeWithin(ctx, d, c, claim)
		if err != nil {
			<-buf.claiming
			if errors.Is(err, errBuffered) {
				continue
			}
			return nil, err
		}
		var all []T
		for _, v := range vals {
			all = append(all, v...)
		}
		// The first items go to this take, the rest, younger, wait.
		used, n := 0, 0
		for n < len(all) && n < t.max {
			s := buf.size(all[n]) + t.room.Overhead
			if t.room.Bytes > 0 && n > 0 && used+s > t.room.Bytes {
				break
			}
			used += s
			n++
		}
		buf.push(all[n:])
		<-buf.claiming
		return all[:n], nil
	}
}
