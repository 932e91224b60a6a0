package zkqueue

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Acknowledged (at-least-once) delivery.
//
// A claim moves the message node from the items parent into the leases
// parent in one Multi: delete(item, version) + create(lease, empty) +
// setData(lease, version 0), the setData answering with the lease's Stat
// and so its creation zxid, the delivery's fencing token. The lease node
// is named <item name>~<16 hex digits of nonce> and holds the lease
// deadline followed by the message data with its delivery count raised.
// The lease is a persistent node: it does not depend on the claiming
// broker's ZooKeeper session, so a broker crash delays redelivery until the
// deadline but never loses the message.
//
//	ack:      delete(lease, version), after checking the deadline
//	nack:     delete(lease) + create(item, original name), one Multi; with
//	          a delay, delete(lease) + create(a new lease name, marked
//	          nacked, deadline now+delay), one Multi, and the sweep
//	          requeues it at that deadline
//	expiry:   the sweep requeues leases past their deadline
//	too many: past MaxDeliveries, delete(lease) + create(dead/<item name>)
//
// Requeueing recreates the item under its original name plus a new
// incarnation suffix (see Name), so it keeps its place at the head of the
// queue. That is safe because ZooKeeper's sequence counter has passed that
// name and never issues it again. Dead letters are stored under the base
// name (the message id).

// LeaseSep separates a lease node's item name from its nonce.
const LeaseSep = "~"

// A lease node's data is a format tag, the deadline and the message data:
//
//	0xCB 'L' format (1 byte) | varint deadline (Unix ns) | item data
//
// Format 1 is a live lease. Format 2 is a lease settled by a delayed Nack:
// it only waits for its deadline to be requeued, and Ack, Nack and Extend
// refuse it.
var (
	leaseMagic       = [3]byte{0xCB, 'L', 1}
	nackedLeaseMagic = [3]byte{0xCB, 'L', 2}
)

// Policy is what happens to a message released too often.
type Policy struct {
	// MaxDeliveries: a released message already delivered this many times
	// is dead-lettered (or dropped); 0 means unlimited.
	MaxDeliveries int
	// DeadLetter keeps such messages in the dead-letter parent; without it
	// they are deleted.
	DeadLetter bool
	// Backoff, when set, holds back a message nacked without a delay, or
	// whose lease expired, for its step of the schedule (backoff.go).
	Backoff *Backoff
}

// Leases is the at-least-once layer over a Queue: the leases and dead
// letters of one queue. It is safe for concurrent use.
type Leases struct {
	items  *Queue
	leases string
	dead   string
	rel    releaser
	packs  *packLeases     // leases of packs (packlease.go)
	buf    *packBuf[Lease] // claimed, not yet handed out; nil without WithPacking
}

// NewLeases returns the lease layer of items, keeping leases under
// leasesPath and dead letters under deadPath (created when missing, unless
// the Queue was opened WithoutCreate).
func NewLeases(items *Queue, leasesPath, deadPath string) (*Leases, error) {
	for _, p := range []string{leasesPath, deadPath} {
		if items.opt.noCreate {
			break
		}
		if err := zkutil.EnsurePath(items.conn, p, items.opt.acl); err != nil {
			return nil, err
		}
	}
	rel := releaser{items: items.path, leases: leasesPath, dead: deadPath, groups: items.opt.groupsDir, acl: items.opt.acl,
		tx: txn{write: items.write, exists: items.zk.Exists, del: items.zk.Delete}}
	l := &Leases{items: items, leases: leasesPath, dead: deadPath, rel: rel}
	l.packs = &packLeases{tx: packTx{items: items.path, leases: leasesPath, dead: deadPath, acl: items.opt.acl, tx: rel.tx, get: items.zk.Get},
		rescan: items.Rescan, rounds: map[string][]*settleRound{}, known: map[string]leaseState{}}
	if items.buf != nil {
		l.buf = newPackBuf(minClaim(items.opt), func(le Lease) int { return le.wireSize() }, l.giveBack)
	}
	return l, nil
}

// Lease is a message delivered at-least-once.
type Lease struct {
	Message
	// Token is the lease node's name; with the queue it identifies the
	// lease to any broker.
	Token string
	// Deadline is when the lease expires.
	Deadline time.Time
	// FencingToken is greater than that of every earlier delivery of the
	// same message, whichever process claimed it: the zxid of the
	// transaction that created the lease node (its Czxid). Every claim
	// of a message creates a new lease node, and a message is claimable
	// again only after a later transaction deleted its previous lease
	// (a release, a nack, an expiry, a dead letter and its redrive), so
	// ZooKeeper's zxid order is the deliveries' order, across processes,
	// restarts and leader changes (a new epoch makes greater zxids).
	// A sink that stores the token with a delivery's effect and refuses a
	// write carrying a token not greater than the stored one refuses the
	// writes of a consumer whose lease expired once the message's next
	// delivery wrote. Tokens of different messages are not ordered with
	// each other (several claims committed together share one).
	FencingToken uint64
}

// ParseLeaseName splits a lease node name into the item name and nonce.
// It accepts the token of a pack's message too ("<lease name>@<index>",
// packlease.go), and returns the pack's name.
func ParseLeaseName(s string) (item Name, ok bool) {
	if isMemberToken(s) {
		_, item, _, ok := parseMemberToken(s)
		return item, ok
	}
	i := strings.LastIndex(s, LeaseSep)
	if i < 0 || len(s)-i-1 != 16 {
		return Name{}, false
	}
	if _, err := hex.DecodeString(s[i+1:]); err != nil {
		return Name{}, false
	}
	return ParseName(s[:i])
}

// isMemberToken reports whether token names a message of a pack's lease.
func isMemberToken(token string) bool { return strings.Contains(token, MemberSep) }

// AckReads reports whether AckUnread of token reads its lease anyway, as
// Ack does: a pack's message, or a grouped message (its group is settled
// with it).
func AckReads(token string) bool { return groupedLease(token) || isMemberToken(token) }

func newLeaseName(item string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return item + LeaseSep + hex.EncodeToString(b[:])
}

// groupedLease reports whether lease token was named for a grouped
// message (newLeaseNameFor): the top bit of its nonce's first byte.
func groupedLease(token string) bool {
	i := strings.LastIndex(token, LeaseSep)
	return i >= 0 && i+1 < len(token) && token[i+1] >= '8'
}

// newLeaseNameFor names a lease of message m: a grouped message's nonce
// has its top bit set, a plain one's clear, so AckUnread, which does not
// read the lease, knows which need their group settled too.
func newLeaseNameFor(item string, m Message) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	if m.Group != "" && isEntryName(m.groupEntry) {
		b[0] |= 0x80
	} else {
		b[0] &^= 0x80
	}
	return item + LeaseSep + hex.EncodeToString(b[:])
}

// newIncarnation returns the name under which a released message is
// recreated: its base name plus a fresh incarnation suffix.
func newIncarnation(n Name) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return n.Base + "." + hex.EncodeToString(b[:])
}

func encodeLease(deadline time.Time, itemData []byte) []byte {
	return appendLease(leaseMagic, deadline, itemData)
}

// encodeNackedLease is the data of a lease settled by a delayed Nack.
func encodeNackedLease(deadline time.Time, itemData []byte) []byte {
	return appendLease(nackedLeaseMagic, deadline, itemData)
}

func appendLease(magic [3]byte, deadline time.Time, itemData []byte) []byte {
	b := make([]byte, 0, len(magic)+binary.MaxVarintLen64+len(itemData))
	b = append(b, magic[:]...)
	b = binary.AppendVarint(b, deadline.UnixNano())
	return append(b, itemData...)
}

// decodeLease returns a lease's deadline and message data, whether live or
// nacked (see decodeLeaseState).
func decodeLease(data []byte) (deadline time.Time, itemData []byte, err error) {
	deadline, itemData, _, err = decodeLeaseState(data)
	return deadline, itemData, err
}

// decodeLeaseState is decodeLease that also tells whether a delayed Nack
// settled the lease.
func decodeLeaseState(data []byte) (deadline time.Time, itemData []byte, nacked bool, err error) {
	if len(data) < 3 {
		return time.Time{}, nil, false, ErrBadData
	}
	switch [3]byte(data[:3]) {
	case leaseMagic:
	case nackedLeaseMagic:
		nacked = true
	default:
		return time.Time{}, nil, false, ErrBadData
	}
	d, n := binary.Varint(data[3:])
	if n <= 0 {
		return time.Time{}, nil, false, ErrBadData
	}
	return time.Unix(0, d), data[3+n:], nacked, nil
}

// claim moves candidate n into a lease lasting ttl, within the caller's
// room (see fitClaimFunc): a message that does not fit stays in the queue,
// unleased. It returns zk.ErrNoNode or zk.ErrBadVersion when another
// consumer won the race.
func (l *Leases) claim(ctx context.Context, n Name, ttl time.Duration, fit fitFunc) (Lease, error) {
	c := l.items.claims
	itemPath := itemPath(l.items.path, n)
	data, version, err := c.read(ctx, itemPath, n)
	if err != nil {
		return Lease{}, err
	}
	m, err := decodeMessage(n, data, 1)
	if err != nil {
		return Lease{}, err
	}
	if c.ttl != nil && c.ttl.expired(m, time.Now()) {
		return Lease{}, c.ttl.expireClaimed(ctx, n, data, version)
	}
	var gops []any
	if m.Group != "" {
		entry := "" // claimed without its group
		if c.groups != nil {
			if entry, err = c.groups.gate(m); err != nil {
				c.unread(n, data, version)
				return Lease{}, err
			}
		}
		m.groupEntry = entry
		if entry != "" {
			gops = c.groups.claimOps(m.Group, entry, true)
		}
	}
	if !fit.admits(m.wireSize()) {
		c.unread(n, data, version)
		return Lease{}, fmt.Errorf("%s: %w", n.Raw, ErrNoRoom)
	}
	deadline := time.Now().Add(ttl)
	token := newLeaseNameFor(n.Raw, m)
	leasePath := l.leases + "/" + token
	// The lease is created empty and written in the same transaction:
	// the write's answer carries the node's Stat, whose Czxid (the
	// transaction's zxid) is the delivery's fencing token (see Lease).
	res, err := l.items.write(ctx, append([]any{
		&zk.DeleteRequest{Path: itemPath, Version: version},
		&zk.CreateRequest{Path: leasePath, Data: []byte{}, Acl: l.items.opt.acl},
		&zk.SetDataRequest{Path: leasePath, Data: encodeLease(deadline, EncodeData(m)), Version: 0},
	}, gops...)...)
	if err != nil {
		if gops != nil && errors.Is(err, zk.ErrNodeExists) {
			return Lease{}, errGroupBusy // another process leased the group's head
		}
		return Lease{}, fmt.Errorf("lease %s: %w", itemPath, err)
	}
	var fence uint64
	if len(res) > 2 && res[2].Stat != nil {
		fence = uint64(res[2].Stat.Czxid)
	}
	return Lease{Message: m, Token: token, Deadline: deadline, FencingToken: fence}, nil
}

// Take claims up to max messages from the head, each with a lease of ttl:
// it waits (with block, until ctx ends) for the first, adds the
// candidates available at once and claims them concurrently, so their
// writes share a Multi when the queue has a Committer. Claims stop at the
// first message that would take the total past room.Bytes (the first
// always fits); one that does not fit stays at its place, first in line
// next. Without block it returns ErrEmpty when nothing is there.
func (l *Leases) Take(ctx context.Context, max int, room Room, ttl time.Duration, block bool) ([]Lease, error) {
	if l.buf != nil {
		fresh := func(le Lease) bool { return time.Until(le.Deadline) >= ttl/2 }
		return takePacked(ctx, l.items.disp, takeReq{max: max, room: room, block: block, weigh: true}, l.buf,
			func(ctx context.Context, n Name, fit fitFunc) ([]Lease, error) { return l.claimNode(ctx, n, ttl, fit) },
			fresh)
	}
	return takeWithin(ctx, l.items.disp, takeReq{max: max, room: room, block: block}, func(ctx context.Context, n Name, fit fitFunc) (Lease, error) {
		return l.claim(ctx, n, ttl, fit)
	})
}

// TakeRequest is what TakeOrdered asks for: up to Max messages within
// Room, each with a lease of TTL, waiting for the first with Block.
type TakeRequest struct {
	Max   int
	Room  Room
	TTL   time.Duration
	Block bool
	// Picked, when set, is called once the take has chosen the messages
	// it claims, before it claims them: a take of this process begun
	// after Picked returned chooses later messages (but see Full).
	Picked func()
}

// TakeOrdered is Take for a caller with several takes under way at once
// that hands out their messages in the order the takes began (a buffer
// claiming ahead of its consumers): each take chooses its messages before
// the next one begins (Picked), so in queue order. full reports that a
// message did not fit r.Room: it stays first in line, so the takes begun
// after this one have overtaken it, and a caller that keeps order gives
// their messages back (Unclaim) before it takes again. A packed queue's
// take chooses and claims in one step: Picked is called once it is done.
// Lost races to another process move a take on to later messages, as in
// Take: across processes order is not kept anyway.
func (l *Leases) TakeOrdered(ctx context.Context, r TakeRequest) (leases []Lease, full bool, err error) {
	picked := r.Picked
	if picked == nil {
		picked = func() {}
	}
	if l.buf != nil {
		defer picked()
		leases, err = l.Take(ctx, r.Max, r.Room, r.TTL, r.Block)
		return leases, false, err
	}
	t := takeReq{max: r.Max, room: r.Room, block: r.Block, picked: picked, full: &full}
	leases, err = takeWithin(ctx, l.items.disp, t, func(ctx context.Context, n Name, fit fitFunc) (Lease, error) {
		return l.claim(ctx, n, r.TTL, fit)
	})
	return leases, full, err
}

// get reads a lease that is not settled. Unknown leases and leases settled
// by a delayed Nack are ErrUnknownLease; the caller checks the deadline.
func (l *Leases) get(token string) (deadline time.Time, itemData []byte, stat *zk.Stat, err error) {
	if _, ok := ParseLeaseName(token); !ok {
		return time.Time{}, nil, nil, fmt.Errorf("%w: malformed token", ErrUnknownLease)
	}
	data, stat, err := l.items.zk.Get(l.leases + "/" + token)
	if errors.Is(err, zk.ErrNoNode) {
		return time.Time{}, nil, nil, ErrUnknownLease
	}
	if err != nil {
		return time.Time{}, nil, nil, fmt.Errorf("get lease %s: %w", token, err)
	}
	deadline, itemData, nacked, err := decodeLeaseState(data)
	if err != nil {
		return time.Time{}, nil, nil, fmt.Errorf("lease %s: %w", token, err)
	}
	if nacked {
		return time.Time{}, nil, nil, fmt.Errorf("%w: nacked", ErrUnknownLease)
	}
	return deadline, itemData, stat, nil
}

// AckMany acks several deliveries and returns each one's message and
// error (as Ack's), in tokens' order. The messages of one pack lease are
// settled by one write of it, as concurrent Acks of them would be, with
// one goroutine waiting rather than one per message; the leases run
// concurrently, the tokens of other leases one by one after them.
func (l *Leases) AckMany(ctx context.Context, tokens []string) ([]Message, []error) {
	msgs, errs := make([]Message, len(tokens)), make([]error, len(tokens))
	type lease struct {
		name string
		item Name
		ops  []*settleOp
		at   []int // the ops' places in tokens
	}
	var packs []*lease
	var others []int
	for i, tok := range tokens {
		name, item, index, ok := parseMemberToken(tok)
		if !ok {
			others = append(others, i)
			continue
		}
		j := slices.IndexFunc(packs, func(p *lease) bool { return p.name == name })
		if j < 0 {
			j = len(packs)
			packs = append(packs, &lease{name: name, item: item})
		}
		packs[j].ops = append(packs[j].ops, &settleOp{kind: settleAck, index: index})
		packs[j].at = append(packs[j].at, i)
	}
	settle := func(p *lease) {
		l.packs.settle(ctx, p.name, p.item, p.ops...)
		for k, op := range p.ops {
			msgs[p.at[k]], errs[p.at[k]] = op.m, op.err
		}
	}
	var wg sync.WaitGroup
	for i, p := range packs {
		if i == len(packs)-1 {
			settle(p) // the last on this goroutine
		} else {
			wg.Go(func() { settle(p) })
		}
	}
	wg.Wait()
	for _, i := range others {
		msgs[i], errs[i] = l.Ack(ctx, tokens[i])
	}
	return msgs, errs
}

// Ack deletes the leased message. Errors: ErrUnknownLease when the lease
// does not exist, has expired, or was settled already (acked or nacked).
func (l *Leases) Ack(ctx context.Context, token string) (Message, error) {
	if isMemberToken(token) {
		op := &settleOp{kind: settleAck}
		err := l.settleMember(ctx, token, op)
		return op.m, err
	}
	deadline, itemData, stat, err := l.get(token)
	if err != nil {
		return Message{}, err
	}
	if time.Now().After(deadline) {
		return Message{}, fmt.Errorf("%w: expired %v ago", ErrUnknownLease, time.Since(deadline).Round(time.Millisecond))
	}
	item, _ := ParseLeaseName(token)
	m, merr := decodeMessage(item, itemData, 0)
	var gops []any
	if merr == nil && l.rel.grouped(m) {
		gops = groupReleaseOps(l.rel.groups, m, true)
	}
	if _, err := l.items.write(ctx, append([]any{&zk.DeleteRequest{Path: l.leases + "/" + token, Version: stat.Version}}, gops...)...); err != nil {
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return Message{}, ErrUnknownLease
		}
		return Message{}, fmt.Errorf("delete lease %s: %w", token, err)
	}
	if gops != nil {
		dropIdleGroup(l.items.zk.Delete, l.rel.groups, m)
	}
	return m, merr
}

// AckUnread deletes a lease by name without reading it first, for a caller
// that knows the lease's deadline has not passed. The returned Message has
// only the ID and Priority (from the name). Errors: ErrUnknownLease when
// the lease is gone (settled, or released by expiry).
//
// A lease settled by a delayed Nack is gone too: the Nack moved it to a new
// name (see Nack), so the name a delivery's token carries can only be
// deleted while the delivery is unsettled. Extend keeps the name (it only
// moves the deadline later), and the caller's knowledge of the deadline
// then errs on the safe side.
func (l *Leases) AckUnread(ctx context.Context, token string) (Message, error) {
	item, ok := ParseLeaseName(token)
	if !ok {
		return Message{}, fmt.Errorf("%w: malformed token", ErrUnknownLease)
	}
	if AckReads(token) {
		// Its group is settled with it, or it is one message of a
		// pack's lease: that takes the lease's data.
		return l.Ack(ctx, token)
	}
	if _, err := l.items.write(ctx, &zk.DeleteRequest{Path: l.leases + "/" + token, Version: -1}); err != nil {
		if errors.Is(err, zk.ErrNoNode) {
			return Message{}, ErrUnknownLease
		}
		return Message{}, fmt.Errorf("delete lease %s: %w", token, err)
	}
	return Message{ID: item.Base, Priority: item.Priority}, nil
}

// Extend moves a live lease's deadline to now+ttl. Errors: ErrUnknownLease
// when the lease does not exist, has expired, or was settled already.
func (l *Leases) Extend(ctx context.Context, token string, ttl time.Duration) (time.Time, error) {
	if isMemberToken(token) {
		op := &settleOp{kind: settleExtend, ttl: ttl}
		err := l.settleMember(ctx, token, op)
		return op.deadline, err
	}
	deadline, itemData, stat, err := l.get(token)
	if err != nil {
		return time.Time{}, err
	}
	if time.Now().After(deadline) {
		return time.Time{}, fmt.Errorf("%w: expired", ErrUnknownLease)
	}
	newDeadline := time.Now().Add(ttl)
	if _, err := l.items.zk.Set(l.leases+"/"+token, encodeLease(newDeadline, itemData), stat.Version); err != nil {
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return time.Time{}, ErrUnknownLease
		}
		return time.Time{}, fmt.Errorf("extend lease %s: %w", token, err)
	}
	return newDeadline, nil
}

// Outcome is what a release did with a message.
type Outcome int

// Release outcomes.
const (
	Requeued     Outcome = iota // deliverable again
	Delayed                     // deliverable again after a delay
	DeadLettered                // moved to the dead letters
	Dropped                     // deleted: too many deliveries, no dead letters
)

// Nack releases a live lease: the message is deliverable again at once, or
// after delay (without one, after the policy's Backoff step when it has
// one). Past the policy's MaxDeliveries it is dead-lettered or dropped
// instead. Either way the lease is settled: a later Ack, Nack or
// Extend of token fails with ErrUnknownLease.
//
// With a delay the message stays leased until then, but under a new lease
// name, marked nacked, in one Multi with the old lease's deletion. Renaming
// is what settles the delivery everywhere at once: AckUnread deletes by
// name without reading, so a mark alone would not stop it, and the delivery's
// token names only the old node. The mark covers anyone who learns the new
// name (it is in ZooKeeper): get refuses a nacked lease.
func (l *Leases) Nack(ctx context.Context, token string, delay time.Duration, p Policy) (Message, Outcome, error) {
	if isMemberToken(token) {
		op := &settleOp{kind: settleNack, delay: delay, p: p}
		err := l.settleMember(ctx, token, op)
		return op.m, op.out, err
	}
	deadline, itemData, stat, err := l.get(token)
	if err != nil {
		return Message{}, 0, err
	}
	if time.Now().After(deadline) {
		return Message{}, 0, fmt.Errorf("%w: expired", ErrUnknownLease)
	}
	item, _ := ParseLeaseName(token)
	m, err := decodeMessage(item, itemData, 0)
	if err != nil {
		return Message{}, 0, err
	}
	if delay == 0 && p.Backoff != nil && !tooMany(m, p) {
		delay = p.Backoff.Delay(m.Deliveries)
	}
	h := heldLease{token: token, version: stat.Version, item: item, data: itemData, m: m}
	if delay > 0 && !tooMany(m, p) {
		_, ops := delayOps(l.leases, h, time.Now().Add(delay), l.items.opt.acl)
		if _, err := l.items.write(ctx, ops...); err != nil {
			if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
				return Message{}, 0, ErrUnknownLease
			}
			return Message{}, 0, fmt.Errorf("delay lease %s: %w", token, err)
		}
		return m, Delayed, nil
	}
	out, err := l.release(ctx, h, p)
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
		return Message{}, 0, ErrUnknownLease
	}
	return m, out, err
}

// delayOps is the transaction that settles the held lease h (a child of
// leasesPath, at its version) and keeps its message leased until due: the
// lease under a new name, marked nacked. It returns the new name.
func delayOps(leasesPath string, h heldLease, due time.Time, acl []zk.ACL) (string, []any) {
	next := newLeaseName(h.item.Raw)
	return next, []any{
		&zk.DeleteRequest{Path: leasesPath + "/" + h.token, Version: h.version},
		&zk.CreateRequest{Path: leasesPath + "/" + next, Data: encodeNackedLease(due, h.data), Acl: acl},
	}
}

// release moves a lease back to the items (or to the dead letters) in one
// Multi, conditional on the lease's version.
func (l *Leases) release(ctx context.Context, h heldLease, p Policy) (Outcome, error) {
	out, err := l.rel.release(ctx, h, p)
	if err != nil {
		return 0, fmt.Errorf("release %s/%s: %w", l.leases, h.token, err)
	}
	if out == Requeued {
		l.items.Rescan()
	}
	return out, nil
}

// Release gives a lease back regardless of its deadline (a consumer's
// stream ended, the broker shuts down). A lease already settled is not an
// error: ok is false.
func (l *Leases) Release(ctx context.Context, token string, p Policy) (m Message, out Outcome, ok bool, err error) {
	if isMemberToken(token) {
		op := &settleOp{kind: settleRelease, p: p}
		err := l.settleMember(ctx, token, op)
		if errors.Is(err, ErrUnknownLease) {
			return Message{}, 0, false, nil
		}
		return op.m, op.out, err == nil, err
	}
	item, valid := ParseLeaseName(token)
	if !valid {
		return Message{}, 0, false, ErrUnknownLease
	}
	data, stat, err := l.items.zk.Get(l.leases + "/" + token)
	if errors.Is(err, zk.ErrNoNode) {
		return Message{}, 0, false, nil
	}
	if err != nil {
		return Message{}, 0, false, fmt.Errorf("get lease %s: %w", token, err)
	}
	_, itemData, err := decodeLease(data)
	if err != nil {
		return Message{}, 0, false, err
	}
	if m, err = decodeMessage(item, itemData, 0); err != nil {
		return Message{}, 0, false, err
	}
	out, err = l.release(ctx, heldLease{token: token, version: stat.Version, item: item, data: itemData, m: m}, p)
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
		return Message{}, 0, false, nil
	}
	return m, out, err == nil, err
}

// Unclaim undoes a claim whose message was never handed to a consumer:
// the message goes back to its place in the queue with the delivery count
// it had before the claim, whatever the lease's deadline. A lease already
// released or settled is not an error.
func (l *Leases) Unclaim(ctx context.Context, token string) error {
	if isMemberToken(token) {
		err := l.settleMember(ctx, token, &settleOp{kind: settleUnclaim})
		if errors.Is(err, ErrUnknownLease) {
			return nil
		}
		return err
	}
	item, valid := ParseLeaseName(token)
	if !valid {
		return ErrUnknownLease
	}
	data, stat, err := l.items.zk.Get(l.leases + "/" + token)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get lease %s: %w", token, err)
	}
	_, itemData, err := decodeLease(data)
	if err != nil {
		return err
	}
	m, err := decodeMessage(item, itemData, 0)
	if err != nil {
		return err
	}
	m.Deliveries = max(m.Deliveries-1, 0)
	_, err = l.release(ctx, heldLease{token: token, version: stat.Version, item: item, data: EncodeData(m), m: m}, Policy{})
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
		return nil
	}
	return err
}

// InFlight returns the number of leases, from the parent's Stat. A packed
// queue's leases are listed: a pack's lease counts the messages its name
// does (those claimed, settled ones included until the lease's last).
func (l *Leases) InFlight(ctx context.Context) (int, error) {
	if l.buf == nil {
		return zkutil.NumChildren(l.items.conn, l.leases)
	}
	children, _, err := l.items.zk.Children(l.leases)
	if err != nil {
		return 0, fmt.Errorf("children %s: %w", l.leases, err)
	}
	n := 0
	for _, c := range children {
		if item, ok := ParseLeaseName(c); ok {
			n += weight(item)
		}
	}
	return n, nil
}

// DeadCount returns the number of dead letters: the flat ones, and the
// children of each dead segment from its Stat (one multiRead for all).
func (l *Leases) DeadCount(ctx context.Context) (int, error) {
	units, err := l.deadUnits()
	if err != nil {
		return 0, err
	}
	n := len(units[0].names)
	paths := make([]string, 0, len(units)-1)
	for _, u := range units[1:] {
		paths = append(paths, u.path)
	}
	rs, err := l.items.reads.readPaths(paths)
	if err != nil {
		return 0, err
	}
	for _, r := range rs {
		if r.err == nil {
			n += int(r.stat.NumChildren)
		}
	}
	return n, nil
}

// DeadLetters returns up to limit dead letters, oldest (in queue order)
// first.
func (l *Leases) DeadLetters(ctx context.Context, limit int) ([]Message, error) {
	ms, _, err := l.DeadLettersAfter(ctx, "", limit, Room{})
	return ms, err
}

// DeadLettersAfter returns, in queue order, the dead letters that sort
// after the one named after ("" starts at the oldest): up to limit of
// them (0: no limit), and no more than fit room (the first always does).
// next names the last one looked at when more may follow, for the next
// call's after; it is "" when the list is exhausted. It lists only the
// dead segments from after's on, and reads the page in multiRead requests.
func (l *Leases) DeadLettersAfter(ctx context.Context, after string, limit int, room Room) (ms []Message, next string, err error) {
	var a Name
	if after != "" {
		var ok bool
		if a, ok = ParseName(after); !ok {
			return nil, "", fmt.Errorf("dead letters after %q: malformed name", after)
		}
	}
	want := 0
	if limit > 0 {
		want = limit + 1 // one more tells whether a next page exists
	}
	paths, names, err := l.deadAfter(ctx, a, want)
	if err != nil {
		return nil, "", err
	}
	more := limit > 0 && len(names) > limit
	if more {
		paths, names = paths[:limit], names[:limit]
	}
	rs, err := l.items.reads.readPaths(paths)
	if err != nil {
		return nil, "", err
	}
	used := 0
	for i, r := range rs {
		if r.err != nil {
			continue // redriven meanwhile
		}
		m, err := decodeMessage(names[i], r.data, 0)
		if err != nil {
			continue
		}
		size := m.wireSize() + room.Overhead
		if room.Bytes > 0 && len(ms) > 0 && used+size > room.Bytes {
			return ms, names[i-1].Raw, nil
		}
		used += size
		ms = append(ms, m)
	}
	if more {
		return ms, names[len(names)-1].Raw, nil
	}
	return ms, "", nil
}

// Redrive moves dead letters back into the queue, under their original
// names and with their delivery count reset; a message TTL counts from
// the redrive (Message.Ready). Empty ids means all. Unknown
// ids are skipped. It returns the number moved.
func (l *Leases) Redrive(ctx context.Context, ids []string) (int, error) {
	if len(ids) == 0 {
		_, names, err := l.deadAfter(ctx, Name{}, 0)
		if err != nil {
			return 0, err
		}
		for _, n := range names {
			ids = append(ids, n.Raw)
		}
	}
	var redriven []Name
	defer func() { l.removeEmptyDeadSegments(context.WithoutCancel(ctx), redriven) }()
	moved := 0
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return moved, err
		}
		n, ok := ParseName(id)
		if !ok {
			continue
		}
		deadPath, data, stat, err := l.deadPathOf(n)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return moved, fmt.Errorf("get %s: %w", deadPath, err)
		}
		m, err := decodeMessage(n, data, 0)
		if err != nil {
			return moved, err
		}
		ops, err := l.redriveGroupOps(&m)
		if err != nil {
			return moved, err
		}
		err = requeue(ctx, txn{write: l.items.multi, exists: l.items.zk.Exists}, l.items.path, n, append(append([]any{
			&zk.DeleteRequest{Path: deadPath, Version: stat.Version}}, ops...),
			requeueOp(l.items.path, n, EncodeData(Message{Payload: m.Payload, Attributes: m.Attributes, Published: m.Published, Ready: time.Now()}), l.items.opt.acl)))
		if err != nil {
			if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
				continue
			}
			return moved, fmt.Errorf("redrive %s: %w", id, err)
		}
		l.items.Rescan()
		redriven = append(redriven, n)
		moved++
	}
	return moved, nil
}
