package qcore

import (
	"slices"
	"sync"
)

// DefaultRecentBytes bounds the data a Store remembers of the messages it
// published (see recent).
const DefaultRecentBytes = 4 << 20

// recentOverhead is what one remembered message costs beyond its data and
// name, so that empty payloads are bounded too.
const recentOverhead = 64

// recent remembers the data of the messages this process published and has
// not claimed yet, so that claiming one of them needs no read.
//
// That is exact, not a guess: a message node's data never changes after it
// was created (a requeued message is recreated under a new name), so what
// was written is the data at version 0, and delete(version 0) is the claim
// getData+delete would have made, one round trip shorter.
//
// It is bounded in bytes: when full, a new message is not remembered and
// its claim reads as usual. Messages claimed elsewhere (another broker, a
// purge) are forgotten at the next scan that no longer lists them.
type recent struct {
	mu      sync.Mutex
	max     int // bytes; 0 disables
	bytes   int
	entries map[string]recentEntry
}

type recentEntry struct {
	name Name
	data []byte
}

func newRecent(maxBytes int) *recent {
	return &recent{max: max(maxBytes, 0), entries: map[string]recentEntry{}}
}

func entryCost(n Name, data []byte) int { return len(n.Raw) + len(data) + recentOverhead }

// put remembers the data of the new message n, unless full.
func (r *recent) put(n Name, data []byte) {
	c := entryCost(n, data)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bytes+c > r.max {
		return
	}
	if _, ok := r.entries[n.Raw]; ok {
		return
	}
	r.entries[n.Raw] = recentEntry{name: n, data: data}
	r.bytes += c
}

// take returns and forgets the data of message raw, if remembered.
func (r *recent) take(raw string) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[raw]
	if !ok {
		return nil, false
	}
	delete(r.entries, raw)
	r.bytes -= entryCost(e.name, e.data)
	return e.data, true
}

// prune forgets the messages missing from listed, a sorted listing of the
// children: someone else claimed them. A message created after the
// listing is forgotten too; its claim then reads as usual.
func (r *recent) prune(listed []Name) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for raw, e := range r.entries {
		if !listedHas(listed, e.name) {
			delete(r.entries, raw)
			r.bytes -= entryCost(e.name, e.data)
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

// len returns the number of remembered messages.
func (r *recent) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}
