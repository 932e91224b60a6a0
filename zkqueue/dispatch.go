package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// The dispatcher is a Queue's head algorithm: one sorted snapshot of the
// head segment's children (the chain, below), shared by all of this process's
// consumers of the queue, who
// take distinct candidates from it (nextCandidate) and report each
// claim's end (claimDone). A FIFO snapshot is walked to its end before the children are
// listed again (new messages sort after it); a priority snapshot is
// dropped whenever the children changed; a fair one is kept up to date
// (fairness.go). Lost races move on to the next
// candidate of the same snapshot.
//
// With several processes consuming a queue, a snapshot is split into
// shares (splitShare): each process takes its own share first, and helps
// with the others' only when its own is used up and theirs are stuck: the
// oldest message of the others' shares has stayed at their head for
// stealGrace. While the others make progress, helping them would only
// race them for the same messages (each lost race a failed transaction).
//
// The dispatcher has its own lock (mu), which also guards the group
// part's view of the snapshot's watches (groups.go). It is safe for
// concurrent use.
type dispatcher struct {
	*core
	chain  *chain
	recent *recent
	pubs   *publishes
	reads  *readGroup
	groups *groups     // nil without WithGroups
	bad    *badNodes   // nodes that do not decode (baddata.go)
	fair   *fairPicker // nil without WithFairness (fairness.go)
	// fresh: this process's publishes not yet listed, merged into the
	// snapshot (fairness.go); nil without WithFairness or with priorities.
	fresh *fairFresh

	mu      sync.Mutex
	pending []Name // sorted candidates of this process's share, not yet handed out
	others  []Name // sorted candidates of other processes' shares
	// othersHead is the oldest candidate of the others' shares the
	// listings found, and othersSince when it was first seen there.
	othersHead  Name
	othersSince time.Time
	// wake, closed at wakeAt, wakes takes waiting to help the others.
	wake    chan zk.Event
	wakeAt  time.Time
	claims  map[string]int    // candidates handed out whose claim is not done
	watches []<-chan zk.Event // armed watches of the snapshot (chain.listHeads); nil when none
	// more: the last listing found messages (a head segment's), so the
	// queue is not empty while the snapshot is used up: the rest are
	// being claimed, and later segments wait behind the head.
	more    bool
	foreign map[string]bool // foreign children already logged
	// scanning is closed when the listing under way ends; nil when none.
	scanning chan struct{}
	// doneWhileScanning: claims finished during the listing under way.
	doneWhileScanning map[string]bool
	// aheadMark is the last candidate of this snapshot offered for reading
	// ahead (queue.go's readGroup); zero after a listing.
	aheadMark Name
	// listedPubs is the publishes begun here before the snapshot's
	// listing was answered (publishes.mark).
	listedPubs uint64
	// listedLast is the last message of the snapshot's listing (zero
	// when it had none), and share and ranks the split it was made with:
	// what merging fresh names needs (mergeFreshLocked).
	listedLast Name
	share      Share
	ranks      map[string]int
}

func newDispatcher(c *core, r *recent, p *publishes, reads *readGroup, g *groups) *dispatcher {
	bad := &badNodes{core: c}
	d := &dispatcher{core: c, chain: newChain(c, bad), bad: bad, recent: r, pubs: p, reads: reads, groups: g,
		foreign: map[string]bool{}, claims: map[string]int{}, doneWhileScanning: map[string]bool{}}
	if c.opt.fairness.Key != "" {
		d.fair = newFairPicker(c.opt.fairness)
		if !c.opt.priorities {
			d.fresh = &fairFresh{}
		}
	}
	return d
}

// popLocked removes and returns the next candidate of names (sorted,
// non-empty): the first, or with fair dispatch the first of the key
// whose turn it is (fairness.go). names stays sorted.
func (d *dispatcher) popLocked(names *[]Name) Name {
	i := 0
	if d.fair != nil {
		i = d.fair.pick(*names)
	}
	n := (*names)[i]
	if i == 0 {
		*names = (*names)[1:]
	} else {
		*names = slices.Delete(*names, i, i+1)
	}
	return n
}

// listingPubs returns the publishes begun before the current snapshot's
// listing came back (publishes.mark): a candidate's, or a later one's,
// which only counts more.
func (d *dispatcher) listingPubs() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.listedPubs
}

// head returns the first candidate of the cached snapshot, the zero Name
// when there is none.
func (d *dispatcher) head() Name {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case len(d.pending) > 0 && (len(d.others) == 0 || Compare(d.pending[0], d.others[0]) < 0):
		return d.pending[0]
	case len(d.others) > 0:
		return d.others[0]
	}
	return Name{}
}

// scan lists the children into a new snapshot. It is called with d.mu
// held and returns with it held, but releases it for the round trip, so
// claims finishing meanwhile (claimDone) and callers served from the snapshot
// are not held up; concurrent callers that need a listing wait for this
// one. It is called once the watch has fired (or was never set), and arms
// a new one with the listing.
func (d *dispatcher) scan() error {
	if d.scanning != nil {
		ch := d.scanning
		d.mu.Unlock()
		<-ch
		d.mu.Lock()
		return nil
	}
	done := make(chan struct{})
	d.scanning = done
	clear(d.doneWhileScanning)
	d.mu.Unlock()

	mark := d.recent.mark()
	var freshMark uint64
	if d.fresh != nil {
		freshMark = d.fresh.mark()
	}
	h, err := d.chain.listHeads()
	// Any message the listing shows was created by then: by a publish
	// begun before the answer came.
	pubMark := d.pubs.mark()
	names, foreign := h.names, h.foreign
	if err == nil {
		d.recent.prune(names, mark)
		if d.fresh != nil {
			d.fresh.listed(names, freshMark)
		}
	}

	d.mu.Lock()
	d.scanning = nil
	close(done)
	if err != nil {
		return err
	}
	d.watches = h.watches
	if d.groups != nil && d.groups.inUse {
		d.watches = d.groups.watchesLocked(h.watches)
		d.groups.skipped = false
	}
	d.more = len(names) > 0 // known bad nodes are left out by levelHead
	for _, f := range foreign {
		if !d.foreign[f] && len(d.foreign) < 1000 {
			d.foreign[f] = true
			d.opt.logger.Warn("skipping foreign node in queue", "znode", d.path+"/"+f)
		}
	}
	// The split counts the messages this process is claiming, as the
	// other processes' listings do, so that all draw the same lines.
	share := d.opt.share
	if share != nil {
		sh := share()
		share = func() Share { return sh }
		if d.fresh != nil {
			d.share, d.ranks = sh, publisherRanks(sh.Publishers, sh.N)
		}
	}
	d.pending, d.others = splitShare(names, share)
	if len(d.claims) > 0 || len(d.doneWhileScanning) > 0 {
		// Candidates being claimed by this process's consumers, or
		// claimed while the listing was under way (it may predate
		// their delete), are not handed out again: that would be a
		// race with ourselves.
		claimed := func(n Name) bool { return d.claims[n.Raw] > 0 || d.doneWhileScanning[n.Raw] }
		d.pending = slices.DeleteFunc(d.pending, claimed)
		d.others = slices.DeleteFunc(d.others, claimed)
	}
	switch {
	case len(d.others) == 0:
		d.othersHead = Name{}
	case d.others[0].Raw != d.othersHead.Raw:
		d.othersHead, d.othersSince = d.others[0], time.Now()
	}
	d.aheadMark, d.listedPubs = Name{}, pubMark
	d.listedLast = Name{}
	if len(names) > 0 {
		d.listedLast = names[len(names)-1]
	}
	if d.fair != nil {
		d.fair.listed = time.Now()
	}
	return nil
}

// mergeFreshLocked adds to the snapshot the messages this process
// published since its listing (fairness.go): those of the listed head
// segment that sort after the listing's last message (a name that sorts
// before it existed when the listing was made, which then showed it or
// found it gone) and are of this process's share. Messages of a later
// segment wait for the head's to be used up, as in any queue; those of
// other shares for the next listing.
func (d *dispatcher) mergeFreshLocked() {
	if d.scanning != nil {
		return // the listing under way replaces the snapshot
	}
	last := d.listedLast
	for _, e := range d.fresh.take() {
		n := e.name
		if last.Raw == "" || n.Priority != last.Priority || n.Seg != last.Seg || Compare(n, last) <= 0 || !d.ownsLocked(n) {
			continue
		}
		insertName(&d.pending, n)
	}
}

// ownsLocked reports whether the split of the snapshot's listing gives
// message n, published here, to this process (splitShare): when its
// publisher tag names this process, or its sequence number does.
func (d *dispatcher) ownsLocked(n Name) bool {
	sh := d.share
	if sh.N <= 1 || sh.Rank < 0 || sh.Rank >= sh.N {
		return true
	}
	if r, ok := d.ranks[n.Tag]; ok && n.Tag != "" {
		return r == sh.Rank
	}
	return int(uint32(n.Seq)%uint32(sh.N)) == sh.Rank
}

// insertName inserts n into sorted names at its place, unless it is
// there already.
func insertName(names *[]Name, n Name) {
	s := *names
	if len(s) == 0 || Compare(s[len(s)-1], n) < 0 {
		*names = append(s, n) // new names sort last
		return
	}
	i, _ := slices.BinarySearchFunc(s, n, Compare)
	for j := i; j < len(s) && Compare(s[j], n) == 0; j++ {
		if s[j].Raw == n.Raw {
			return
		}
	}
	*names = slices.Insert(s, i, n)
}

// markBad notes that candidate n does not decode (baddata.go), and drops
// the snapshot's watches so that the next take lists the heads again
// without it: a head holding nothing else is then passed over instead of
// waited on.
func (d *dispatcher) markBad(n Name) {
	d.bad.mark(n)
	d.mu.Lock()
	d.watches = nil
	d.mu.Unlock()
}

// stealGrace is how long the oldest message of the other processes'
// shares stays at their head before this process helps with them: a
// process whose consumers keep up claims its head well within it.
const stealGrace = 200 * time.Millisecond

// wakeLocked returns a channel closed no later than at, for takes waiting
// to help the others. Waiters share it.
func (d *dispatcher) wakeLocked(at time.Time) <-chan zk.Event {
	if d.wake != nil && !d.wakeAt.After(at) && d.wakeAt.After(time.Now()) {
		return d.wake
	}
	ch := make(chan zk.Event)
	d.wake, d.wakeAt = ch, at
	time.AfterFunc(time.Until(at), func() { close(ch) })
	return ch
}

// watchFiredLocked reports whether one of the armed watches has fired,
// disarming them. Fired watch channels are closed by the client, so every
// waiter holding the same channel still wakes.
func (d *dispatcher) watchFiredLocked() bool {
	if d.watches == nil {
		return true
	}
	for _, w := range d.watches {
		if (w == nil || anyFired(w)) && (d.groups == nil || !d.groups.inUse || d.groups.pollFiredLocked(w)) {
			d.watches = nil
			return true
		}
	}
	return false
}

// nextCandidate hands out the next candidate message name. When there is none it
// returns ok == false and the watches, one of which fires on the next
// change of the heads. Candidates are handed out once per snapshot, so concurrent
// callers in this process never get the same name from one snapshot.
//
// more reports, with ok == false, that the queue is not empty for all
// that: the claims of the snapshot's last candidates are under way, and a
// caller that must not wait for new messages still waits for those.
func (d *dispatcher) nextCandidate() (n Name, ok bool, wait []<-chan zk.Event, more bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for scanned := false; ; scanned = true {
		fired := d.watchFiredLocked()
		if fired && d.opt.priorities && !scanned {
			d.pending, d.others = nil, nil
		}
		if d.fresh != nil {
			d.mergeFreshLocked()
		}
		relisting := false
		if fired && d.fair != nil && !scanned && len(d.pending) > 0 && d.fair.relistDue() {
			// New messages published elsewhere may be of a key
			// waiting for its turn: list them now, not once the
			// snapshot is used up (fairness.go).
			d.fair.dropping(d.pending)
			d.pending, d.others = nil, nil
			relisting = true
		}
		if len(d.pending) == 0 && fired && !scanned {
			// Something changed since the last scan (or there was none).
			if err := d.scan(); err != nil {
				return Name{}, false, nil, false, err
			}
			if relisting {
				d.fair.learned(d.pending)
			}
			continue
		}
		switch {
		case len(d.pending) > 0:
			n = d.popLocked(&d.pending)
		case len(d.others) > 0 && time.Since(d.othersSince) >= stealGrace:
			// Our share is used up, nothing new arrived, and the
			// others' head has not moved: help them, in queue order.
			n = d.popLocked(&d.others)
			if len(d.others) > 0 {
				// Taken by us, not moved by them: still stuck.
				d.othersHead = d.others[0]
			}
		case len(d.others) > 0:
			// The others' shares are moving: wait for a change, or
			// for their head to stay put for stealGrace.
			if d.watches == nil {
				return Name{}, false, []<-chan zk.Event{closedWatch}, true, nil
			}
			wait = append([]<-chan zk.Event{d.wakeLocked(d.othersSince.Add(stealGrace))}, d.watches...)
			return Name{}, false, wait, true, nil
		default:
			if d.watches == nil {
				// The children changed again since the listing just
				// made, or the listing we waited for failed: the
				// caller tries again at once.
				return Name{}, false, []<-chan zk.Event{closedWatch}, true, nil
			}
			// The watches are armed and unfired: the heads are what
			// the last listing saw, all of them handed out.
			// Candidates passed over for their group (groups.go)
			// are not waited for by a take that does not wait.
			return Name{}, false, d.watches, d.more && (d.groups == nil || !d.groups.skipped), nil
		}
		d.claims[n.Raw]++
		return n, true, nil, false, nil
	}
}

// offerAhead offers the candidates next in line, this process's share,
// for reading ahead (queue.go's readGroup): those after the last one offered, so each
// candidate of a snapshot is looked at once, up to maxReadAhead a call.
func (d *dispatcher) offerAhead() {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := 0
	if d.aheadMark.Raw != "" {
		i, _ = slices.BinarySearchFunc(d.pending, d.aheadMark, Compare)
		for i < len(d.pending) && Compare(d.pending[i], d.aheadMark) <= 0 {
			i++
		}
	}
	next := d.pending[i:min(len(d.pending), i+maxReadAhead)]
	if n := d.reads.readAhead(next, d.listedPubs); n > 0 {
		d.aheadMark = next[n-1]
	}
}

// closedWatch is a fired wait: the caller tries again at once.
var closedWatch = func() <-chan zk.Event {
	ch := make(chan zk.Event)
	close(ch)
	return ch
}()

// claimDone reports that the claim of a candidate from nextCandidate has finished, won
// or lost. Until then, rescans leave the candidate out.
func (d *dispatcher) claimDone(n Name) {
	d.mu.Lock()
	if d.claims[n.Raw]--; d.claims[n.Raw] <= 0 {
		delete(d.claims, n.Raw)
	}
	if d.scanning != nil {
		d.doneWhileScanning[n.Raw] = true
	}
	d.mu.Unlock()
}

// giveBack returns a candidate from nextCandidate whose claim was not attempted
// (it did not fit the caller's Room): it is handed out again first. A FIFO
// snapshot would otherwise pass it by until the children change.
func (d *dispatcher) giveBack(n Name) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.claims[n.Raw]--; d.claims[n.Raw] <= 0 {
		delete(d.claims, n.Raw)
	}
	// A listing under way includes it (it was not deleted) and replaces
	// the snapshot anyway.
	i, _ := slices.BinarySearchFunc(d.pending, n, Compare)
	for j := i; j < len(d.pending) && Compare(d.pending[j], n) == 0; j++ {
		if d.pending[j].Raw == n.Raw {
			return
		}
	}
	d.pending = slices.Insert(d.pending, i, n)
}

// splitShare divides a sorted snapshot between the processes consuming the
// queue, each taking its own share first. Every process computes the same
// split from the same snapshot, and shares barely move between snapshots
// (names never change), so processes claim disjoint messages unless one
// steals from another's share after using up its own.
//
// A message belongs to process seq mod n, unless its publisher tag names
// one of the n: then the first ownWindow of that publisher's messages in
// the snapshot are the publisher's, which remembers their data from
// publishing them and claims them without a read. Past the window the
// publisher is not keeping up, and the others help with its backlog, each
// with the messages that are its own by sequence number, but only from
// helpMargin messages further on: their listings and the publisher's are
// taken at different times, and the margin keeps them from claiming what
// the publisher, from a later listing, already counts in its window. The
// rest of the backlog is no one's until the window reaches it (or the
// stuck-share rule hands it out): the publisher takes its messages in
// order, never jumping ahead of its window and back.
func splitShare(names []Name, share func() Share) (mine, others []Name) {
	if share == nil {
		return names, nil
	}
	sh := share()
	rank, n := sh.Rank, sh.N
	if n <= 1 || rank < 0 || rank >= n {
		return names, nil
	}
	publishers := publisherRanks(sh.Publishers, n)
	var seen []int // messages of each publisher so far
	if len(publishers) > 0 {
		seen = make([]int, n)
	}
	mine = make([]Name, 0, len(names)/n+1)
	others = make([]Name, 0, len(names)-len(names)/n)
	for _, nm := range names {
		owner := int(uint32(nm.Seq) % uint32(n))
		if p, ok := publishers[nm.Tag]; ok && nm.Tag != "" {
			k := seen[p]
			seen[p]++
			switch {
			case k < ownWindow:
				owner = p
			case k < ownWindow+helpMargin || owner == p:
				owner = -1
			}
		}
		if owner == rank {
			mine = append(mine, nm)
		} else {
			others = append(others, nm)
		}
	}
	return mine, others
}

// ownWindow bounds the messages a snapshot gives their publisher;
// helpMargin is the gap before the others help with the rest.
const (
	ownWindow  = 4096
	helpMargin = 4096
)

// publisherRanks maps the publisher tags of the n consuming processes to
// their ranks, leaving out tags two of them share; nil when the tags are
// unknown.
func publisherRanks(tags []string, n int) map[string]int {
	if len(tags) != n {
		return nil
	}
	ranks := make(map[string]int, n)
	shared := map[string]bool{}
	for r, t := range tags {
		if _, dup := ranks[t]; dup {
			shared[t] = true
		}
		ranks[t] = r
	}
	for t := range shared {
		delete(ranks, t)
	}
	return ranks
}

// Rescan drops the cached snapshot so the next take lists the children
// again: after an error left the snapshot in doubt, or after a message was
// put back at the head (a release, a redrive), which a FIFO snapshot would
// pass over until used up.
func (q *Queue) Rescan() { q.disp.rescan() }

// rescan drops the snapshot (see Rescan).
func (d *dispatcher) rescan() {
	d.mu.Lock()
	d.pending, d.others = nil, nil
	d.watches = nil
	d.mu.Unlock()
	d.chain.stale.Store(true)
}

// claimFunc claims one candidate. It returns zk.ErrNoNode or
// zk.ErrBadVersion when another consumer won the race.
type claimFunc[T any] func(ctx context.Context, n Name) (T, error)

// fitClaimFunc claims one candidate within a Room: after reading the
// candidate and before writing anything, it asks fit whether the
// message's payload still fits, and if not returns an error wrapping
// ErrNoRoom with the candidate untouched. It calls fit at most once.
// Lost races are as for ClaimFunc.
type fitClaimFunc[T any] func(ctx context.Context, n Name, fit fitFunc) (T, error)

// fitFunc reports whether a message with a payload of the given size fits
// what the caller can still take. A nil fitFunc admits everything.
type fitFunc func(payload int) bool

func (f fitFunc) admits(payload int) bool { return f == nil || f(payload) }

// Room bounds the bytes of the messages one take hands out, for callers
// whose answer has a size limit (a gRPC response). Each message counts
// its payload and attributes plus Overhead. The first message claimed always fits, so a
// message larger than Bytes is still delivered, alone; the zero Room is
// unbounded.
type Room struct {
	Bytes    int
	Overhead int
}

// fitter decides, in queue order, which of one round's candidates fit its
// Room: candidate i's decision waits for candidate i-1's, so the messages
// taken are a prefix of the round's candidates in queue order (less the
// races lost), whatever order their reads finish in. Once one does not
// fit, no later one does.
//
// It is also the round's read barrier: a claim asks once it has read its
// message, and the answer waits until every candidate of the round has
// read (or ended), so the round's writes (deletes, lease moves) reach the
// group commit together and share a few transactions, instead of
// trickling in one by one as the reads return. Measured on a drain of a
// backlog read back from ZooKeeper: see the README's deep-queue figures.
type fitter struct {
	room    Room
	decided []chan struct{} // decided[i] is closed once candidate i is decided
	once    []sync.Once
	read    []sync.Once
	allRead chan struct{} // closed once every candidate has read or ended

	mu     sync.Mutex
	used   int
	taken  int
	full   bool
	unread int // candidates not yet read nor ended
}

// newFitter returns the fitter of n candidates; nil for a single candidate
// of an unbounded Room, which admits everything.
func newFitter(room Room, n int) *fitter {
	if room.Bytes <= 0 && n <= 1 {
		return nil
	}
	f := &fitter{room: room, decided: make([]chan struct{}, n), once: make([]sync.Once, n),
		read: make([]sync.Once, n), allRead: make(chan struct{})}
	for i := range f.decided {
		f.decided[i] = make(chan struct{})
	}
	f.unread = n
	return f
}

// done marks candidate i decided (called after its claim too, for claims
// that ended before asking).
func (f *fitter) done(i int) {
	if f != nil {
		f.hasRead(i)
		f.once[i].Do(func() { close(f.decided[i]) })
	}
}

// hasRead notes that candidate i has read its message (or ended).
func (f *fitter) hasRead(i int) {
	f.read[i].Do(func() {
		f.mu.Lock()
		f.unread--
		last := f.unread == 0
		f.mu.Unlock()
		if last {
			close(f.allRead)
		}
	})
}

func (f *fitter) fit(ctx context.Context, i int) fitFunc {
	if f == nil {
		return nil
	}
	return func(payload int) bool {
		defer f.done(i)
		f.hasRead(i)
		select {
		case <-f.allRead:
		case <-ctx.Done():
			return false
		}
		if f.room.Bytes <= 0 {
			return true
		}
		if i > 0 {
			select {
			case <-f.decided[i-1]:
			case <-ctx.Done():
				return false
			}
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		size := payload + f.room.Overhead
		switch {
		case f.full:
			return false
		case f.taken == 0 || f.used+size <= f.room.Bytes:
			f.used += size
			f.taken++
			return true
		}
		f.full = true
		return false
	}
}

// take walks the candidates, claiming with claim until one succeeds. Lost
// races move on to the next candidate; the snapshot is re-scanned only when
// used up. With block it waits on the children watch for new messages
// until ctx ends; without, it returns ErrEmpty.
func take[T any](ctx context.Context, d *dispatcher, block bool, claim claimFunc[T]) (T, error) {
	var zero T
	vs, err := takeN(ctx, d, 1, block, claim)
	if err != nil {
		return zero, err
	}
	return vs[0], nil
}

// takeN claims up to k messages: it waits (with block) for the first
// candidate, adds the candidates available at once, up to k, and claims
// them concurrently, so their writes share a Multi when the Queue has a
// Committer. Results come in queue order; lost races are skipped (and, if
// all were lost, takeN tries again). It returns ErrEmpty when nothing is
// there and block is false.
func takeN[T any](ctx context.Context, d *dispatcher, k int, block bool, claim claimFunc[T]) ([]T, error) {
	return takeWithin(ctx, d, takeReq{max: k, block: block}, func(ctx context.Context, n Name, _ fitFunc) (T, error) {
		return claim(ctx, n)
	})
}

// takeReq is what a take asks for: up to max messages within room,
// waiting for the first with block.
type takeReq struct {
	max   int
	room  Room
	block bool
	// weigh: a candidate counts the messages its name counts (a pack's),
	// toward max (pack.go).
	weigh bool
	// wake, when set, tells whether the take's buffer holds messages
	// (ending the wait with errBuffered) and else returns a channel
	// closed when it does (packbuf.go).
	wake func() (bool, <-chan zk.Event)
	// picked, when set, is called once the take has its first
	// candidates, before it claims them (Leases.TakeOrdered).
	picked func()
	// full, when set, is set when a candidate did not fit room and was
	// given back to the head of the line.
	full *bool
}

// takeWithin is takeN bounded by room as well as by count: claims stop
// at the first message that would take the total past room.Bytes (the
// first message always fits). A candidate that does not fit is given back
// untouched, at its place in the queue, and is the first one handed out
// next.
func takeWithin[T any](ctx context.Context, d *dispatcher, t takeReq, claim fitClaimFunc[T]) ([]T, error) {
	room := t.room
	d.recent.taking(+1)
	defer d.recent.taking(-1)
	for {
		cands, err := d.candidates(ctx, t)
		if err != nil {
			return nil, err
		}
		if t.picked != nil {
			t.picked()
			t.picked = nil
		}
		vals, errs := claimAll(ctx, d, cands, room, claim)
		var out []T
		var failed error
		for i, err := range errs {
			switch {
			case err == nil:
				out = append(out, vals[i])
			case errors.Is(err, ErrNoRoom):
				if t.full != nil {
					*t.full = true
				}
			case errors.Is(err, errExpired), errors.Is(err, errGroupBusy):
			case errors.Is(err, ErrBadData):
				d.markBad(cands[i])
			case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
				if d.opt.conflictHook != nil {
					d.opt.conflictHook()
				}
			default:
				failed = err
			}
		}
		if failed != nil {
			d.rescan()
			if len(out) == 0 {
				return nil, failed
			}
		}
		if len(out) > 0 {
			return out, nil
		}
		// Every race was lost: take the next candidates.
	}
}

// candidates waits (with t.block, until ctx ends) for the first
// candidate and adds those available at once, up to t.max (messages, with
// t.weigh). Without block it returns ErrEmpty when there is none.
func (d *dispatcher) candidates(ctx context.Context, t takeReq) ([]Name, error) {
	count := func(n Name) int {
		if t.weigh {
			return weight(n)
		}
		return 1
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, ok, wait, more, err := d.nextCandidate()
		if err != nil {
			return nil, err
		}
		if ok {
			cands, total := []Name{n}, count(n)
			for total < t.max {
				n, ok, _, _, err := d.nextCandidate()
				if err != nil || !ok {
					break
				}
				cands = append(cands, n)
				total += count(n)
			}
			d.offerAhead()
			return cands, nil
		}
		if t.wake != nil {
			ready, w := t.wake()
			if ready {
				return nil, errBuffered
			}
			wait = append(append([]<-chan zk.Event{}, wait...), w)
		}
		if !t.block && !more {
			return nil, ErrEmpty
		}
		if err := waitAny(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// waitAny waits until one of watches fires or ctx ends.
func waitAny(ctx context.Context, watches []<-chan zk.Event) error {
	if len(watches) == 1 {
		select {
		case <-watches[0]:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	cases := make([]reflect.SelectCase, 0, len(watches)+1)
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
	for _, w := range watches {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w)})
	}
	if i, _, _ := reflect.Select(cases); i == 0 {
		return ctx.Err()
	}
	return nil
}

// claimAll claims cands concurrently (their writes share a Multi when the
// queue has a Committer), within room, and reports each claim's end to
// the dispatcher: a candidate that did not fit goes back first in line.
//
// A claim, once begun, runs to its answer whatever becomes of ctx:
// abandoning one whose delete is committed would lose the message (its
// outcome is known only from the answer). Claims are bounded by the
// session: a lost connection answers them.
func claimAll[T any](ctx context.Context, d *dispatcher, cands []Name, room Room, claim fitClaimFunc[T]) ([]T, []error) {
	f := newFitter(room, len(cands))
	vals := make([]T, len(cands))
	errs := make([]error, len(cands))
	cctx := context.WithoutCancel(ctx)
	claimOne := func(i int) {
		vals[i], errs[i] = claim(cctx, cands[i], f.fit(cctx, i))
		f.done(i)
		if errors.Is(errs[i], ErrNoRoom) {
			d.giveBack(cands[i])
		} else {
			d.claimDone(cands[i])
		}
	}
	var wg sync.WaitGroup
	if d.reads.aheadDue() {
		// Reads ahead for the next rounds, alongside this one's claims.
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.reads.sendAhead()
		}()
	}
	if len(cands) == 1 {
		claimOne(0)
		wg.Wait()
		return vals, errs
	}
	for i := range cands {
		wg.Add(1)
		go func() {
			defer wg.Done()
			claimOne(i)
		}()
	}
	wg.Wait()
	return vals, errs
}

// Consumers read a queue by its heads: the first segment of each level's
// chain (node.go). The segments themselves are known from a listing of
// the items parent, watched: it changes only when a segment is created or
// removed (a roll, a drained segment, a redelivery re-creating one), or
// when legacy messages are claimed. Only a head is listed, so a listing is
// bounded by the segment size however deep the queue.
//
// A head that is empty and sealed is drained: it is removed (delete fails
// while a redelivery has put a message back, which is then consumed) and
// its successor becomes the head. A head that is empty and unsealed is its
// chain's tail: the level is empty, and the consumer waits on the head's
// watch. A priority queue serves the most urgent levels whose heads hold
// messages (their heads merged into one snapshot, up to mergeNames); it
// watches the empty heads of the more urgent levels, so a message
// published there drops the snapshot.

// chain is what a Queue knows of its segments. Its mutex is held across
// the requests of one listing of the heads, which the dispatcher runs one
// at a time.
type chain struct {
	*core
	bad     *badNodes
	mu      sync.Mutex
	segs    []segment       // sorted, from the last listing of the parent
	legacy  []Name          // legacy messages in that listing, sorted
	foreign []string        // foreign children in that listing
	watch   <-chan zk.Event // children watch of the parent; nil when none
	stale   atomic.Bool     // Rescan asked for a new listing of the parent
	// empty holds the tails found empty, by level, with their armed
	// watches: while such a tail is still its level's head, the level is
	// not listed again until the watch fires, so a priority queue with
	// many levels lists one head per listing, not every more urgent
	// level's.
	empty map[int]emptyTail
}

type emptyTail struct {
	seg   segment
	watch <-chan zk.Event
}

func newChain(c *core, bad *badNodes) *chain {
	return &chain{core: c, bad: bad, empty: map[int]emptyTail{}}
}

// stillEmpty reports whether level's head is a tail found empty whose
// watch has not fired, and returns that watch. A tail found empty that is
// no longer the last segment of its level was sealed since (a roll only
// changes its data, which no children watch sees), so it is listed again:
// sealed and empty, it is removed and its successor becomes the head.
func (c *chain) stillEmpty(level int) (<-chan zk.Event, bool) {
	e, ok := c.empty[level]
	if !ok {
		return nil, false
	}
	if e.watch != nil && !anyFired(e.watch) && c.head(level) == e.seg && c.last(level) == e.seg {
		return e.watch, true
	}
	delete(c.empty, level)
	return nil, false
}

// last returns the last listed segment of level; the zero segment when
// there is none.
func (c *chain) last(level int) segment {
	for i := len(c.segs) - 1; i >= 0; i-- {
		if c.segs[i].level == level {
			return c.segs[i]
		}
	}
	return segment{}
}

// head returns the first segment of level, legacy or listed; the zero
// segment when there is none.
func (c *chain) head(level int) segment {
	for _, n := range c.legacy {
		if n.Priority == level {
			return segment{level, 0}
		}
	}
	for _, sg := range c.segs {
		if sg.level == level {
			return sg
		}
	}
	return segment{}
}

// listSegments lists the items parent into c, with a watch unless watch
// is false. c.mu is held.
func (c *chain) listSegments(watch bool) error {
	var children []string
	var w <-chan zk.Event
	var err error
	if watch {
		children, _, w, err = c.zk.ChildrenW(c.path)
	} else {
		children, _, err = c.zk.Children(c.path)
	}
	if err != nil {
		return fmt.Errorf("children %s: %w", c.path, err)
	}
	c.segs, c.legacy, c.foreign = classify(children, c.opt.priorities)
	c.watch = w
	return nil
}

// classify sorts the children of the items parent of a priority queue
// (prio) or a FIFO queue into its segments and legacy messages, both
// sorted, and the rest (foreign).
func classify(children []string, prio bool) (segs []segment, legacy []Name, foreign []string) {
	for _, name := range children {
		if sg, p, ok := parseSegment(name); ok && p == prio {
			segs = append(segs, sg)
		} else if n, ok := ParseName(name); ok && n.Seg == 0 {
			legacy = append(legacy, n)
		} else {
			foreign = append(foreign, name)
		}
	}
	slices.SortFunc(segs, compareSegments)
	slices.SortFunc(legacy, Compare)
	return segs, legacy, foreign
}

// levels returns the levels that have segments or legacy messages, in
// order. c.mu is held.
func (c *chain) levels() []int {
	var ls []int
	add := func(l int) {
		if i, found := slices.BinarySearch(ls, l); !found {
			ls = slices.Insert(ls, i, l)
		}
	}
	for _, sg := range c.segs {
		add(sg.level)
	}
	for _, n := range c.legacy {
		add(n.Priority)
	}
	return ls
}

// head is what a listing of the heads found: the messages of the first
// head holding some, in order, and the watches whose firing makes them
// stale.
type head struct {
	names   []Name
	foreign []string
	watches []<-chan zk.Event
}

// listHeads lists the heads, level by level, until one holds messages
// (a priority queue merges a few, see mergeNames), removing the drained
// ones on the way.
//
// Levels skipped as still empty were judged by their watches before any
// request: a notification on its way then was not seen. ZooKeeper delivers
// a session's notifications before the answer to its later requests, so
// once a head was listed, those watches tell the truth; if one fired (or
// the parent's), the listing is made again, so a more urgent message
// published before it began is not passed over.
func (c *chain) listHeads() (head, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		h, skipped, err := c.listHeadsOnce()
		if err != nil || attempt >= 3 || !anyFired(append(skipped, c.watch)...) {
			return h, err
		}
	}
}

// anyFired reports whether one of the watches ws has fired; a nil watch
// (none armed) has not. The client sends a watch's one event and closes
// its channel.
func anyFired(ws ...<-chan zk.Event) bool {
	for _, w := range ws {
		select {
		case <-w:
			return true
		default:
		}
	}
	return false
}

// listHeadsOnce is one pass of listHeads; skipped are the watches of the
// levels it skipped as still empty. c.mu is held.
func (c *chain) listHeadsOnce() (h head, skipped []<-chan zk.Event, err error) {
	if c.stale.Swap(false) || c.watch == nil || anyFired(c.watch) {
		if err := c.listSegments(true); err != nil {
			return head{}, nil, err
		}
	}
	h = head{foreign: slices.Clone(c.foreign), watches: []<-chan zk.Event{c.watch}}
	levels := 0 // non-empty levels merged
	for _, level := range c.levels() {
		if w, ok := c.stillEmpty(level); ok {
			h.watches = append(h.watches, w)
			skipped = append(skipped, w)
			continue
		}
		names, foreign, w, err := c.levelHead(level)
		if err != nil {
			return head{}, nil, err
		}
		h.foreign = append(h.foreign, foreign...)
		if w != nil {
			h.watches = append(h.watches, w)
		}
		if len(names) > 0 {
			h.names = append(h.names, names...)
			levels++
			if len(h.names) >= mergeNames || levels >= mergeLevels {
				return h, skipped, nil
			}
		}
	}
	return h, skipped, nil
}

// A priority queue's snapshot merges the heads of the most urgent
// non-empty levels until it holds mergeNames messages or mergeLevels
// levels, so that a take of several messages (a Receive, a prefetch) gets
// them across levels, most urgent first, as from one sorted listing; a
// listing then costs at most mergeLevels head listings besides the empty
// levels' (which are listed again only when they change).
const (
	mergeNames  = 1000
	mergeLevels = 8
)

// levelHead returns the messages of level's head, with a watch on it; no
// messages and a watch when the level is empty. Drained heads are removed
// on the way. c.mu is held.
func (c *chain) levelHead(level int) (names []Name, foreign []string, w <-chan zk.Event, err error) {
	var legacy []Name
	for _, n := range c.legacy {
		if n.Priority == level {
			legacy = append(legacy, n)
		}
	}
	if c.bad.n.Load() > 0 {
		legacy = c.bad.without(legacy)
	}
	if len(legacy) > 0 {
		return legacy, nil, nil, nil // the parent's watch covers them
	}
	for i := 0; i < len(c.segs); {
		sg := c.segs[i]
		if sg.level != level {
			i++
			continue
		}
		p := segmentPath(c.path, c.opt.priorities, sg)
		children, stat, w, err := c.zk.ChildrenW(p)
		if errors.Is(err, zk.ErrNoNode) {
			c.drop(i) // drained and removed by another consumer
			continue
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("children %s: %w", p, err)
		}
		names, fgn := SortNames(children)
		foreign = append(foreign, prefixed(sg, c.opt.priorities, fgn)...)
		listed := len(names)
		if c.bad.n.Load() > 0 {
			names = c.bad.without(names)
		}
		if len(children) == 0 && !segmentSealed(stat) {
			c.empty[level] = emptyTail{sg, w}
		}
		if len(names) > 0 || !segmentSealed(stat) {
			return names, foreign, w, nil
		}
		if len(fgn) > 0 || listed > 0 {
			i++ // sealed, holding foreign or bad nodes only: passed over, kept
			continue
		}
		err = c.zk.Delete(p, stat.Version)
		if errors.Is(err, zk.ErrNotEmpty) {
			continue // a message was put back: list it again
		}
		if err != nil && !errors.Is(err, zk.ErrNoNode) && !errors.Is(err, zk.ErrBadVersion) {
			return nil, nil, nil, fmt.Errorf("delete drained segment %s: %w", p, err)
		}
		c.drop(i)
	}
	return nil, foreign, nil, nil
}

// drop forgets segment i of c.segs, gone.
func (c *chain) drop(i int) {
	c.segs = slices.Delete(c.segs, i, i+1)
}

// prefixed names foreign children of segment sg relative to the parent,
// for the log.
func prefixed(sg segment, prio bool, foreign []string) []string {
	out := make([]string, len(foreign))
	for i, f := range foreign {
		out[i] = segmentName(prio, sg) + "/" + f
	}
	return out
}

// claims is how a claim reads its candidate and decides on it, for both
// kinds of claim: the at-most-once take (take, here) and the lease
// (Leases.claim). It keeps no state of its own: it reads through the
// memory of published messages and the group reads, and asks the
// optional features' gates (TTL, groups) only of a message that uses
// them.
type claims struct {
	*core
	recent *recent
	pubs   *publishes
	reads  *readGroup
	disp   *dispatcher
	groups *groups // nil without WithGroups
	ttl    *expiry // nil without a TTL
}

// take is the at-most-once claim: getData, then delete at the read
// version. Whoever deletes the node owns the message. If the delete's
// outcome is unknown (connection lost), the message is not returned: it
// may be lost, never delivered twice. A message that does not fit the
// caller's room (see fitClaimFunc) is not deleted.
func (c *claims) take(ctx context.Context, n Name, fit fitFunc) (Message, error) {
	p := itemPath(c.path, n)
	data, version, err := c.read(ctx, p, n)
	if err != nil {
		return Message{}, err
	}
	// Undecodable data is never delivered: the claim fails with
	// ErrBadData, and the node stays, skipped, until a purge
	// (baddata.go).
	m, err := decodeMessage(n, data, 1)
	if err != nil {
		return Message{}, err
	}
	if c.ttl != nil && c.ttl.expired(m, time.Now()) {
		return Message{}, c.ttl.expireClaimed(ctx, n, data, version)
	}
	var gops []any
	if m.Group != "" && c.groups != nil {
		entry, err := c.groups.gate(m)
		if err != nil {
			c.unread(n, data, version)
			return Message{}, err
		}
		if entry != "" {
			gops = c.groups.claimOps(m.Group, entry, false)
		}
	}
	if !fit.admits(m.wireSize()) {
		c.unread(n, data, version)
		return Message{}, fmt.Errorf("%s: %w", n.Raw, ErrNoRoom)
	}
	if _, err := c.write(ctx, append([]any{&zk.DeleteRequest{Path: p, Version: version}}, gops...)...); err != nil {
		return Message{}, fmt.Errorf("delete %s: %w", p, err)
	}
	if gops != nil {
		_ = c.zk.Delete(c.groups.groupPath(m.Group), -1) // idle now unless more wait
	}
	return m, nil
}

// takeNode is take for a packed queue (pack.go): it claims node n
// whole, a pack or a message of its own, and returns its messages. A
// plain message node (not a pack) goes through take, which knows the
// features' gates.
func (c *claims) takeNode(ctx context.Context, n Name, fit fitFunc) ([]Message, error) {
	p := itemPath(c.path, n)
	data, version, err := c.read(ctx, p, n)
	if err != nil {
		return nil, err
	}
	if !isPack(data) {
		c.unread(n, data, version)
		m, err := c.take(ctx, n, fit)
		if err != nil {
			return nil, err
		}
		return []Message{m}, nil
	}
	ms, _, err := decodeNode(n, data, 1)
	if err != nil {
		return nil, err
	}
	if !fit.admits(ms[0].wireSize()) {
		c.unread(n, data, version)
		return nil, fmt.Errorf("%s: %w", n.Raw, ErrNoRoom)
	}
	if _, err := c.write(ctx, &zk.DeleteRequest{Path: p, Version: version}); err != nil {
		return nil, fmt.Errorf("delete %s: %w", p, err)
	}
	return ms, nil
}

// takeAll is take without a Room.
func (c *claims) takeAll(ctx context.Context, n Name) (Message, error) {
	return c.take(ctx, n, nil)
}

// read returns the data and version of candidate n at p for its
// claim: remembered when this process published it, else read (group
// read, readGroup). A message with this process's publisher tag may be
// listed before its publish returned here: the claim waits for the
// publishes under way at the listing before it reads (publishes).
func (c *claims) read(ctx context.Context, p string, n Name) (data []byte, version int32, err error) {
	if data, ok := c.recent.take(n.Raw); ok {
		return data, 0, nil
	}
	if ownTag(n, c.opt.publisher) && c.pubs.settle(ctx, c.disp.listingPubs()) {
		if data, ok := c.recent.take(n.Raw); ok {
			return data, 0, nil
		}
	}
	r := c.reads.read(p, n)
	return r.data, r.version, r.err
}

// unread puts back what read took from the memory of published
// messages, for a candidate given back unclaimed. Data at version 0 is
// what the message was created with, whoever read it.
func (c *claims) unread(n Name, data []byte, version int32) {
	if version == 0 {
		c.recent.put(n, data)
	}
}
