package broker

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/qbroker/qbroker/internal/layout"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// MaxNameLen is the longest queue name or member id.
const MaxNameLen = zkutil.MaxNameLen

// validName checks a queue name or member id (zkutil.CheckName): one path
// element, which cannot escape the root.
func validName(kind, s string) error {
	if err := zkutil.CheckName(s); err != nil {
		return invalidf("%s %v", kind, err)
	}
	return nil
}

func printable(s string) string { return zkutil.Printable(s) }

// An ack token is "<queue>/<lease node name>/<hint>.<mac>" with the hint
// "<deadline ms>.<deliveries>.<size>": any broker can settle it. The hint
// lets an ack before the deadline delete the lease without reading it first
// (the lease name is unique to the delivery, so deleting it by name is
// safe; a lease already released by expiry, or settled, is gone). Past the
// hinted deadline, or without a hint, the broker reads the lease for its
// real deadline, which ExtendLease may have moved.
//
// The mac is an HMAC-SHA256 (truncated to 128 bits, base64url) of the
// queue, lease and hint under a key all brokers share (tokenKeyNode), so
// only a broker can have written the hint: a token whose mac is missing or
// wrong is settled the safe way, by reading the lease, and an edited hint
// can never ack an expired lease. "<queue>/<lease>" alone is a valid token.
type ackToken struct {
	queue, lease string
	deadline     time.Time // zero without a hint
	deliveries   int
	size         int
	hint         string // "<deadline ms>.<deliveries>.<size>" as sent
	mac          string // as sent; empty when missing
}

// macLen is the length of a token's mac in bytes, before base64.
const macLen = 16

func makeToken(s *tokenSigner, queue string, l zkqueue.Lease) string {
	b := make([]byte, 0, len(queue)+len(l.Token)+64)
	b = append(b, queue...)
	b = append(b, '/')
	b = append(b, l.Token...)
	b = append(b, '/')
	b = strconv.AppendInt(b, l.Deadline.UnixMilli(), 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(l.Deliveries), 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(len(l.Payload)), 10)
	b = append(b, '.')
	return string(s.appendMAC(b, b[:len(b)-1]))
}

// tokenSigner computes ack tokens' macs under the root's key. Every ack
// and every at-least-once delivery takes one, so the keyed hashes are
// pooled rather than set up per call.
type tokenSigner struct {
	pool sync.Pool // of hash.Hash keyed with the token key
}

func newTokenSigner(key []byte) *tokenSigner {
	key = bytes.Clone(key)
	return &tokenSigner{pool: sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

// appendMAC appends the base64url mac of body to dst.
func (s *tokenSigner) appendMAC(dst, body []byte) []byte {
	h := s.pool.Get().(hash.Hash)
	h.Reset()
	h.Write(body)
	var sum [sha256.Size]byte
	mac := h.Sum(sum[:0])[:macLen]
	s.pool.Put(h)
	return base64.RawURLEncoding.AppendEncode(dst, mac)
}

// trusted reports whether the token's hint was written by a broker holding
// the signer's key.
func (t ackToken) trusted(s *tokenSigner) bool {
	if t.deadline.IsZero() || t.mac == "" {
		return false
	}
	var buf [256]byte
	body := append(append(append(append(append(buf[:0], t.queue...), '/'), t.lease...), '/'), t.hint...)
	want := s.appendMAC(body[len(body):], body)
	return hmac.Equal([]byte(t.mac), want)
}

// errMalformedAck answers every malformed ack token.
var errMalformedAck = invalidf("malformed ack token")

func parseToken(tok string) (ackToken, error) {
	// Cut rather than Split: every ack parses one, and the parts are
	// substrings of tok.
	queue, rest, _ := strings.Cut(tok, "/")
	lease, hint, hinted := strings.Cut(rest, "/")
	if validName("queue", queue) != nil || strings.Contains(hint, "/") {
		return ackToken{}, errMalformedAck
	}
	if _, ok := zkqueue.ParseLeaseName(lease); !ok {
		return ackToken{}, errMalformedAck
	}
	t := ackToken{queue: queue, lease: lease}
	if !hinted {
		return t, nil
	}
	msText, rest, ok1 := strings.Cut(hint, ".")
	dText, rest, ok2 := strings.Cut(rest, ".")
	sizeText, mac, _ := strings.Cut(rest, ".")
	ms, err1 := strconv.ParseInt(msText, 10, 64)
	deliveries, err2 := strconv.Atoi(dText)
	size, err3 := strconv.Atoi(sizeText)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || err3 != nil || ms <= 0 || strings.Contains(mac, ".") {
		return ackToken{}, errMalformedAck
	}
	t.deadline, t.deliveries, t.size = time.UnixMilli(ms), deliveries, size
	t.hint, t.mac = hint[:len(msText)+len(dText)+len(sizeText)+2], mac
	return t, nil
}

// tokenKeyNode is the name of the root's child that holds the key signing
// ack tokens (zkutil.LoadSecret): random bytes written by the first broker
// to start under a root, read by every broker, never by anyone else
// (zkutil.PrivateACL).
const tokenKeyNode = layout.TokenKey

// clampDuration returns d, the request's field name, within [lo, hi], or
// def when d is zero.
func clampDuration(name string, d, def, lo, hi time.Duration) (time.Duration, error) {
	if d == 0 {
		return def, nil
	}
	if d < lo || d > hi {
		return 0, invalidf("%s %v out of range [%v, %v]", name, d, lo, hi)
	}
	return d, nil
}
