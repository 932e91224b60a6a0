package zkqueue

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
)

// Leases of packs (pack.go). An at-least-once claim of a pack moves it
// whole into a lease in one transaction: delete the pack; create
// <leases>/<pack name>~<nonce>.msgs holding its messages (written once,
// never changed); create the lease <leases>/<pack name>~<nonce> and write
// it (the write's Stat gives the fencing token, as for a lone message).
// The lease holds each unsettled message's index and deadline, a few bytes
// each; message i's token is "<lease name>@i".
//
// Settling a message rewrites the lease without it (setData at the
// version read), or deletes the lease and its messages with its last one;
// a nack, a release or an expiry puts the messages back in the same
// transaction, as one node at their place (the lone message's own name,
// or a pack of the part: putBackName), a delayed nack moves the message
// into a lease of its own (the lone message's lease, as Leases.Nack makes),
// and a dead letter is stored under the message's id. The settlements of
// one lease that arrive while a write of it is under way are applied
// together by the next write (the rounds below): one small setData settles
// all of them, and each is answered once it committed. Extend moves one
// message's deadline. A write that fails on the version (another process
// settled some of the lease meanwhile) reads the lease again and applies
// the round again: a settlement is never applied twice, nor over one that
// committed elsewhere.
//
// The lease data:
//
//	0xCB 'L' 3 | uvarint count | count x (uvarint index | varint deadline (Unix ns))
var packLeaseMagic = [3]byte{0xCB, 'L', 3}

// MemberSep separates a pack lease's name from a message's index in a
// token.
const MemberSep = "@"

// packMsgsSuffix names the node holding a pack lease's messages.
const packMsgsSuffix = ".msgs"

// leaseEntry is one unsettled message of a pack lease.
type leaseEntry struct {
	index    int
	deadline time.Time
}

func encodePackLease(entries []leaseEntry) []byte {
	b := make([]byte, 0, 3+binary.MaxVarintLen32+len(entries)*(binary.MaxVarintLen32+binary.MaxVarintLen64))
	b = append(b, packLeaseMagic[:]...)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for _, e := range entries {
		b = binary.AppendUvarint(b, uint64(e.index))
		b = binary.AppendVarint(b, e.deadline.UnixNano())
	}
	return b
}

func isPackLease(data []byte) bool { return len(data) >= 3 && [3]byte(data[:3]) == packLeaseMagic }

func decodePackLease(data []byte) ([]leaseEntry, error) {
	if !isPackLease(data) {
		return nil, ErrBadData
	}
	r := varintReader{b: data[3:]}
	count := r.count()
	out := make([]leaseEntry, 0, count)
	for range count {
		index, d := r.index(), r.varint()
		if r.bad {
			return nil, ErrBadData
		}
		out = append(out, leaseEntry{index: index, deadline: time.Unix(0, d)})
	}
	if r.bad {
		return nil, ErrBadData
	}
	return out, nil
}

// parseMemberToken splits a pack message's token into its lease's name
// and its index; ok is false for any other token.
func parseMemberToken(token string) (lease string, item Name, index int, ok bool) {
	i := strings.LastIndex(token, MemberSep)
	if i < 0 {
		return "", Name{}, 0, false
	}
	x, err := strconv.Atoi(token[i+1:])
	if err != nil || x < 1 || x > maxPackCount || strconv.Itoa(x) != token[i+1:] {
		return "", Name{}, 0, false
	}
	if isMemberToken(token[:i]) {
		return "", Name{}, 0, false
	}
	item, ok = ParseLeaseName(token[:i])
	if !ok || item.Count == 0 {
		return "", Name{}, 0, false
	}
	return token[:i], item, x, true
}

// settleKind is what a settlement does with one message of a pack lease.
type settleKind int

const (
	settleAck     settleKind = iota
	settleExtend             // ttl
	settleNack               // delay, policy
	settleRelease            // policy, whatever the deadline
	settleExpire             // policy with its backoff, past the deadline (the sweep)
	settleUnclaim            // back with the delivery count it had
)

// settleOp is one settlement of a message of a pack lease, and its answer.
type settleOp struct {
	kind  settleKind
	index int
	ttl   time.Duration
	delay time.Duration
	p     Policy

	m        Message
	out      Outcome
	deadline time.Time
	err      error
}

// packTx is where a pack lease's settlements write: the queue's nodes and
// the transaction of the Leases or the LeaseSweeper.
type packTx struct {
	items, leases, dead string
	acl                 []zk.ACL
	tx                  txn
	get                 func(string) ([]byte, *zk.Stat, error)
}

// packLease names a pack lease node: its name, and the pack's item name
// it was made from.
type packLease struct {
	name string
	item Name
}

// leaseState is a pack lease as read (or as last written here): its
// unsettled messages, its version, and its messages' data by index (nil
// until read: an ack needs none).
type leaseState struct {
	entries []leaseEntry // in index order
	version int32
	msgs    map[int][]byte
}

// packLeases is the Leases' part for pack leases: the rounds of
// settlements per lease, and the states this process wrote.
type packLeases struct {
	tx     packTx
	rescan func()

	mu     sync.Mutex
	rounds map[string][]*settleRound
	known  map[string]leaseState
}

// maxKnown bounds the lease states remembered; past it they are
// forgotten (and read again when settled).
const maxKnown = 1024

type settleRound struct {
	open bool
	turn chan struct{}
	done chan struct{}
	ops  []*settleOp
}

func (pl *packLeases) remember(lease string, st leaseState, ok bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if !ok {
		delete(pl.known, lease)
		return
	}
	if len(pl.known) >= maxKnown {
		clear(pl.known)
	}
	pl.known[lease] = st
}

// settle applies ops to lease, with those of concurrent callers, and
// returns once they committed (or failed).
func (pl *packLeases) settle(ctx context.Context, lease string, item Name, ops ...*settleOp) {
	pl.mu.Lock()
	rounds := pl.rounds[lease]
	var r *settleRound
	lead := false
	if n := len(rounds); n > 0 && rounds[n-1].open {
		r = rounds[n-1]
	} else {
		r = &settleRound{open: true, turn: make(chan struct{}), done: make(chan struct{})}
		if len(rounds) == 0 {
			close(r.turn)
		}
		pl.rounds[lease] = append(rounds, r)
		lead = true
	}
	r.ops = append(r.ops, ops...)
	pl.mu.Unlock()
	if !lead {
		<-r.done // the round's writer answers whatever its ctx: a settlement under way is not abandoned
		return
	}
	<-r.turn
	pl.mu.Lock()
	r.open = false
	pl.mu.Unlock()
	pl.apply(context.WithoutCancel(ctx), lease, item, r.ops)
	close(r.done)
	pl.mu.Lock()
	rest := pl.rounds[lease][1:]
	if len(rest) == 0 {
		delete(pl.rounds, lease)
	} else {
		pl.rounds[lease] = rest
		close(rest[0].turn)
	}
	pl.mu.Unlock()
}

// apply runs one round: it reads the lease (unless known), applies ops in
// order and writes the outcome in one transaction, again from a fresh
// read when the lease changed meanwhile.
func (pl *packLeases) apply(ctx context.Context, lease string, item Name, ops []*settleOp) {
	for attempt := 0; ; attempt++ {
		pl.mu.Lock()
		st, ok := pl.known[lease]
		pl.mu.Unlock()
		if !ok || st.msgs == nil && needsData(ops) {
			var err error
			if st, err = readPackLease(pl.tx, lease, needsData(ops)); err != nil {
				for _, op := range ops {
					op.err = err
				}
				pl.remember(lease, leaseState{}, false)
				return
			}
		}
		next, err := pl.tx.writeSettlements(ctx, packLease{lease, item}, st, ops, time.Now())
		if errors.Is(err, zk.ErrBadVersion) && attempt < 8 {
			pl.remember(lease, leaseState{}, false)
			continue
		}
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			err = ErrUnknownLease
		}
		if err != nil {
			for _, op := range ops {
				if op.err == nil {
					op.err = err
				}
			}
			pl.remember(lease, leaseState{}, false)
			return
		}
		pl.remember(lease, next, len(next.entries) > 0)
		for _, op := range ops {
			if op.err == nil && op.out == Requeued && (op.kind == settleNack || op.kind == settleRelease || op.kind == settleUnclaim) {
				pl.rescan()
				break
			}
		}
		return
	}
}

// needsData reports whether ops need the messages' data: all but acks
// and extensions do.
func needsData(ops []*settleOp) bool {
	return slices.ContainsFunc(ops, func(op *settleOp) bool { return op.kind != settleAck && op.kind != settleExtend })
}

// readPackLease reads a pack lease, and with data its messages; a missing
// lease is ErrUnknownLease.
func readPackLease(t packTx, lease string, data bool) (leaseState, error) {
	b, stat, err := t.get(t.leases + "/" + lease)
	if errors.Is(err, zk.ErrNoNode) {
		return leaseState{}, ErrUnknownLease
	}
	if err != nil {
		return leaseState{}, fmt.Errorf("get lease %s: %w", lease, err)
	}
	entries, err := decodePackLease(b)
	if err != nil {
		return leaseState{}, fmt.Errorf("lease %s: %w", lease, err)
	}
	st := leaseState{entries: entries, version: stat.Version}
	if data {
		if st.msgs, err = readPackMsgs(t, lease); err != nil {
			return leaseState{}, err
		}
	}
	return st, nil
}

// readPackMsgs reads the messages of a pack lease.
func readPackMsgs(t packTx, lease string) (map[int][]byte, error) {
	b, _, err := t.get(t.leases + "/" + lease + packMsgsSuffix)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, ErrUnknownLease // settled meanwhile: the lease went with it
	}
	if err != nil {
		return nil, fmt.Errorf("get lease %s: %w", lease, err)
	}
	entries, err := decodePack(b)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", lease, ErrBadData)
	}
	msgs := make(map[int][]byte, len(entries))
	for _, e := range entries {
		msgs[e.index] = e.data
	}
	return msgs, nil
}

// writeSettlements applies ops to lease in state st at now and writes
// the result: the lease rewritten or deleted, the messages put back,
// delayed or dead-lettered, in one transaction (a dead letter's segment
// is made first when missing). Each op's answer is set; an op refused
// (its message settled already, or its lease expired) changes nothing.
// It returns the lease's new state.
func (t packTx) writeSettlements(ctx context.Context, lease packLease, st leaseState, ops []*settleOp, now time.Time) (leaseState, error) {
	live := slices.Clone(st.entries)
	find := func(index int) int {
		return slices.IndexFunc(live, func(e leaseEntry) bool { return e.index == index })
	}
	var back, dead []packEntry
	var delayed []any
	changed := false // an op was applied
	for _, op := range ops {
		op.err, op.out = nil, 0
		i := find(op.index)
		if i < 0 {
			op.err = fmt.Errorf("%w: settled", ErrUnknownLease)
			continue
		}
		e := live[i]
		data := st.msgs[e.index]
		m := Message{ID: memberID(lease.item, e.index), Priority: lease.item.Priority}
		if data != nil {
			dm, err := DecodeData(data)
			if err != nil {
				op.err = fmt.Errorf("%s: %w", lease.name, ErrBadData)
				continue
			}
			dm.ID, dm.Priority = m.ID, m.Priority
			m = dm
		} else if op.kind != settleAck && op.kind != settleExtend {
			op.err = fmt.Errorf("%s: %w", lease.name, ErrBadData) // its data is missing
			continue
		}
		op.m = m
		if (op.kind == settleAck || op.kind == settleExtend || op.kind == settleNack) && now.After(e.deadline) {
			op.err = fmt.Errorf("%w: expired %v ago", ErrUnknownLease, now.Sub(e.deadline).Round(time.Millisecond))
			continue
		}
		changed = true
		switch op.kind {
		case settleAck:
		case settleExtend:
			live[i].deadline = now.Add(op.ttl)
			op.deadline = live[i].deadline
			continue
		case settleUnclaim:
			m.Deliveries = max(m.Deliveries-1, 0)
			back = append(back, packEntry{index: e.index, data: EncodeData(m)})
			op.out = Requeued
		default:
			delay := op.delay
			if (op.kind == settleNack || op.kind == settleExpire) && delay == 0 && op.p.Backoff != nil && !tooMany(m, op.p) {
				delay = op.p.Backoff.Delay(m.Deliveries)
			}
			switch {
			case tooMany(m, op.p) && op.p.DeadLetter:
				dead = append(dead, packEntry{index: e.index, data: data})
				op.out = DeadLettered
			case tooMany(m, op.p):
				op.out = Dropped
			case delay > 0:
				own := memberName(lease.item, e.index)
				delayed = append(delayed, &zk.CreateRequest{Path: t.leases + "/" + newLeaseName(own.Raw),
					Data: encodeNackedLease(now.Add(delay), data), Acl: t.acl})
				op.out = Delayed
			default:
				back = append(back, packEntry{index: e.index, data: data})
				op.out = Requeued
			}
		}
		live = slices.Delete(live, i, i+1)
	}
	if !changed {
		return st, nil // every op refused
	}
	p := t.leases + "/" + lease.name
	var txOps []any
	next := leaseState{entries: live, version: st.version + 1, msgs: st.msgs}
	if len(live) == 0 {
		txOps = append(txOps, &zk.DeleteRequest{Path: p, Version: st.version},
			&zk.DeleteRequest{Path: p + packMsgsSuffix, Version: -1})
	} else {
		txOps = append(txOps, &zk.SetDataRequest{Path: p, Data: encodePackLease(live), Version: st.version})
	}
	txOps = append(txOps, delayed...)
	if len(dead) > 0 {
		if err := ensureDeadSegment(t, lease.item); err != nil {
			return st, err
		}
		for _, e := range dead {
			txOps = append(txOps, &zk.CreateRequest{Path: deadLetterPath(t.dead, memberName(lease.item, e.index)), Data: e.data, Acl: t.acl})
		}
	}
	if len(back) == 0 {
		_, err := t.tx.write(ctx, txOps...)
		return next, err
	}
	at := putBackName(lease.item, back)
	txOps = append(txOps, &zk.CreateRequest{Path: itemPath(t.items, at), Data: putBackData(back), Acl: t.acl})
	return next, requeue(ctx, t.tx, t.items, at, txOps)
}

// ensureDeadSegment creates the dead segment of item's messages, sealed,
// unless it exists.
func ensureDeadSegment(t packTx, item Name) error {
	sg, prio := segmentOf(item)
	if sg.k == 0 {
		return nil
	}
	p := segmentPath(t.dead, prio, sg)
	ok, _, err := t.tx.exists(p)
	if err != nil || ok {
		return err
	}
	_, err = t.tx.write(context.Background(), createSegmentOp(p, t.acl), &zk.SetDataRequest{Path: p, Data: sealedData, Version: 0})
	if errors.Is(err, zk.ErrNodeExists) {
		return nil
	}
	return err
}

// claimPack moves pack n (read as data at version) into one lease of
// ttl, within fit, and returns its messages' leases.
func (l *Leases) claimPack(ctx context.Context, n Name, data []byte, version int32, ttl time.Duration, fit fitFunc) ([]Lease, error) {
	c := l.items.claims
	ms, entries, err := decodeNode(n, data, 1)
	if err != nil {
		return nil, err
	}
	if !fit.admits(ms[0].wireSize()) {
		c.unread(n, data, version)
		return nil, fmt.Errorf("%s: %w", n.Raw, ErrNoRoom)
	}
	deadline := time.Now().Add(ttl)
	live := make([]leaseEntry, len(entries))
	msgs := make(map[int][]byte, len(entries))
	for i, e := range entries {
		live[i] = leaseEntry{index: e.index, deadline: deadline}
		msgs[e.index] = e.data
	}
	lease := newLeaseName(n.Raw)
	p := l.leases + "/" + lease
	res, err := l.items.write(ctx,
		&zk.DeleteRequest{Path: itemPath(l.items.path, n), Version: version},
		&zk.CreateRequest{Path: p + packMsgsSuffix, Data: encodePack(entries), Acl: l.items.opt.acl},
		&zk.CreateRequest{Path: p, Data: []byte{}, Acl: l.items.opt.acl},
		&zk.SetDataRequest{Path: p, Data: encodePackLease(live), Version: 0})
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", n.Raw, err)
	}
	var fence uint64
	if len(res) > 3 && res[3].Stat != nil {
		fence = uint64(res[3].Stat.Czxid)
	}
	l.packs.remember(lease, leaseState{entries: live, version: 1, msgs: msgs}, true)
	out := make([]Lease, len(ms))
	for i, m := range ms {
		out[i] = Lease{Message: m, Token: lease + MemberSep + strconv.Itoa(entries[i].index), Deadline: deadline, FencingToken: fence}
	}
	return out, nil
}

// claimNode claims node n of a packed queue: a pack whole, any other node
// as Leases.claim does.
func (l *Leases) claimNode(ctx context.Context, n Name, ttl time.Duration, fit fitFunc) ([]Lease, error) {
	c := l.items.claims
	data, version, err := c.read(ctx, itemPath(l.items.path, n), n)
	if err != nil {
		return nil, err
	}
	if isPack(data) {
		return l.claimPack(ctx, n, data, version, ttl, fit)
	}
	c.unread(n, data, version)
	le, err := l.claim(ctx, n, ttl, fit)
	if err != nil {
		return nil, err
	}
	return []Lease{le}, nil
}

// settleMember settles the message of pack lease token.
func (l *Leases) settleMember(ctx context.Context, token string, op *settleOp) error {
	lease, item, index, ok := parseMemberToken(token)
	if !ok {
		return fmt.Errorf("%w: malformed token", ErrUnknownLease)
	}
	op.index = index
	l.packs.settle(ctx, lease, item, op)
	return op.err
}

// giveBack gives buffered leases back (Unclaim), those of one lease in
// one round.
func (l *Leases) giveBack(ctx context.Context, ls []Lease) {
	byLease := map[string][]*settleOp{}
	items := map[string]Name{}
	var order []string
	for _, le := range ls {
		lease, item, index, ok := parseMemberToken(le.Token)
		if !ok {
			_ = l.Unclaim(ctx, le.Token)
			continue
		}
		if _, seen := byLease[lease]; !seen {
			order = append(order, lease)
		}
		byLease[lease] = append(byLease[lease], &settleOp{kind: settleUnclaim, index: index})
		items[lease] = item
	}
	for _, lease := range order {
		l.packs.settle(ctx, lease, items[lease], byLease[lease]...)
	}
}

// Flush gives back the leases a packed queue's takes claimed and did not
// hand out (packbuf.go): they go back to their places with the delivery
// counts they had. A process stopping consuming calls it. Without packing
// it does nothing.
func (l *Leases) Flush(ctx context.Context) {
	if l.buf != nil {
		l.giveBack(ctx, l.buf.drain())
	}
}

// sweepPack releases the messages of pack lease h (its data read at its
// version) whose deadline is before cutoff (now for the sweep, any time
// for Revoke), by policy p at now (with its Backoff, an expired message is
// held back for its step first), and returns them and the lease's next
// deadline (zero when none is left).
func (t packTx) sweepPack(ctx context.Context, h heldLease, cutoff, now time.Time, p Policy) ([]Expired, time.Time, error) {
	entries, err := decodePackLease(h.data)
	if err != nil {
		return nil, farFuture, nil
	}
	var ops []*settleOp
	next := time.Time{}
	for _, e := range entries {
		if cutoff.After(e.deadline) {
			ops = append(ops, &settleOp{kind: settleExpire, index: e.index, p: p})
			continue
		}
		if next.IsZero() || e.deadline.Before(next) {
			next = e.deadline
		}
	}
	if len(ops) == 0 {
		return nil, next, nil
	}
	msgs, err := readPackMsgs(t, h.token)
	if errors.Is(err, ErrUnknownLease) {
		return nil, next, zk.ErrNoNode
	}
	if err != nil {
		return nil, now, err
	}
	st := leaseState{entries: entries, version: h.version, msgs: msgs}
	if _, err := t.writeSettlements(ctx, packLease{h.token, h.item}, st, ops, now); err != nil {
		return nil, now, err
	}
	var out []Expired
	for _, op := range ops {
		if op.err == nil {
			out = append(out, Expired{Message: op.m, Outcome: op.out})
		}
	}
	return out, next, nil
}
