package broker

import (
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

// An ack token is "<queue>/<lease node name>": any broker can settle it.
func makeToken(queue, lease string) string { return queue + "/" + lease }

func parseToken(tok string) (queue, lease string, err error) {
	queue, lease, ok := strings.Cut(tok, "/")
	if !ok || validName("queue", queue) != nil {
		return "", "", invalidf("malformed ack token")
	}
	if _, ok := qcore.ParseLeaseName(lease); !ok {
		return "", "", invalidf("malformed ack token")
	}
	return queue, lease, nil
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
