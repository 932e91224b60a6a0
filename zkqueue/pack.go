package zkqueue

import (
	"context"
	"encoding/binary"
	"fmt"
	"path"
	"strconv"
	"strings"
	"sync"

	"github.com/go-zookeeper/zk"
)

// PackLimits bounds a pack (WithPacking): the messages one node holds.
// Zero fields take the defaults.
type PackLimits struct {
	// MaxCount is the most messages in one pack (default 1,000).
	MaxCount int
	// MaxBytes bounds a pack's data (default 256 KiB); a message larger
	// than that is a pack of its own.
	MaxBytes int
}

// Pack limit defaults.
const (
	DefaultPackCount = 1000
	DefaultPackBytes = 16 << 10
	maxPackCount     = 4095 // an index fits 3 hex digits (packName)
)

func (l *PackLimits) validate() error {
	if l.MaxCount == 0 {
		l.MaxCount = DefaultPackCount
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultPackBytes
	}
	if l.MaxCount < 1 || l.MaxCount > maxPackCount {
		return fmt.Errorf("zkqueue: pack count %d out of range [1, %d]", l.MaxCount, maxPackCount)
	}
	if l.MaxBytes < 1 || l.MaxBytes > HardMaxPayload {
		return fmt.Errorf("zkqueue: pack bytes %d out of range [1, %d]", l.MaxBytes, HardMaxPayload)
	}
	return nil
}

// WithPacking makes the queue store many messages per node (pack.go):
// the messages of one publish, and of the publishes a window gathers, go
// into one node.
func WithPacking(l PackLimits) Option { return func(o *options) { o.packing = &l } }

// Packed storage. A queue opened WithPacking stores the plain messages of
// a publish call, and of the calls a window gathers, in one node, a pack:
//
//	<segment>/qn-7-n64-0000000042        a pack of 64 messages
//	<segment>/qn-7-n3-0000000042#5.00512ab  its messages 5, 6 and 9, put back
//	<segment>/qn-7-0000000042#7.007c0ffe    its message 7, put back alone
//
// A pack is one PERSISTENT_SEQUENTIAL create: ZooKeeper spends one node,
// one transaction and one sequence number on all its messages. Its name
// carries its message count ("n<count>-", for Len and for the dispatcher,
// which weighs candidates by it). Message i of pack "qn-7-n64-0000000042"
// (i from 1) has id "qn-7-0000000042#i"; FIFO order is (pack sequence,
// index). A claim takes a whole pack: getData + delete, and at least once
// the create of one lease holding its messages (packlease.go). What a
// claim takes beyond what its caller asked for waits in the Queue's (or
// the Leases') buffer, first in line for the next take (packbuf.go).
//
// Messages that need a node of their own are not packed: a message with a
// dedup id (its record is created with its node), a grouped message (its
// group entry is), a delayed one (it waits in the delayed parent, and is
// moved into the queue alone). Queues with fair dispatch (the key tag is
// in the node's name) or a message TTL (the expiry timer deletes whole
// nodes) are not packed (Spec.Validate).
//
// A pack's data is a list of messages, each in its own encoding
// (EncodeData) without the magic, behind the index it has in the pack:
//
//	magic (0xCB 0x51) | version 3 | uvarint count |
//	count x (uvarint index | uvarint length | message data from its version byte)
const versionPack = 3

// packEntry is one message of a pack: its index in the pack and its data
// (EncodeData).
type packEntry struct {
	index int
	data  []byte
}

// isPack reports whether node data is a pack.
func isPack(data []byte) bool {
	return len(data) >= 3 && data[0] == magic[0] && data[1] == magic[1] && data[2] == versionPack
}

// encodePack returns the data of a pack holding entries.
func encodePack(entries []packEntry) []byte {
	n := 3 + binary.MaxVarintLen32
	for _, e := range entries {
		n += 2*binary.MaxVarintLen32 + len(e.data)
	}
	b := make([]byte, 0, n)
	b = append(b, magic[0], magic[1], versionPack)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for _, e := range entries {
		d := e.data[len(magic):] // every entry has it: not stored
		b = binary.AppendUvarint(b, uint64(e.index))
		b = binary.AppendUvarint(b, uint64(len(d)))
		b = append(b, d...)
	}
	return b
}

// decodePack parses pack data.
func decodePack(data []byte) ([]packEntry, error) {
	if !isPack(data) {
		return nil, errBadHeader
	}
	r := varintReader{b: data[3:]}
	count := r.count()
	entries := make([]packEntry, 0, count)
	for range count {
		index, l := r.index(), r.uvarint()
		body := r.bytes(l)
		if r.bad {
			return nil, errBadHeader
		}
		d := make([]byte, 0, len(magic)+len(body))
		entries = append(entries, packEntry{index: index, data: append(append(d, magic[:]...), body...)})
	}
	if r.bad || count == 0 || len(r.b) != 0 {
		return nil, errBadHeader
	}
	return entries, nil
}

// varintReader reads the varints of a pack's and a pack lease's data;
// bad is set, and every later read returns zero, once one fails.
type varintReader struct {
	b   []byte
	bad bool
}

func (r *varintReader) uvarint() uint64 {
	x, k := binary.Uvarint(r.b)
	if r.bad || k <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[k:]
	return x
}

func (r *varintReader) varint() int64 {
	x, k := binary.Varint(r.b)
	if r.bad || k <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[k:]
	return x
}

// count reads a count of pack entries, at most maxPackCount.
func (r *varintReader) count() int {
	n := r.uvarint()
	if n > maxPackCount {
		r.bad = true
		return 0
	}
	return int(n)
}

// index reads a message's index in its pack, in [1, maxPackCount].
func (r *varintReader) index() int {
	i := r.uvarint()
	if i < 1 || i > maxPackCount {
		r.bad = true
		return 0
	}
	return int(i)
}

func (r *varintReader) bytes(n uint64) []byte {
	if r.bad || n > uint64(len(r.b)) {
		r.bad = true
		return nil
	}
	b := r.b[:n]
	r.b = r.b[n:]
	return b
}

// stem is a pack's name without its count, index and incarnation: the
// prefix its messages' ids share ("qn-7-0000000042").
func stem(n Name) string {
	s := n.Base
	if i := strings.IndexByte(s, '#'); i >= 0 {
		s = s[:i]
	}
	if n.Count > 0 {
		c := "n" + strconv.Itoa(n.Count) + "-"
		if i := strings.Index(s, c); i >= 0 {
			s = s[:i] + s[i+len(c):]
		}
	}
	return s
}

// memberID is the id of message index of pack n.
func memberID(n Name, index int) string { return stem(n) + "#" + strconv.Itoa(index) }

// memberName is the name of message index of pack n as a node of its own
// (put back alone, or a dead letter), before its incarnation.
func memberName(n Name, index int) Name {
	m, _ := ParseName(memberID(n, index))
	return m
}

// putBackName names a node holding entries (in index order) of pack n
// put back: the lone message's own name, or a pack of the part; a fresh
// incarnation either way, so a stale read of an earlier node cannot
// claim it.
func putBackName(n Name, entries []packEntry) Name {
	first := entries[0].index
	var raw string
	switch {
	case len(entries) == 1 && first == 0:
		raw = stem(n) // a message published alone
	case len(entries) == 1:
		raw = memberID(n, first)
	default:
		s := stem(n)
		i := strings.LastIndexByte(s, '-') // before the sequence
		raw = s[:i+1] + "n" + strconv.Itoa(len(entries)) + "-" + s[i+1:] + "#" + strconv.Itoa(first)
	}
	base, _ := ParseName(raw)
	out, _ := ParseName(newIncarnation(base))
	return out
}

// putBackData is the data of the node putBackName names: the lone
// message's own encoding, or a pack.
func putBackData(entries []packEntry) []byte {
	if len(entries) == 1 {
		return entries[0].data
	}
	return encodePack(entries)
}

// decodeNode decodes the messages of node n: the messages of a pack, or
// the one message of any other node, with addDeliveries added to their
// delivery counts; for a pack also its entries (their data with the counts
// raised).
func decodeNode(n Name, data []byte, addDeliveries int) ([]Message, []packEntry, error) {
	if !isPack(data) {
		m, err := decodeMessage(n, data, addDeliveries)
		if err != nil {
			return nil, nil, err
		}
		return []Message{m}, nil, nil
	}
	entries, err := decodePack(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", n.Raw, ErrBadData)
	}
	ms := make([]Message, len(entries))
	for i, e := range entries {
		m, err := DecodeData(e.data)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", n.Raw, ErrBadData)
		}
		m.ID, m.Priority = memberID(n, e.index), n.Priority
		m.Deliveries += addDeliveries
		ms[i] = m
		if addDeliveries != 0 {
			entries[i].data = EncodeData(m)
		}
	}
	return ms, entries, nil
}

// minClaim is the least a packed queue's claim takes (packbuf.go).
func minClaim(o options) int {
	if o.priorities {
		return 0
	}
	return minClaimAhead
}

// weight is the number of messages node n holds, by its name.
func weight(n Name) int { return max(n.Count, 1) }

// packer gathers the plain publishes of a packed queue into packs, per
// level: up to packWriters transactions of a level are written at once,
// and a publish arriving while they all are joins the round waiting for
// the next writer, which writes it once one is free. An idle queue's
// publish is a round of its own, written at once: a pack of one. A round
// never holds more than a pack's limits, unless one publish alone does (it
// is then written as several packs, in one transaction).
type packer struct {
	p      *producer
	limits PackLimits
	mu     sync.Mutex
	levels map[int]*packLevel
}

// packWriters bounds the pack transactions of a level under way at once
// (as the Committer pipelines its Multis).
const packWriters = 4

// packLevel is a level's rounds: those writing, and those waiting.
type packLevel struct {
	writing int
	waiting []*packRound
}

// packRound is one transaction of a level's publishes.
type packRound struct {
	turn   chan struct{} // closed when a writer is free for it
	done   chan struct{}
	datas  [][]byte // the messages' data, in order
	bytes  int
	paths  []string // the packs created, in order
	counts []int    // messages per pack
	err    error
}

// publish publishes the checked plain drafts of one level, all in one
// transaction, and returns their ids.
func (k *packer) publish(ctx context.Context, level int, datas [][]byte) ([]string, error) {
	size := 0
	for _, d := range datas {
		size += len(d)
	}
	k.mu.Lock()
	lv := k.levels[level]
	if lv == nil {
		lv = &packLevel{}
		k.levels[level] = lv
	}
	var r *packRound
	offset, lead := 0, false
	if n := len(lv.waiting); n > 0 && len(lv.waiting[n-1].datas)+len(datas) <= k.limits.MaxCount &&
		lv.waiting[n-1].bytes+size <= k.limits.MaxBytes {
		r = lv.waiting[n-1]
		offset = len(r.datas)
	} else {
		r = &packRound{turn: make(chan struct{}), done: make(chan struct{})}
		if lv.writing < packWriters {
			lv.writing++
			close(r.turn)
		} else {
			lv.waiting = append(lv.waiting, r)
		}
		lead = true
	}
	r.datas = append(r.datas, datas...)
	r.bytes += size
	k.mu.Unlock()
	if lead {
		// A round's writer does not give up: the publishes that joined
		// it wait for its answer.
		<-r.turn
		k.mu.Lock()
		datas := r.datas // closed to joins: it left the waiting list
		k.mu.Unlock()
		r.paths, r.counts, r.err = k.write(context.WithoutCancel(ctx), level, datas)
		close(r.done)
		k.mu.Lock()
		if len(lv.waiting) > 0 {
			next := lv.waiting[0]
			lv.waiting = lv.waiting[1:]
			close(next.turn) // this writer's slot passes to it
		} else if lv.writing--; lv.writing == 0 {
			delete(k.levels, level)
		}
		k.mu.Unlock()
	} else {
		select {
		case <-r.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return r.ids(offset, len(datas)), nil
}

// ids returns the ids of the count messages from offset of the round.
func (r *packRound) ids(offset, count int) []string {
	out := make([]string, 0, count)
	i := 0 // the round's message index at the start of pack p
	for p, c := range r.counts {
		n, _ := ParseName(path.Base(r.paths[p]))
		for j := range c {
			if i+j >= offset && i+j < offset+count {
				out = append(out, memberID(n, j+1))
			}
		}
		i += c
	}
	return out
}

// write creates datas as packs within the limits, in one transaction.
func (k *packer) write(ctx context.Context, level int, datas [][]byte) (paths []string, counts []int, err error) {
	r := appendReq{}
	for start := 0; start < len(datas); {
		end, bytes := start, 0
		for end < len(datas) && end-start < k.limits.MaxCount && (end == start || bytes+len(datas[end]) <= k.limits.MaxBytes) {
			bytes += len(datas[end])
			end++
		}
		entries := make([]packEntry, end-start)
		for i := range entries {
			entries[i] = packEntry{index: i + 1, data: datas[start+i]}
		}
		r.levels = append(r.levels, level)
		r.datas = append(r.datas, encodePack(entries))
		r.counts = append(r.counts, end-start)
		start = end
	}
	_, paths, err = k.p.appendWith(ctx, r)
	if err != nil {
		return nil, nil, err
	}
	if h := k.p.opt.packHook; h != nil {
		for _, c := range r.counts {
			h(c)
		}
	}
	return paths, r.counts, nil
}

// putBackMessages re-creates messages claimed at most once and never
// handed out, each group of one pack as one node at its place, with the
// delivery counts they had before the claim.
func putBackMessages(ctx context.Context, c *core, ms []Message) error {
	var first error
	for len(ms) > 0 {
		n, ok := ParseName(ms[0].ID)
		if !ok {
			ms = ms[1:]
			continue
		}
		var entries []packEntry
		for len(ms) > 0 {
			m, ok := ParseName(ms[0].ID)
			if !ok || stem(m) != stem(n) {
				break
			}
			mm := ms[0]
			mm.Deliveries = max(mm.Deliveries-1, 0)
			entries = append(entries, packEntry{index: m.Index, data: EncodeData(mm)})
			ms = ms[1:]
		}
		at := putBackName(n, entries)
		create := &zk.CreateRequest{Path: itemPath(c.path, at), Data: putBackData(entries), Acl: c.opt.acl}
		if err := requeue(ctx, txn{write: c.write, exists: c.zk.Exists}, c.path, at, []any{create}); err != nil && first == nil {
			first = fmt.Errorf("put back %s: %w", at.Raw, err)
		}
	}
	return first
}
