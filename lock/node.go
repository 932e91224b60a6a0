package lock

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/qbroker/qbroker/internal/holding"
)

// Node kinds, the first element of a lock node's name. A Mutex's "lock"
// nodes and an RWMutex's "write" nodes are exclusive; "read" nodes are
// shared with each other.
const (
	kindLock  = "lock"
	kindRead  = "read"
	kindWrite = "write"
)

// nonceLen is the length of the random hex element of a node's name, a
// new one for every attempt (holding.NewNonce).
const nonceLen = holding.NonceLen

// node is a parsed lock node name: <kind>-<nonce>-<sequence>.
type node struct {
	name  string
	kind  string
	nonce string
	seq   int32
}

func (n node) exclusive() bool { return n.kind != kindRead }

// namePrefix is what a create of kind with nonce names, before
// ZooKeeper's sequence suffix.
func namePrefix(kind, nonce string) string { return kind + "-" + nonce + "-" }

// parseNode parses a lock node's name: a kind, a nonce of 16 lower-case
// hex digits, and ZooKeeper's sequence suffix (%010d; a minus sign after
// the counter wrapped) parsed as a number, never compared as a string.
// Other names are not lock nodes.
func parseNode(name string) (node, bool) {
	kind, rest, ok := strings.Cut(name, "-")
	if !ok || (kind != kindLock && kind != kindRead && kind != kindWrite) {
		return node{}, false
	}
	if len(rest) < nonceLen+1 || rest[nonceLen] != '-' {
		return node{}, false
	}
	nonce, seq := rest[:nonceLen], rest[nonceLen+1:]
	for _, c := range nonce {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return node{}, false
		}
	}
	if len(seq) < 10 || seq[0] == '+' {
		return node{}, false
	}
	n, err := strconv.ParseInt(seq, 10, 32)
	if err != nil {
		return node{}, false
	}
	return node{name: name, kind: kind, nonce: nonce, seq: int32(n)}, true
}

// parseAll returns the lock nodes among children.
func parseAll(children []string) []node {
	out := make([]node, 0, len(children))
	for _, c := range children {
		if n, ok := parseNode(c); ok {
			out = append(out, n)
		}
	}
	return out
}

// blocker returns the node that me must wait for, false when me holds the
// lock. An exclusive node waits for the node just before it, of any kind;
// a read node waits for the last exclusive node before it (readers before
// it share the lock with it). Each waiter thus watches one node, and a
// release wakes only the waiters that may then hold.
func blocker(nodes []node, me node) (node, bool) {
	var best node
	found := false
	for _, n := range nodes {
		if n.seq >= me.seq || (!me.exclusive() && !n.exclusive()) {
			continue
		}
		if !found || n.seq > best.seq {
			best, found = n, true
		}
	}
	return best, found
}

// holders returns the nodes that hold the lock, lowest first: the lowest
// node when it is exclusive, otherwise every read node before the first
// exclusive one. None when nodes is empty.
func holders(nodes []node) []node {
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b node) int { return cmp.Compare(a.seq, b.seq) })
	for i, n := range sorted {
		if n.exclusive() {
			if i == 0 {
				return sorted[:1]
			}
			return sorted[:i]
		}
	}
	return sorted
}

// withNonce returns the node whose nonce is nonce, false when none is.
func withNonce(nodes []node, nonce string) (node, bool) {
	for _, n := range nodes {
		if n.nonce == nonce {
			return n, true
		}
	}
	return node{}, false
}
