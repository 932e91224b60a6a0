package zkqueue

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMemoryBytes is the budget of a Queue that has none given (see
// WithMemory).
const DefaultMemoryBytes = 4 << 20

// recentOverhead is what one remembered message costs beyond its data and
// name, so that empty payloads are bounded too.
const recentOverhead = 64

// recentIdle: a Queue whose consumers have not asked for messages for this
// long stops remembering what it publishes and forgets what it holds.
const recentIdle = 2 * time.Second

// Budget bounds the memory that the Queues sharing it spend remembering the
// messages they published (see WithMemory). It is safe for concurrent
// use.
type Budget struct {
	max  int64
	used atomic.Int64
}

// NewBudget returns a budget of maxBytes; 0 or less remembers nothing.
func NewBudget(maxBytes int) *Budget { return &Budget{max: int64(maxBytes)} }

func (b *Budget) reserve(n int) bool {
	if b.used.Add(int64(n)) > b.max {
		b.used.Add(-int64(n))
		return false
	}
	return true
}

func (b *Budget) release(n int) { b.used.Add(-int64(n)) }

// recent remembers the data of the messages this process published and has
// not claimed yet, so that claiming one of them needs no read.
//
// That is exact, not a guess: a message node's data never changes after it
// was created (a requeued message is recreated under a new name), so what
// was written is the data at version 0, and delete(version 0) is the claim
// getData+delete would have made, one round trip shorter.
//
// It only pays while this process consumes the queue, so it remembers
// only then: a Queue that nobody here consumes from (for recentIdle)
// forgets everything. Messages claimed elsewhere (another broker, a purge)
// are forgotten at the next listing that no longer has them. Memory is
// bounded by a Budget, possibly shared by many Queues; when it is spent,
// new messages are not remembered and their claims read as usual.
type recent struct {
	budget *Budget

	takers   atomic.Int32 // consumers inside a take
	lastTake atomic.Int64 // when one last entered or left a take, Unix ns

	mu      sync.Mutex
	bytes   int // this Queue's share of the budget
	entries map[string]recentEntry
	puts    uint64 // entries put so far; an entry's seq is its put's number
}

type recentEntry struct {
	name Name
	data []byte
	seq  uint64
}

func newRecent(b *Budget) *recent {
	return &recent{budget: b, entries: map[string]recentEntry{}}
}

func entryCost(n Name, data []byte) int { return len(n.Raw) + len(data) + recentOverhead }

// taking brackets a consumer's claims: call it with +1 on the way in and
// -1 on the way out.
func (r *recent) taking(delta int32) {
	r.takers.Add(delta)
	r.lastTake.Store(time.Now().UnixNano())
}

// consumed reports whether consumers of this process asked for messages
// lately.
func (r *recent) consumed() bool {
	return r.takers.Load() > 0 || time.Since(time.Unix(0, r.lastTake.Load())) < recentIdle
}

// put remembers the data of the new message n, if this process consumes
// the queue and the budget allows.
func (r *recent) put(n Name, data []byte) {
	if !r.consumed() {
		r.forget()
		return
	}
	c := entryCost(n, data)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.entries[n.Raw]; ok || !r.budget.reserve(c) {
		return
	}
	r.puts++
	r.entries[n.Raw] = recentEntry{name: n, data: data, seq: r.puts}
	r.bytes += c
}

// mark returns the number of entries put so far, for prune.
func (r *recent) mark() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.puts
}

// has reports whether the data of message raw is remembered.
func (r *recent) has(raw string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.entries[raw]
	return ok
}

// take returns and forgets the data of message raw, if remembered.
func (r *recent) take(raw string) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[raw]
	if !ok {
		return nil, false
	}
	r.dropLocked(raw, e)
	return e.data, true
}

func (r *recent) dropLocked(raw string, e recentEntry) {
	delete(r.entries, raw)
	c := entryCost(e.name, e.data)
	r.bytes -= c
	r.budget.release(c)
}

// forget drops everything remembered.
func (r *recent) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.entries) == 0 {
		return
	}
	r.budget.release(r.bytes)
	r.bytes = 0
	clear(r.entries)
}

// prune forgets the messages missing from listed, a sorted listing of one
// head segment, in that segment or an earlier one of its level: someone
// else claimed them. Only entries put by the time the listing was asked
// for (mark, taken then) count: a publish answered meanwhile may be
// missing from the listing merely because the listing was read first.
func (r *recent) prune(listed []Name, mark uint64) {
	if len(listed) == 0 {
		return
	}
	head := listed[0]
	r.mu.Lock()
	defer r.mu.Unlock()
	for raw, e := range r.entries {
		n := e.name
		if e.seq <= mark && n.Priority == head.Priority && n.Seg <= head.Seg && !listedHas(listed, n) {
			r.dropLocked(raw, e)
		}
	}
}

// listedHas reports whether sorted names holds n itself, not merely another
// incarnation that sorts equal.
func listedHas(names []Name, n Name) bool {
	i, _ := slices.BinarySearchFunc(names, n, Compare)
	for ; i < len(names) && Compare(names[i], n) == 0; i++ {
		if names[i].Raw == n.Raw {
			return true
		}
	}
	return false
}

// publishes tracks this process's publishes of a Queue while they are
// under way. A consumer's listing can show a message before the publish
// that created it has returned here: the children watch fires on one
// session and the create's answer comes on another. The message is then
// not remembered yet, and its claim would read it from ZooKeeper. So a
// claim of a message carrying this process's publisher tag that is not
// remembered first waits for the publishes begun before the listing that
// showed it (settle), at most ownPublishWait, and reads only if the
// message is still unknown: published by an earlier process with the same
// tag, or over the budget.
type publishes struct {
	mu   sync.Mutex
	next uint64              // tickets issued; a publish's ticket is its number
	open map[uint64]struct{} // tickets of the publishes under way
	// ended is closed, and cleared, when a publish ends while someone
	// waits (settle); nil when nobody does.
	ended chan struct{}
}

// ownPublishWait bounds how long a claim waits for this process's
// publishes before it reads the message instead (a variable for tests).
var ownPublishWait = time.Second

// begin notes a publish under way and returns its ticket for end.
func (p *publishes) begin() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open == nil {
		p.open = map[uint64]struct{}{}
	}
	p.next++
	p.open[p.next] = struct{}{}
	return p.next
}

// end notes that the publish of ticket t ended (once its messages are
// remembered). Calling it again does nothing.
func (p *publishes) end(t uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.open[t]; !ok {
		return
	}
	delete(p.open, t)
	if p.ended != nil {
		close(p.ended)
		p.ended = nil
	}
}

// mark returns the tickets issued so far, for openSince.
func (p *publishes) mark() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

// openSince reports whether a publish begun by mark is still under way.
func (p *publishes) openSince(mark uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.openBeforeLocked(mark)
}

// settle waits until the publishes begun by mark (see mark) have ended,
// at most ownPublishWait or until ctx ends. It reports whether any was
// under way.
func (p *publishes) settle(ctx context.Context, mark uint64) bool {
	p.mu.Lock()
	waited := false
	var timeout <-chan time.Time
	for p.openBeforeLocked(mark) {
		if !waited {
			waited = true
			t := time.NewTimer(ownPublishWait)
			defer t.Stop()
			timeout = t.C
		}
		if p.ended == nil {
			p.ended = make(chan struct{})
		}
		ch := p.ended
		p.mu.Unlock()
		select {
		case <-ch:
		case <-timeout:
			return true
		case <-ctx.Done():
			return true
		}
		p.mu.Lock()
	}
	p.mu.Unlock()
	return waited
}

// openBeforeLocked reports whether a publish of ticket mark or earlier is
// under way.
func (p *publishes) openBeforeLocked(mark uint64) bool {
	for t := range p.open {
		if t <= mark {
			return true
		}
	}
	return false
}
