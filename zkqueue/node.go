package zkqueue

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-zookeeper/zk"
)

// Node names. ZooKeeper appends a 10-digit signed sequence number to the
// prefix of a PERSISTENT_SEQUENTIAL node. A message of segment k is created
// with the prefix "qn-<k>-" ("p007-<k>-" at priority 7), so its name,
// "qn-12-0000000042", is unique in the queue and names its segment
// (see Segments below). Messages of the single-parent layout written before
// segments, "qn-0000000042", belong to the legacy segment, which sorts
// first. The sequence suffix is parsed as a signed 32-bit integer (the
// legacy counter could wrap to "-2147483648") and names are compared
// numerically.
//
// A queue whose publishes name their process (WithPublisher) writes a
// publisher tag between segment and sequence, "qn-12-3fa0-0000000042": 4
// hex digits of a hash of the process id (PublisherTag). The processes
// consuming the queue give a message of one of them to that process first
// (splitShare in dispatch.go), which remembers its data from publishing
// it and so claims it without reading it back.
//
// A queue with fair dispatch (WithFairness) writes its message's key tag
// after that, "qn-12-3fa0-k1b2c3d4e-0000000042": "k" and 8 hex digits of
// a hash of the key (KeyTag), which the dispatcher reads to serve the keys
// in turn (fairness.go).
const (
	// FIFOPrefix prefixes the messages of a FIFO queue.
	FIFOPrefix = "qn-"
	// MaxPriority is the largest (least urgent) priority; 0 is the most
	// urgent.
	MaxPriority = 255
)

// PriorityPrefix returns the name prefix of a message with priority p:
// "p007-". The fixed width keeps names readable in zkCli listings; order
// never depends on string comparison.
func PriorityPrefix(p int) string { return fmt.Sprintf("p%03d-", p) }

// Name is a parsed message node name.
//
// A message released for redelivery is recreated under its original name
// plus an incarnation suffix, ".<8 hex digits>": it keeps its place in the
// order, and a consumer holding a stale read of an earlier incarnation
// cannot claim the new one (ZooKeeper's version check alone would let it:
// a recreated node starts at version 0 again).
type Name struct {
	Raw      string // the node name as stored
	Base     string // Raw without the incarnation suffix: the message id
	Priority int    // 0 for FIFO messages
	Seg      int64  // the segment's number; 0 for the legacy segment
	Tag      string // the publisher tag; "" when the name has none
	Key      string // the key tag (fairness.go); "" when the name has none
	Seq      int32  // the sequence suffix
	// Count is the number of messages of a pack node (pack.go), from its
	// name's "n<count>-"; 0 for a node of one message.
	Count int
	// Index places a node in its pack's order: a message released from
	// a pack ("qn-12-0000000042#3": the pack's third message) or the
	// part of a pack put back ("qn-12-n5-0000000042#3": five messages,
	// the first of them the third); 0 for a node published as it is.
	Index int
}

// tagLen is the length of a publisher tag: hex digits.
const tagLen = 4

// PublisherTag returns the tag that the messages published by process
// processID carry in their names: 4 hex digits of its FNV-1a hash. Two
// processes may share a tag; their messages then belong to no one in
// particular (splitShare).
func PublisherTag(processID string) string {
	h := fnv.New32a()
	h.Write([]byte(processID))
	x := h.Sum32()
	return fmt.Sprintf("%04x", (x>>16^x)&0xffff)
}

// IncarnationLen is the length of the ".<hex>" incarnation suffix.
const IncarnationLen = 9

// ParseName parses "qn-<seg>-<seq>" and "pNNN-<seg>-<seq>", with or without
// a publisher tag before the sequence ("qn-<seg>-<tag>-<seq>") (and the legacy
// "qn-<seq>" and "pNNN-<seq>"), each optionally followed by an incarnation
// suffix. ok is false for any other name (foreign nodes,
// which queues skip).
func ParseName(s string) (n Name, ok bool) {
	base := s
	if i := strings.IndexByte(s, '.'); i >= 0 {
		if len(s)-i != IncarnationLen || !isHex(s[i+1:]) {
			return Name{}, false
		}
		base = s[:i]
	}
	index := 0
	if i := strings.IndexByte(base, '#'); i >= 0 {
		x, err := strconv.Atoi(base[i+1:])
		if err != nil || x < 1 || x > maxPackCount || strconv.Itoa(x) != base[i+1:] {
			return Name{}, false
		}
		index, base = x, base[:i]
	}
	n, ok = parseBase(base)
	if !ok {
		return Name{}, false
	}
	n.Raw, n.Index = s, index
	if index > 0 {
		n.Base = s[:len(base)+1+len(strconv.Itoa(index))]
	}
	return n, true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func parseBase(s string) (n Name, ok bool) {
	var rest string
	switch {
	case strings.HasPrefix(s, FIFOPrefix):
		rest = s[len(FIFOPrefix):]
	case len(s) > 5 && s[0] == 'p' && s[4] == '-':
		p, err := strconv.Atoi(s[1:4])
		if err != nil || p < 0 || p > MaxPriority || s[1] == '+' || s[1] == '-' {
			return Name{}, false
		}
		n.Priority, rest = p, s[5:]
	default:
		return Name{}, false
	}
	if i := strings.IndexByte(rest, '-'); i > 0 {
		seg, ok := parseSegNumber(rest[:i])
		if !ok || rest[i+1:] == "" || rest[i+1] == '-' {
			return Name{}, false
		}
		n.Seg, rest = seg, rest[i+1:]
		if len(rest) > tagLen && rest[tagLen] == '-' && isHex(rest[:tagLen]) {
			n.Tag, rest = rest[:tagLen], rest[tagLen+1:]
			if rest == "" || rest[0] == '-' {
				return Name{}, false
			}
		}
		if c, r, ok := parseCount(rest); ok {
			n.Count, rest = c, r
		}
		if len(rest) > keyTagLen+1 && rest[0] == 'k' && rest[keyTagLen+1] == '-' && isHex(rest[1:keyTagLen+1]) {
			n.Key, rest = rest[1:keyTagLen+1], rest[keyTagLen+2:]
			if rest == "" || rest[0] == '-' {
				return Name{}, false
			}
		}
	}
	// ZooKeeper writes %010d: at least 10 characters, a sign only when
	// negative.
	if len(rest) < 10 || rest[0] == '+' {
		return Name{}, false
	}
	seq, err := strconv.ParseInt(rest, 10, 32)
	if err != nil {
		return Name{}, false
	}
	n.Base, n.Seq = s, int32(seq)
	return n, true
}

// parseCount parses a pack's "n<count>-" at the start of rest.
func parseCount(rest string) (count int, after string, ok bool) {
	if len(rest) < 3 || rest[0] != 'n' {
		return 0, rest, false
	}
	i := strings.IndexByte(rest, '-')
	if i < 2 {
		return 0, rest, false
	}
	c, err := strconv.Atoi(rest[1:i])
	if err != nil || c < 1 || c > maxPackCount || strconv.Itoa(c) != rest[1:i] || rest[i+1:] == "" || rest[i+1] == '-' {
		return 0, rest, false
	}
	return c, rest[i+1:], true
}

// parseSegNumber parses a segment number written in a message name: decimal
// digits without sign or leading zeros, at least 1.
func parseSegNumber(s string) (int64, bool) {
	if s == "" || s[0] < '1' || s[0] > '9' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	k, err := strconv.ParseInt(s, 10, 64)
	return k, err == nil
}

// Compare orders names by (priority, segment, sequence, index in the
// pack), numerically.
func Compare(a, b Name) int {
	if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Seg, b.Seg); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Seq, b.Seq); c != 0 {
		return c
	}
	return cmp.Compare(a.Index, b.Index)
}

// SortNames parses children, drops the names that do not parse (returned as
// foreign) and returns the rest in delivery order.
func SortNames(children []string) (names []Name, foreign []string) {
	names = make([]Name, 0, len(children))
	for _, c := range children {
		if n, ok := ParseName(c); ok {
			names = append(names, n)
		} else {
			foreign = append(foreign, c)
		}
	}
	slices.SortFunc(names, Compare)
	return names, foreign
}

// ownTag reports whether n carries publisher's tag (WithPublisher).
func ownTag(n Name, publisher string) bool {
	return n.Tag != "" && n.Tag == publisher
}

// Segments. A queue's messages live in a chain of segments per priority
// level (one chain in a FIFO queue), each a child of the queue's parent
// node holding up to about SegmentSize messages:
//
//	<path>/s0000000000000000007/qn-7-0000000042         FIFO, segment 7
//	<path>/p003-s0000000000000000002/p003-2-0000000005  priority 3, segment 2
//
// A segment node's name carries its number zero-padded to 19 digits, so
// string order and numeric order agree; a message name carries its
// segment's number, so a message id alone names its segment (a lease, a
// dead letter and a redelivery need nothing else). A segment node's
// version tells its state: 0 while it is its chain's tail (producers
// append to it), 1 or more once sealed (segmentSealed). Sealing a segment
// and creating its successor is one transaction (producer.go), so a sealed
// segment always has a later one in its chain, and the tail is the one
// unsealed segment, the last.
//
// Messages of the single-parent layout (children of <path> named
// qn-<seq>) form the legacy segment of their level, number 0, which sorts
// first: they are consumed in place, before the level's segments.

// DefaultSegmentSize is the number of messages after which a segment is
// sealed and its successor started (see WithSegmentSize).
//
// Measured on 2 cores, one ZooKeeper 3.8, 100-byte messages, draining
// 40,000 with 16 consumers on one Queue (BenchmarkSegmentSize):
//
//	S        listing of a full segment   FIFO claims/s   priority claims/s
//	1,000     19 KiB   0.3-1.5 ms        2,300           3,200
//	5,000     93 KiB   1.2-1.8 ms        2,460           2,480
//	20,000   371 KiB   5.4 ms            2,560           1,690
//	50,000   742 KiB  16 ms              3,200           1,120
//
// A FIFO consumer lists a segment once per pass, so its claim rate does
// not depend on S (the spread is noise); a priority consumer lists its
// head at every change, so its rate falls as S grows. Small segments roll
// often instead: every roll fails the publishes in flight once (they are
// retried in the successor) and makes every consumer list the parent
// again. 10,000 keeps a listing near 190 KiB and 3 ms, far below the 1 MiB
// packet limit even with the transactions in flight at a seal, and a roll
// at most every 10,000 publishes (a few per second at the broker's top
// publish rate).
const DefaultSegmentSize = 10_000

// segDigits is the zero-padded width of a segment number in its node name.
const segDigits = 19

// sealedData marks a sealed segment for people reading a listing; the
// node's version is what tells (segmentSealed).
var sealedData = []byte("sealed")

// segment identifies one segment: its level (priority; 0 in a FIFO queue)
// and its number, 0 for the legacy segment.
type segment struct {
	level int
	k     int64
}

func compareSegments(a, b segment) int {
	switch {
	case a.level != b.level:
		return a.level - b.level
	case a.k < b.k:
		return -1
	case a.k > b.k:
		return 1
	}
	return 0
}

// segmentName is the node name of segment sg of a priority queue (prio)
// or a FIFO queue.
func segmentName(prio bool, sg segment) string {
	// Built without fmt: every claim computes its message's path.
	b := make([]byte, 0, 5+1+segDigits)
	if prio {
		b = appendPadded(append(b, 'p'), int64(sg.level), 3)
		b = append(b, '-')
	}
	return string(appendPadded(append(b, 's'), sg.k, segDigits))
}

// appendPadded appends v >= 0 in decimal, zero-padded to width digits.
func appendPadded(b []byte, v int64, width int) []byte {
	var digits [20]byte
	d := strconv.AppendInt(digits[:0], v, 10)
	for range width - len(d) {
		b = append(b, '0')
	}
	return append(b, d...)
}

// parseSegment parses a segment node name; prio tells which kind of
// queue it belongs to.
func parseSegment(name string) (sg segment, prio bool, ok bool) {
	rest := name
	if len(name) > 5 && name[0] == 'p' && name[4] == '-' {
		l, err := strconv.Atoi(name[1:4])
		if err != nil || l < 0 || l > MaxPriority || name[1] < '0' || name[1] > '9' {
			return segment{}, false, false
		}
		sg.level, prio, rest = l, true, name[5:]
	}
	if len(rest) != 1+segDigits || rest[0] != 's' {
		return segment{}, false, false
	}
	for i := 1; i < len(rest); i++ {
		if rest[i] < '0' || rest[i] > '9' {
			return segment{}, false, false
		}
	}
	k, err := strconv.ParseInt(rest[1:], 10, 64)
	if err != nil || k < 1 {
		return segment{}, false, false
	}
	sg.k = k
	return sg, prio, true
}

// messagePrefix is the name prefix of a message created in sg by the
// publisher tag, with the key tag (fairness.go; each none when "");
// ZooKeeper appends the sequence number.
func messagePrefix(prio bool, sg segment, tag, key string) string {
	p := FIFOPrefix
	if prio {
		p = PriorityPrefix(sg.level)
	}
	p += strconv.FormatInt(sg.k, 10) + "-"
	if tag != "" {
		p += tag + "-"
	}
	if key != "" {
		p += "k" + key + "-"
	}
	return p
}

// segmentOf returns the segment of message n and whether its queue is a
// priority queue (from its name's prefix).
func segmentOf(n Name) (segment, bool) {
	return segment{n.Priority, n.Seg}, !strings.HasPrefix(n.Raw, FIFOPrefix)
}

// segmentPath is the node of sg under the items parent; the legacy
// segment is the parent itself.
func segmentPath(items string, prio bool, sg segment) string {
	if sg.k == 0 {
		return items
	}
	return items + "/" + segmentName(prio, sg)
}

// itemPath is the node of message n under the items parent.
func itemPath(items string, n Name) string {
	sg, prio := segmentOf(n)
	return segmentPath(items, prio, sg) + "/" + n.Raw
}

func segmentSealed(stat *zk.Stat) bool { return stat.Version > 0 }

// createSegmentOp creates an empty, unsealed segment node.
func createSegmentOp(p string, acl []zk.ACL) *zk.CreateRequest {
	return &zk.CreateRequest{Path: p, Acl: acl}
}

// writeFunc runs ops as one transaction (a Queue's or a LeaseSweeper's
// write).
type writeFunc func(ctx context.Context, ops ...any) ([]zk.MultiResponse, error)

// requeue runs ops, which end with create, the creation of a message in
// its segment (a redelivery or a redrive): when the segment was removed
// once drained, it is re-created, sealed, in the same transaction. A
// re-created segment sorts before its chain's tail, so its message is
// consumed before newer ones; consumers notice it by their watch on the
// items parent.
func requeue(ctx context.Context, tx txn, items string, n Name, ops []any) error {
	write, exists := tx.write, tx.exists
	sg, prio := segmentOf(n)
	if sg.k == 0 {
		_, err := write(ctx, ops...)
		return err
	}
	segPath := segmentPath(items, prio, sg)
	segSeen := false // the segment existed after a NoNode
	for attempt := 0; ; attempt++ {
		_, err := write(ctx, ops...)
		if !errors.Is(err, zk.ErrNoNode) || attempt >= 4 {
			return err
		}
		// The lease (or dead letter) may be the missing node, or the
		// segment: only the latter is ours to fix. A segment found
		// after the failure may have been re-created since by another
		// redelivery: the plain transaction is tried once more, and a
		// NoNode then is the lease's.
		ok, _, xerr := exists(segPath)
		if xerr != nil {
			return xerr
		}
		if ok {
			if segSeen {
				return err
			}
			segSeen = true
			continue
		}
		recreate := append([]any{},
			ops[:len(ops)-1]...)
		create := ops[len(ops)-1].(*zk.CreateRequest)
		recreate = append(recreate, createSegmentOp(segPath, create.Acl),
			&zk.SetDataRequest{Path: segPath, Data: sealedData, Version: 0}, create)
		_, err = write(ctx, recreate...)
		if !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
		// Re-created meanwhile by someone else: the plain create again.
	}
}

// Encodings.
//
// A message node's data is a small header and the payload; a lease
// node's, its deadline and the message.

// Message is one delivered (or peeked) message.
type Message struct {
	// ID is the message's node name, unique within its queue for the
	// queue's lifetime ("qn-0000000042", "p007-0000000042").
	ID string
	// Payload is the message body as published.
	Payload []byte
	// Priority is 0 for FIFO messages.
	Priority int
	// Published is when the message was first published.
	Published time.Time
	// Deliveries counts the claims of the message, this one included. It
	// is 1 on the first delivery and grows on every redelivery in
	// acknowledged mode.
	Deliveries int
	// Attributes are the metadata published with the message.
	Attributes
	// Ready is when the message last became ready, if not at its publish:
	// when it was due (a delayed message) or redriven. A queue's message
	// TTL counts from it (see ttl.go); zero: from Published.
	Ready time.Time
}

// Attributes are a message's optional metadata, stored in its node beside
// the payload and delivered with it.
type Attributes struct {
	// ContentType describes the payload ("application/json"); free-form.
	ContentType string
	// Headers are string key/value pairs.
	Headers map[string]string
	// Group, when set, puts the message in a message group (groups.go):
	// the messages of one group are delivered in publish order, one at
	// a time. See CheckGroup for its charset.
	Group string
	// groupEntry names the message's entry in its group: the token
	// chosen at publish, or the entry's node name once claimed.
	groupEntry string
}

// Bounds on Attributes, checked by Validate. They keep a message's
// metadata small next to the node size limit; the bytes count against the
// payload limit too (see Queue.CheckMessage).
const (
	MaxHeaders        = 64
	MaxHeaderKey      = 256
	MaxAttributeBytes = 16 << 10
)

// ErrBadAttributes is returned for attributes outside the bounds above or
// not valid UTF-8.
var ErrBadAttributes = errors.New("bad message attributes")

// Validate checks a's bounds: at most MaxHeaders headers, non-empty keys
// of at most MaxHeaderKey bytes, everything valid UTF-8, and at most
// MaxAttributeBytes encoded.
func (a Attributes) Validate() error {
	if len(a.Headers) > MaxHeaders {
		return fmt.Errorf("%w: %d headers > %d", ErrBadAttributes, len(a.Headers), MaxHeaders)
	}
	if !utf8.ValidString(a.ContentType) {
		return fmt.Errorf("%w: content type is not UTF-8", ErrBadAttributes)
	}
	for k, v := range a.Headers {
		switch {
		case k == "":
			return fmt.Errorf("%w: empty header key", ErrBadAttributes)
		case len(k) > MaxHeaderKey:
			return fmt.Errorf("%w: header key %.32q... is %d bytes > %d", ErrBadAttributes, k, len(k), MaxHeaderKey)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return fmt.Errorf("%w: header %.32q is not UTF-8", ErrBadAttributes, k)
		}
	}
	if a.Group != "" {
		if err := CheckGroup(a.Group); err != nil {
			return err
		}
	}
	if n := a.Size(); n > MaxAttributeBytes {
		return fmt.Errorf("%w: %d bytes > %d", ErrBadAttributes, n, MaxAttributeBytes)
	}
	return nil
}

// Size is the number of bytes a adds to a message node.
func (a Attributes) Size() int {
	if a.empty() {
		return 0
	}
	return len(a.appendTo(nil))
}

// wireSize is what m counts against a Room: its payload and attributes.
func (m *Message) wireSize() int { return len(m.Payload) + m.Attributes.Size() }

func (a Attributes) empty() bool {
	return a.ContentType == "" && len(a.Headers) == 0 && a.Group == "" && a.groupEntry == ""
}

// Attribute tags. A decoder skips tags it does not know, so a newer broker
// may add some without breaking an older one.
const (
	tagContentType = 1
	tagHeader      = 2
	tagGroup       = 5 // Attributes.Group
	tagGroupEntry  = 6 // Attributes.groupEntry
)

// appendTo appends a's encoding: a sequence of tag byte, uvarint length,
// value. A header's value is uvarint key length, key, value. Headers are
// written in key order so equal attributes encode equally.
func (a Attributes) appendTo(b []byte) []byte {
	if a.ContentType != "" {
		b = appendField(b, tagContentType, nil, a.ContentType)
	}
	keys := make([]string, 0, len(a.Headers))
	for k := range a.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b = appendField(b, tagHeader, []byte(k), a.Headers[k])
	}
	if a.Group != "" {
		b = appendField(b, tagGroup, nil, a.Group)
	}
	if a.groupEntry != "" {
		b = appendField(b, tagGroupEntry, nil, a.groupEntry)
	}
	return b
}

func appendField(b []byte, tag byte, key []byte, value string) []byte {
	b = append(b, tag)
	n := len(value)
	if key != nil {
		n += uvarintLen(uint64(len(key))) + len(key)
	}
	b = binary.AppendUvarint(b, uint64(n))
	if key != nil {
		b = binary.AppendUvarint(b, uint64(len(key)))
		b = append(b, key...)
	}
	return append(b, value...)
}

func uvarintLen(x uint64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutUvarint(buf[:], x)
}

func decodeAttributes(b []byte) (Attributes, error) {
	var a Attributes
	for len(b) > 0 {
		tag := b[0]
		n, k := binary.Uvarint(b[1:])
		if k <= 0 || n > uint64(len(b)-1-k) {
			return Attributes{}, errBadHeader
		}
		field := b[1+k : 1+k+int(n)]
		b = b[1+k+int(n):]
		switch tag {
		case tagContentType:
			a.ContentType = string(field)
		case tagHeader:
			kl, k := binary.Uvarint(field)
			if k <= 0 || kl > uint64(len(field)-k) {
				return Attributes{}, errBadHeader
			}
			if a.Headers == nil {
				a.Headers = make(map[string]string)
			}
			a.Headers[string(field[k:k+int(kl)])] = string(field[k+int(kl):])
		case tagGroup:
			a.Group = string(field)
		case tagGroupEntry:
			a.groupEntry = string(field)
		}
	}
	return a, nil
}

// A message node's data is a small header followed by the payload:
//
//	magic (2 bytes: 0xCB 0x51) | version (1 byte: 1 or 2)
//	uvarint deliveries so far | varint published time (Unix ns)
//	version 2 only: uvarint attributes length | attributes
//	payload
//
// A message without attributes is written as version 1, so plain messages
// cost nothing extra. Data without the magic is not a message: anything
// may have written it (a client of another recipe, or one that should not
// have), so it is refused rather than delivered as a bare payload.
var magic = [2]byte{0xCB, 0x51}

const (
	version1 = 1 // no attributes
	version2 = 2 // attributes before the payload
)

// HeaderMax is the largest header EncodeData writes for a message without
// attributes; attributes add Attributes.Size plus a uvarint.
const HeaderMax = 3 + binary.MaxVarintLen64*2

// EncodeData returns the node data for a message: m's payload, attributes,
// publish time and deliveries (ID and Priority are in the node's name).
func EncodeData(m Message) []byte {
	b := make([]byte, 0, HeaderMax+len(m.Payload))
	version := byte(version1)
	if !m.Attributes.empty() || !m.Ready.IsZero() {
		version = version2
	}
	b = append(b, magic[0], magic[1], version)
	b = binary.AppendUvarint(b, uint64(m.Deliveries))
	b = binary.AppendVarint(b, m.Published.UnixNano())
	if version == version2 {
		attrs := appendReady(m.Attributes.appendTo(nil), m.Ready)
		b = binary.AppendUvarint(b, uint64(len(attrs)))
		b = append(b, attrs...)
	}
	return append(b, m.Payload...)
}

var errBadHeader = errors.New("bad message header")

// DecodeData parses node data written by EncodeData into a Message
// without ID and Priority. Data without the header, with a header of
// another version or a truncated one is refused (errBadHeader).
func DecodeData(data []byte) (Message, error) {
	if len(data) < 3 || data[0] != magic[0] || data[1] != magic[1] || (data[2] != version1 && data[2] != version2) {
		return Message{}, errBadHeader
	}
	version, rest := data[2], data[3:]
	d, n := binary.Uvarint(rest)
	if n <= 0 || d > math.MaxInt32 {
		return Message{}, errBadHeader
	}
	rest = rest[n:]
	p, n := binary.Varint(rest)
	if n <= 0 {
		return Message{}, errBadHeader
	}
	rest = rest[n:]
	m := Message{Published: time.Unix(0, p), Deliveries: int(d)}
	if version == version2 {
		l, n := binary.Uvarint(rest)
		if n <= 0 || l > uint64(len(rest)-n) {
			return Message{}, errBadHeader
		}
		a, err := decodeAttributes(rest[n : n+int(l)])
		if err != nil {
			return Message{}, err
		}
		ready, err := decodeReady(rest[n : n+int(l)])
		if err != nil {
			return Message{}, err
		}
		m.Attributes, m.Ready, rest = a, ready, rest[n+int(l):]
	}
	m.Payload = rest
	return m, nil
}

// decodeMessage decodes the data of message node n, its id and priority
// from the name, with addDeliveries added to its delivery count (1 for a
// claim).
func decodeMessage(n Name, data []byte, addDeliveries int) (Message, error) {
	m, err := DecodeData(data)
	if err != nil {
		return Message{}, fmt.Errorf("%s: %w", n.Raw, ErrBadData)
	}
	m.ID, m.Priority = n.Base, n.Priority
	m.Deliveries += addDeliveries
	return m, nil
}
