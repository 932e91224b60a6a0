package semaphore

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/qbroker/qbroker/internal/holding"
	"github.com/qbroker/qbroker/lockdelay"
)

// Children of the semaphore's node, and the prefixes of their children.
const (
	queueDir    = "queue"
	leasesDir   = "leases"
	waitPrefix  = "wait-"
	leasePrefix = "lease-"
)

// nonceLen is the length of the random hex element of a node's name, a
// new one for every attempt (holding.NewNonce): its waiter and then its
// lease share it.
const nonceLen = holding.NonceLen

func isNonce(s string) bool {
	if len(s) != nonceLen {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// waiter is a parsed waiter node name: wait-<nonce>-<sequence>.
type waiter struct {
	name  string
	nonce string
	seq   int32
}

// parseWaiter parses a waiter's name; the sequence suffix (%010d, a minus
// sign after the counter wrapped) is parsed as a number, never compared as
// a string. Other names are not waiters.
func parseWaiter(name string) (waiter, bool) {
	rest, ok := strings.CutPrefix(name, waitPrefix)
	if !ok || len(rest) < nonceLen+1 || rest[nonceLen] != '-' || !isNonce(rest[:nonceLen]) {
		return waiter{}, false
	}
	seq := rest[nonceLen+1:]
	if len(seq) < 10 || seq[0] == '+' {
		return waiter{}, false
	}
	n, err := strconv.ParseInt(seq, 10, 32)
	if err != nil {
		return waiter{}, false
	}
	return waiter{name: name, nonce: rest[:nonceLen], seq: int32(n)}, true
}

// waiters returns the waiter nodes among children, in queue order.
func waiters(children []string) []waiter {
	out := make([]waiter, 0, len(children))
	for _, c := range children {
		if w, ok := parseWaiter(c); ok {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b waiter) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// ahead returns the waiter just before me in the queue, false when me is
// the head (or not in the queue: see withNonce).
func ahead(queue []waiter, me waiter) (waiter, bool) {
	var best waiter
	found := false
	for _, w := range queue {
		if w.seq < me.seq && (!found || w.seq > best.seq) {
			best, found = w, true
		}
	}
	return best, found
}

// waiterWithNonce returns the waiter whose nonce is nonce.
func waiterWithNonce(queue []waiter, nonce string) (waiter, bool) {
	for _, w := range queue {
		if w.nonce == nonce {
			return w, true
		}
	}
	return waiter{}, false
}

// lease is a parsed lease node name: lease-<permits>-<nonce>. The permits
// are in the name so that counting the permits in use takes one listing.
type lease struct {
	name    string
	permits int
	nonce   string
}

// leaseName names the lease of an attempt.
func leaseName(permits int, nonce string) string {
	return leasePrefix + strconv.Itoa(permits) + "-" + nonce
}

// parseLease parses a lease's name. Other names are not leases (and
// count for no permit).
func parseLease(name string) (lease, bool) {
	rest, ok := strings.CutPrefix(name, leasePrefix)
	if !ok {
		return lease{}, false
	}
	num, nonce, ok := strings.Cut(rest, "-")
	if !ok || !isNonce(nonce) || num == "" || num[0] == '0' || num[0] == '+' {
		return lease{}, false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > MaxLimit {
		return lease{}, false
	}
	return lease{name: name, permits: n, nonce: nonce}, true
}

// leases returns the leases among children.
func leases(children []string) []lease {
	out := make([]lease, 0, len(children))
	for _, c := range children {
		if l, ok := parseLease(c); ok {
			out = append(out, l)
		}
	}
	return out
}

// inUse returns the permits the leases hold.
func inUse(ls []lease) int {
	n := 0
	for _, l := range ls {
		n += l.permits
	}
	return n
}

// delayed returns the permits that lost leases' lock-delay markers keep
// (package lockdelay): a marker <leases>/delay-lease-<n>-<nonce> whose
// lease is gone keeps its n permits until its delay ends. A marker whose
// lease exists keeps nothing of its own (the lease counts).
func delayed(children []string) int {
	present := make(map[string]bool, len(children))
	for _, c := range children {
		present[c] = true
	}
	n := 0
	for _, c := range children {
		h, ok := lockdelay.HolderOf(c)
		if !ok || present[h] {
			continue
		}
		if l, ok := parseLease(h); ok {
			n += l.permits
		} else {
			n += MaxLimit // a marker that does not parse errs on the safe side
		}
	}
	return n
}

func leaseWithNonce(ls []lease, nonce string) (lease, bool) {
	for _, l := range ls {
		if l.nonce == nonce {
			return l, true
		}
	}
	return lease{}, false
}

// encodeLimit and parseLimit are the semaphore node's data: the limit in
// decimal.
func encodeLimit(n int) []byte { return []byte(strconv.Itoa(n)) }

func parseLimit(data []byte) (int, bool) {
	s := string(data)
	if s == "" || s[0] == '+' || s[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxLimit {
		return 0, false
	}
	return n, true
}
