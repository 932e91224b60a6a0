package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// Producers append to the tail segment of a level's chain (node.go).
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

// producer is a Queue's publish side: it encodes messages and appends
// them to the tail segment of their level, rolling full segments. It
// keeps the tails it found; the memory of published messages and the
// publishes under way are shared with the consume side. A grouped
// message's entry is made by the group part (groups.go), asked only for
// a batch that holds one. It is safe for concurrent use.
type producer struct {
	*core
	tails  tails
	recent *recent
	pubs   *publishes
	groups *groups // nil without WithGroups
	packer *packer // nil without WithPacking
	// fresh is told the messages published, for a fair dispatcher
	// (fairness.go); nil without one.
	fresh *fairFresh
}

// publish creates checked drafts, all in one transaction: all or none.
// It returns the messages' ids, in order.
func (p *producer) publish(ctx context.Context, drafts []Draft) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := time.Now()
	r := appendReq{levels: make([]int, len(drafts)), datas: make([][]byte, len(drafts))}
	if p.groups != nil && anyGrouped(drafts) {
		drafts = withGroupTokens(drafts)
		r.attrs = make([]Attributes, len(drafts))
	}
	if p.opt.fairness.Key != "" {
		r.keys = make([]string, len(drafts))
	}
	if p.packer != nil && r.attrs == nil {
		return p.publishPacked(ctx, drafts, now)
	}
	for i, d := range drafts {
		r.levels[i] = d.Priority
		if r.keys != nil {
			r.keys[i] = KeyTag(p.opt.fairness.keyOf(d.Attributes))
		}
		r.datas[i] = EncodeData(Message{Payload: d.Payload, Attributes: d.Attributes, Published: now})
		if r.attrs != nil {
			r.attrs[i] = d.Attributes
		}
	}
	_, paths, err := p.commit(ctx, r)
	if err != nil {
		return nil, err
	}
	return ids(paths), nil
}

// publishPacked publishes plain drafts into packs (pack.go): one
// transaction, gathered with concurrent publishes when all drafts have one
// level. It returns the messages' ids.
func (p *producer) publishPacked(ctx context.Context, drafts []Draft, now time.Time) ([]string, error) {
	datas := make([][]byte, len(drafts))
	level, mixed := drafts[0].Priority, false
	for i, d := range drafts {
		datas[i] = EncodeData(Message{Payload: d.Payload, Attributes: d.Attributes, Published: now})
		mixed = mixed || d.Priority != level
	}
	if !mixed {
		return p.packer.publish(ctx, level, datas)
	}
	// A batch across levels: a pack per level, in one transaction.
	byLevel := map[int][]int{} // the drafts' indexes per level
	for i, d := range drafts {
		byLevel[d.Priority] = append(byLevel[d.Priority], i)
	}
	var r appendReq
	var order []int // the drafts' indexes, in the order of their packs
	for _, l := range slices.Sorted(maps.Keys(byLevel)) {
		entries := make([]packEntry, len(byLevel[l]))
		for j, i := range byLevel[l] {
			entries[j] = packEntry{index: j + 1, data: datas[i]}
		}
		order = append(order, byLevel[l]...)
		r.levels = append(r.levels, l)
		r.datas = append(r.datas, encodePack(entries))
		r.counts = append(r.counts, len(entries))
	}
	_, paths, err := p.appendWith(ctx, r)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(drafts))
	k := 0
	for i, x := range paths {
		n, _ := ParseName(path.Base(x))
		for j := range r.counts[i] {
			ids[order[k]] = memberID(n, j+1)
			k++
		}
	}
	return ids, nil
}

// ids returns the message ids of the nodes created at paths.
func ids(paths []string) []string {
	for i, x := range paths {
		paths[i] = path.Base(x)
	}
	return paths
}

// anyGrouped reports whether a draft has a group.
func anyGrouped(drafts []Draft) bool {
	for _, d := range drafts {
		if d.Group != "" {
			return true
		}
	}
	return false
}

// appendReq is the content of one publish transaction (appendWith): the
// ops pre ahead of the tails' version checks, one message per data
// (levels[i] its level), and the ops extra after the creates. attrs,
// when set, are the messages' attributes, for the entries of grouped
// ones (groups.go). keys, when set, are the messages' key tags
// (fairness.go); without them a queue with fair dispatch reads each key
// from its data.
type appendReq struct {
	pre    []any
	levels []int
	datas  [][]byte
	attrs  []Attributes
	keys   []string
	counts []int // when set, each data is a pack of counts[i] messages (pack.go)
	extra  []any
}

// keyTag returns the key tag of r's message i: none without fair
// dispatch.
func (p *producer) keyTag(r appendReq, i int) string {
	switch {
	case p.opt.fairness.Key == "":
		return ""
	case r.keys != nil:
		return r.keys[i]
	}
	m, err := DecodeData(r.datas[i])
	if err != nil {
		return ""
	}
	return KeyTag(p.opt.fairness.keyOf(m.Attributes))
}

// commit is appendWith, through the group part when r has attributes
// (a grouped message among them).
func (p *producer) commit(ctx context.Context, r appendReq) (res []zk.MultiResponse, paths []string, err error) {
	if r.attrs != nil && p.groups != nil {
		return p.groups.commit(ctx, p, r)
	}
	return p.appendWith(ctx, r)
}

// tails caches the tail segment number of each level.
type tails struct {
	mu sync.Mutex
	k  map[int]int64
}

// maxTailSteps bounds the walk from a sealed segment to the tail before
// the segments are listed again.
const maxTailSteps = 64

// tail returns the tail segment of level, finding it when not cached.
func (p *producer) tail(level int) (int64, error) {
	p.tails.mu.Lock()
	k, ok := p.tails.k[level]
	p.tails.mu.Unlock()
	if ok {
		return k, nil
	}
	k, err := p.findTail(level, 0)
	if err != nil {
		return 0, err
	}
	return p.setTail(level, k), nil
}

// setTail caches k as level's tail unless a later one is cached (a tail
// only moves forward); it returns the tail cached.
func (p *producer) setTail(level int, k int64) int64 {
	p.tails.mu.Lock()
	defer p.tails.mu.Unlock()
	if cur := p.tails.k[level]; cur > k {
		return cur
	}
	p.tails.k[level] = k
	return k
}

// moveOn is called when a publish found segment k of level sealed (or
// removed): it walks to the tail from k's successor.
func (p *producer) moveOn(level int, k int64) error {
	p.tails.mu.Lock()
	cur, ok := p.tails.k[level]
	p.tails.mu.Unlock()
	if ok && cur > k {
		return nil // another caller moved on already
	}
	next, err := p.findTail(level, k+1)
	if err != nil {
		return err
	}
	p.setTail(level, next)
	return nil
}

// findTail returns the tail of level's chain, walking from segment from
// (a successor of a sealed segment, so it was created) or, with from 0,
// from the last segment of a listing of the parent. A level without
// segments gets its first.
func (p *producer) findTail(level int, from int64) (int64, error) {
	k, listed := from, int64(-1) // listed: the last segment of a listing made here
	for steps := 0; ; steps++ {
		if k == 0 || steps == maxTailSteps {
			var err error
			if k, err = p.lastSegment(level); err != nil {
				return 0, err
			}
			listed = k
		}
		if k == 0 {
			k, listed = 1, 1
			_, err := p.zk.Create(segmentPath(p.path, p.opt.priorities, segment{level, 1}), nil, 0, p.opt.acl)
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return 0, fmt.Errorf("create segment: %w", err)
			}
		}
		sp := segmentPath(p.path, p.opt.priorities, segment{level, k})
		ok, stat, err := p.zk.Exists(sp)
		switch {
		case err != nil:
			return 0, fmt.Errorf("exists %s: %w", sp, err)
		case ok && !segmentSealed(stat):
			return k, nil
		case !ok && k == listed, steps > 2*maxTailSteps:
			// The last segment is never removed but with the queue:
			// the queue is being deleted.
			return 0, fmt.Errorf("no tail segment at %s: %w", sp, zk.ErrNoNode)
		}
		// Sealed, or drained and removed: its successor exists or was
		// itself drained.
		k++
	}
}

// lastSegment lists the parent and returns the last segment of level, 0
// when it has none.
func (p *producer) lastSegment(level int) (int64, error) {
	children, _, err := p.zk.Children(p.path)
	if err != nil {
		return 0, fmt.Errorf("children %s: %w", p.path, err)
	}
	var last int64
	for _, c := range children {
		if sg, prio, ok := parseSegment(c); ok && prio == p.opt.priorities && sg.level == level && sg.k > last {
			last = sg.k
		}
	}
	return last, nil
}

// appendWith creates one message per data of r in the tail segment of
// its level, in one transaction with a version check of each tail, after
// the ops r.pre (a delayed message's move, delayed creates: delay.go) and
// before the ops r.extra (a publish's dedup records, group entries); a
// sealed tail sends the whole transaction to the successor. It returns
// the created nodes' paths, in order, and res, pre's responses. A
// failure of one of pre is returned as it is, not retried; a failing
// extra op fails it with an *extraOpError.
func (p *producer) appendWith(ctx context.Context, r appendReq) (res []zk.MultiResponse, paths []string, err error) {
	pre, levels, datas, extra := r.pre, r.levels, r.datas, r.extra
	ticket := p.pubs.begin()
	defer p.pubs.end(ticket)
	for attempt := 0; ; attempt++ {
		segs := map[int]int64{}
		prefixes := map[int]string{} // of each level's new nodes' paths
		tag := p.publisherTag()
		var checks, creates []any
		for i, level := range levels {
			prefix, ok := prefixes[level]
			if !ok {
				k, err := p.tail(level)
				if err != nil {
					return nil, nil, err
				}
				sg := segment{level, k}
				sp := segmentPath(p.path, p.opt.priorities, sg)
				segs[level] = k
				prefix = sp + "/" + messagePrefix(p.opt.priorities, sg, tag, "")
				prefixes[level] = prefix
				checks = append(checks, &zk.CheckVersionRequest{Path: sp, Version: 0})
			}
			if key := p.keyTag(r, i); key != "" {
				prefix += "k" + key + "-"
			}
			if r.counts != nil {
				prefix += "n" + strconv.Itoa(r.counts[i]) + "-"
			}
			creates = append(creates, &zk.CreateRequest{
				Path:  prefix,
				Data:  datas[i],
				Acl:   p.opt.acl,
				Flags: zk.FlagSequence,
			})
		}
		ops := append(append(append(append([]any{}, pre...), checks...), creates...), extra...)
		res, err := p.write(ctx, ops...)
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
			p.remember(paths, datas)
			p.pubs.end(ticket)
			p.rollPast(ctx, paths)
			return res[:len(pre)], paths, nil
		}
		if preFailed(res, len(pre)) || !errors.Is(err, zk.ErrBadVersion) && !errors.Is(err, zk.ErrNoNode) || attempt >= 2*maxTailSteps {
			return res, nil, err
		}
		for level, k := range segs {
			if err := p.moveOn(level, k); err != nil {
				return nil, nil, err
			}
		}
	}
}

// rollPast rolls each segment that the messages just created at paths
// filled: a message whose sequence number reached SegmentSize-1.
func (p *producer) rollPast(ctx context.Context, paths []string) {
	rolled := map[segment]bool{}
	for _, x := range paths {
		n, ok := ParseName(path.Base(x))
		if !ok || int(n.Seq) < p.opt.segmentSize-1 {
			continue
		}
		sg, _ := segmentOf(n)
		if !rolled[sg] {
			rolled[sg] = true
			p.roll(ctx, sg)
		}
	}
}

// roll seals sg and creates its successor in one transaction. A failure is
// not the publisher's: someone else rolled, or the next publish past the
// size rolls.
func (p *producer) roll(ctx context.Context, sg segment) {
	p.tails.mu.Lock()
	cur := p.tails.k[sg.level]
	p.tails.mu.Unlock()
	if cur > sg.k {
		return // rolled from here already
	}
	sp := segmentPath(p.path, p.opt.priorities, sg)
	next := segmentPath(p.path, p.opt.priorities, segment{sg.level, sg.k + 1})
	_, err := p.write(ctx, &zk.SetDataRequest{Path: sp, Data: sealedData, Version: 0}, createSegmentOp(next, p.opt.acl))
	if err == nil || errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNodeExists) {
		p.setTail(sg.level, sg.k+1)
		return
	}
	p.opt.logger.Warn("rolling segment failed", "znode", sp, "err", err)
}

// publisherTag is the tag new messages carry in their names: this
// process's (WithPublisher) while it consumes the queue and so remembers
// what it publishes, else none, and they are shared by sequence number.
func (p *producer) publisherTag() string {
	if p.opt.publisher == "" || !p.recent.consumed() {
		return ""
	}
	return p.opt.publisher
}

// remember notes the messages this process created at paths with datas,
// for read-free claims.
func (p *producer) remember(paths []string, datas [][]byte) {
	for i, x := range paths {
		if n, ok := ParseName(path.Base(x)); ok {
			p.recent.put(n, datas[i])
			if p.fresh != nil && p.recent.consumed() {
				p.fresh.note(n) // for a fair dispatcher's snapshot
			}
		}
	}
}

// Remembering what was published.
//
// A process that publishes to a queue it also consumes remembers the
// data of what it published (recent, below), so claiming those messages
// needs no read.

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
