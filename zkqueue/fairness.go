package zkqueue

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"
)

// Fair dispatch by key. A queue with a Fairness (WithFairness) shares its
// deliveries between the keys of its messages (their group, or one of
// their headers: a tenant) in weighted round robin, so that a key with a
// large backlog does not hold up the others' messages beyond their share.
//
// The dispatcher must know a message's key without reading it, so a
// publish writes a hash of the key into the message's name, after the
// publisher tag: "qn-12-3fa0-k1b2c3d4e-0000000042" (node.go). A message
// without the key (no group, or no such header) carries none and counts
// as a key of its own. A redelivery re-creates the message under its
// name, key included.
//
// Each take of the dispatcher picks, among the candidates of its snapshot
// (the head segment's messages of this process's share, kept up to date
// so that new messages of a quiet key do not wait for the snapshot to be
// used up: see fairRelist), the first message of the key whose turn it
// is: a key keeps its turn for as many messages as its weight, then the
// next key, in the order of their hashes, that has a candidate takes it. The position in that rotation is the
// dispatcher's and survives new snapshots. Processes sharing a queue split
// its messages by sequence number (splitShare), whatever their keys, so
// every process's share holds each backlogged key's messages in
// proportion and every process serves the keys in turn: the queue as a
// whole gives each backlogged key its weighted share of every process's
// deliveries. Nothing is global: two processes may serve the same key at
// once, and a key's share is exact only over many deliveries.
//
// Fairness works within the head segment (up to the segment size of
// messages, node.go): messages in later segments wait behind the head
// as in any queue. Order within a key is not kept (a nacked message comes
// back at its place, not its key's turn) unless the key is the message
// group, whose order groups.go keeps.
//
// A queue without a Fairness writes no key and picks the first candidate,
// as before: the option costs it nothing.

// Fairness is a queue's fair-dispatch configuration (Spec.Fairness).
type Fairness struct {
	// Key names what a message's key is: FairnessGroup (its message
	// group) or FairnessHeader+name (the value of that header). Empty:
	// no fair dispatch.
	Key string
	// Weights gives keys a weight in [1, MaxFairnessWeight]: a key of
	// weight w is served w messages a turn. Keys not listed weigh 1; at
	// most MaxFairnessWeights entries.
	Weights map[string]int
}

// The sources of a message's key, and the bounds of the weights.
const (
	FairnessGroup      = "group"
	FairnessHeader     = "header:"
	MaxFairnessWeight  = 100
	MaxFairnessWeights = 1000
)

// ErrBadFairness is wrapped by Fairness.Validate's errors.
var ErrBadFairness = errors.New("zkqueue: bad fairness")

// Validate checks f: a known key source (a header name of 1 to 128
// printable characters), weights only with a key, at most
// MaxFairnessWeights of them, each in [1, MaxFairnessWeight], for
// non-empty keys. Its errors wrap ErrBadFairness and name the field.
func (f Fairness) Validate() error {
	switch {
	case f.Key == "" && len(f.Weights) > 0:
		return fmt.Errorf("%w: fairness weights without a fairness key", ErrBadFairness)
	case f.Key == "" || f.Key == FairnessGroup:
	case strings.HasPrefix(f.Key, FairnessHeader):
		h := f.Key[len(FairnessHeader):]
		if h == "" || len(h) > 128 || strings.ContainsFunc(h, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return fmt.Errorf("%w: fairness key %q: header name empty, over 128 bytes or not printable", ErrBadFairness, f.Key)
		}
	default:
		return fmt.Errorf("%w: fairness key %q: want %q or %q<header name>", ErrBadFairness, f.Key, FairnessGroup, FairnessHeader)
	}
	if len(f.Weights) > MaxFairnessWeights {
		return fmt.Errorf("%w: %d fairness weights, at most %d", ErrBadFairness, len(f.Weights), MaxFairnessWeights)
	}
	for k, w := range f.Weights {
		switch {
		case k == "" || len(k) > 256:
			return fmt.Errorf("%w: fairness weight for an empty key or one over 256 bytes", ErrBadFairness)
		case w < 1 || w > MaxFairnessWeight:
			return fmt.Errorf("%w: fairness weight %d of key %q out of range [1, %d]", ErrBadFairness, w, k, MaxFairnessWeight)
		}
	}
	return nil
}

// equal reports whether f and o are the same configuration.
func (f Fairness) equal(o Fairness) bool {
	if f.Key != o.Key || len(f.Weights) != len(o.Weights) {
		return false
	}
	for k, w := range f.Weights {
		if ow, ok := o.Weights[k]; !ok || ow != w {
			return false
		}
	}
	return true
}

// keyOf returns the key of a message with attributes a; "" when it has
// none.
func (f Fairness) keyOf(a Attributes) string {
	switch {
	case f.Key == FairnessGroup:
		return a.Group
	case strings.HasPrefix(f.Key, FairnessHeader):
		return a.Headers[f.Key[len(FairnessHeader):]]
	}
	return ""
}

// keyTagLen is the length of a key tag: hex digits.
const keyTagLen = 8

// KeyTag returns the tag a message of key carries in its name: 8 hex
// digits of its FNV-1a hash; "" for the empty key. Two keys may share a
// tag, and then share their turns.
func KeyTag(key string) string {
	if key == "" {
		return ""
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return fmt.Sprintf("%08x", h.Sum32())
}

// WithFairness makes the Queue dispatch fairly by key (see Fairness):
// its publishes write their key's tag into the message names, and its
// takes serve the keys in weighted round robin. Every process of the
// queue should use the same Fairness. New fails, wrapping
// ErrBadFairness, when f does not Validate.
func WithFairness(f Fairness) Option {
	return func(o *options) { o.fairness = f }
}

// fairPicker is a dispatcher's rotation over the keys; the dispatcher's
// lock guards it.
type fairPicker struct {
	weights map[string]int // by key tag
	pos     string         // the tag whose turn it is
	left    int            // messages left in pos's turn
	first   map[string]int // scratch: first index of each tag
	tags    []string       // scratch
	// listed is when the heads were last listed for a change; every is
	// how long after that a change drops the snapshot again (between
	// fairRelist and fairRelistMax, see learned).
	listed time.Time
	every  time.Duration
	// had: the keys with candidates when the snapshot was last dropped
	// for a change, to tell what the listing taught (learned).
	had map[string]bool
}

// A fair dispatcher's snapshot is not walked to its end before the head
// is listed again, as a FIFO one is: a key's new message would wait
// behind another key's whole listed backlog. The messages published
// through this process are merged into the snapshot as their publishes
// return (fairFresh), without a listing; the others (published through
// another process, or put back by one) are learned by listing the head
// again on a change, at most every fairRelist after a listing that found
// a candidate of a key the snapshot had none of, and up to fairRelistMax
// after listings that found none: what they added was of keys already
// waiting their turn, which changes no pick, or nothing at all. So a
// message published elsewhere is seen within fairRelistMax of a change
// (sooner while the listings keep finding such messages), and a process
// whose messages are all its own lists the head about every
// fairRelistMax instead of on every change.
const (
	fairRelist    = 10 * time.Millisecond
	fairRelistMax = 100 * time.Millisecond
)

// relistDue reports whether the snapshot may be dropped for a change.
func (p *fairPicker) relistDue() bool {
	return time.Since(p.listed) >= max(p.every, fairRelist)
}

// dropping notes the keys with candidates in names, a snapshot being
// dropped for a change, for learned.
func (p *fairPicker) dropping(names []Name) {
	if p.had == nil {
		p.had = map[string]bool{}
	}
	clear(p.had)
	for _, n := range names {
		p.had[n.Key] = true
	}
}

// learned sets the relist interval from the snapshot names that
// replaced the one dropped (dropping): back to fairRelist when it holds a
// candidate of a key the dropped one had none of, else twice as long, up
// to fairRelistMax.
func (p *fairPicker) learned(names []Name) {
	for _, n := range names {
		if !p.had[n.Key] {
			p.every = fairRelist
			return
		}
	}
	p.every = min(2*max(p.every, fairRelist), fairRelistMax)
}

// fairFresh holds the names of the messages this process published to a
// fair queue and the dispatcher has not seen yet: the producer notes them
// as its publishes return, the dispatcher merges them into its snapshot
// (mergeFreshLocked in dispatch.go) and drops those its listings show. It
// has its own lock, so a publish does not wait for the dispatcher.
type fairFresh struct {
	mu      sync.Mutex
	entries []freshEntry
	noted   uint64 // names noted so far; an entry's seq is its number
}

type freshEntry struct {
	name Name
	seq  uint64
}

// fairFreshMax bounds the names waiting in a fairFresh; past it new ones
// are left to the next listing.
const fairFreshMax = 4096

// note adds the name of a message just published.
func (f *fairFresh) note(n Name) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noted++
	if len(f.entries) < fairFreshMax {
		f.entries = append(f.entries, freshEntry{n, f.noted})
	}
}

// mark returns the number of names noted so far, for listed.
func (f *fairFresh) mark() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.noted
}

// listed drops the names a listing made its own: those noted by mark,
// taken before it was asked for (the listing has them, or they are gone
// or in a later segment), and those it shows (names, sorted).
func (f *fairFresh) listed(names []Name, mark uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries = slices.DeleteFunc(f.entries, func(e freshEntry) bool {
		return e.seq <= mark || listedHas(names, e.name)
	})
}

// take returns and forgets the names noted and not yet listed, in the
// order noted.
func (f *fairFresh) take() []freshEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.entries) == 0 {
		return nil
	}
	es := f.entries
	f.entries = nil
	return es
}

func newFairPicker(f Fairness) *fairPicker {
	p := &fairPicker{weights: map[string]int{}, first: map[string]int{}}
	for k, w := range f.Weights {
		p.weights[KeyTag(k)] = w
	}
	return p
}

// pick returns the index in names (sorted, non-empty) of the next
// message to hand out: the first of the key whose turn it is.
func (p *fairPicker) pick(names []Name) int {
	clear(p.first)
	for i, n := range names {
		if _, ok := p.first[n.Key]; !ok {
			p.first[n.Key] = i
		}
	}
	if i, ok := p.first[p.pos]; ok && p.left > 0 {
		p.left--
		return i
	}
	p.tags = p.tags[:0]
	for t := range p.first {
		p.tags = append(p.tags, t)
	}
	slices.Sort(p.tags)
	// The next tag after pos in the rotation, wrapping around.
	j, found := slices.BinarySearch(p.tags, p.pos)
	if found {
		j++
	}
	next := p.tags[j%len(p.tags)]
	w := p.weights[next]
	if w < 1 {
		w = 1
	}
	p.pos, p.left = next, w-1
	return p.first[next]
}
