package broker

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/qbroker/qbroker/internal/qcore"
)

// MaxNameLen is the longest queue name or member id.
const MaxNameLen = 200

var nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)

// validName checks a queue name or member id: [A-Za-z0-9._-]{1,200}, not
// "." or "..". Such a name is one path element: it cannot escape the root.
func validName(kind, s string) error {
	if s == "" {
		return invalidf("%s is empty", kind)
	}
	if len(s) > MaxNameLen {
		return invalidf("%s is %d characters long, at most %d", kind, len(s), MaxNameLen)
	}
	if s == "." || s == ".." || !nameRE.MatchString(s) {
		return invalidf("%s %q: only letters, digits, '.', '_' and '-' (not '.' or '..')", kind, printable(s))
	}
	return nil
}

func printable(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// An ack token is "<queue>/<lease node name>/<deadline ms>.<deliveries>.<size>":
// any broker can settle it. The hint after the second slash lets an ack
// before the deadline delete the lease without reading it first (the lease
// name is unique to the delivery, so deleting it by name is safe; a lease
// already released by expiry is gone). Past the hinted deadline, or
// without a hint, the broker reads the lease for its real deadline, which
// ExtendLease may have moved. A forged hint can only mislabel the
// forger's own ack event.
type ackToken struct {
	queue, lease string
	deadline     time.Time // zero without a hint
	deliveries   int
	size         int
}

func makeToken(queue string, l qcore.Lease) string {
	return fmt.Sprintf("%s/%s/%d.%d.%d", queue, l.Token, l.Deadline.UnixMilli(), l.Deliveries, len(l.Payload))
}

func parseToken(tok string) (ackToken, error) {
	bad := invalidf("malformed ack token")
	parts := strings.Split(tok, "/")
	if len(parts) < 2 || len(parts) > 3 || validName("queue", parts[0]) != nil {
		return ackToken{}, bad
	}
	if _, ok := qcore.ParseLeaseName(parts[1]); !ok {
		return ackToken{}, bad
	}
	t := ackToken{queue: parts[0], lease: parts[1]}
	if len(parts) == 3 {
		var ms int64
		if n, err := fmt.Sscanf(parts[2], "%d.%d.%d", &ms, &t.deliveries, &t.size); n != 3 || err != nil || ms <= 0 {
			return ackToken{}, bad
		}
		t.deadline = time.UnixMilli(ms)
	}
	return t, nil
}

// clampDuration returns d within [lo, hi], or def when d is zero.
func clampDuration(d, def, lo, hi time.Duration) (time.Duration, error) {
	if d == 0 {
		return def, nil
	}
	if d < lo || d > hi {
		return 0, invalidf("duration %v out of range [%v, %v]", d, lo, hi)
	}
	return d, nil
}
