package zkqueue

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
)

// Node names. ZooKeeper appends a 10-digit signed sequence number to the
// prefix of a PERSISTENT_SEQUENTIAL node. A message of segment k is created
// with the prefix "qn-<k>-" ("p007-<k>-" at priority 7), so its name,
// "qn-12-0000000042", is unique in the queue and names its segment
// (segments.go). Messages of the single-parent layout written before
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
	Seq      int32  // the sequence suffix
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
	n, ok = parseBase(base)
	n.Raw = s
	return n, ok
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

// Compare orders names by (priority, segment, sequence), numerically.
func Compare(a, b Name) int {
	if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Seg, b.Seg); c != 0 {
		return c
	}
	return cmp.Compare(a.Seq, b.Seq)
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
