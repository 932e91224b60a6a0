package zkqueue

import (
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
}

type recentEntry struct {
	name Name
	data []byte
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
	r.entries[n.Raw] = recentEntry{name: n, data: data}
	r.bytes += c
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
// else claimed them. A message created after the listing is forgotten too;
// its claim then reads as usual.
func (r *recent) prune(listed []Name) {
	if len(listed) == 0 {
		return
	}
	head := listed[0]
	r.mu.Lock()
	defer r.mu.Unlock()
	for raw, e := range r.entries {
		n := e.name
		if n.Priority == head.Priority && n.Seg <= head.Seg && !listedHas(listed, n) {
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
