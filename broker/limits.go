package broker

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/qbroker/qbroker/internal/connlimit"
)

// Stream and connection limits.
//
// Streams: at most MaxStreams long-lived streams (Consume, JoinSync, Lock,
// Campaign, Observe) per broker, MaxStreamsPerIdentity of them per client
// (calls.go) and MaxStreamsPerConn calls per connection; a Consume stream
// must send its subscribe request within FirstMessageTimeout. Connections:
// a client makes calls on at most MaxConnsPerIdentity (calls.go); on
// listeners
// wrapped by LimitListener): at most MaxConns, MaxConnsPerIP per client
// address; when the bound is reached, the oldest connection that has not
// proven itself (no call yet) makes room; a connection silent for
// HandshakeTimeout is closed; one idle for MaxConnectionIdle gets GOAWAY.
// Every refusal is counted (qbroker_streams_refused_total,
// qbroker_connections_refused_total) and logged at warn, at most once per
// warnEvery and reason.

// Reasons of qbroker_streams_refused_total.
const (
	reasonMaxStreams  = "max_streams"
	reasonPerIdentity = "per_identity" // also of qbroker_connections_refused_total
	reasonNoSubscribe = "no_subscribe"
)

// streamRefusals are every reason of qbroker_streams_refused_total: each
// has a series from the start.
var streamRefusals = []string{reasonMaxStreams, reasonNoSubscribe}

// LimitListener wraps lis with the broker's connection limits (MaxConns,
// MaxConnsPerIP, HandshakeTimeout; see package connlimit). Serve the
// broker's GRPCServer on the result: its calls tell the listener which
// connections have proven themselves.
func (b *Broker) LimitListener(lis net.Listener) net.Listener {
	l := connlimit.New(lis, connlimit.Config{
		Max:              b.cfg.MaxConns,
		MaxPerIP:         b.cfg.MaxConnsPerIP,
		HandshakeTimeout: b.cfg.HandshakeTimeout,
		OnOpen:           b.metrics.connsOpen.Inc,
		OnClose:          b.metrics.connsOpen.Dec,
		OnRefuse:         b.gate.connRefused,
	})
	b.gate.listenersMu.Lock()
	b.gate.listeners = append(b.gate.listeners, l)
	b.gate.listenersMu.Unlock()
	return l
}

// warnEvery is how often one kind of refusal is logged.
const warnEvery = 10 * time.Second

// rateLimit logs a warning per key at most every warnEvery, with the
// number of occurrences it did not log. The zero value is ready.
type rateLimit struct {
	mu   sync.Mutex
	keys map[string]*rateKey
}

type rateKey struct {
	last       time.Time
	suppressed int
}

func (r *rateLimit) warn(log *slog.Logger, key, msg string, args ...any) {
	r.mu.Lock()
	if r.keys == nil {
		r.keys = map[string]*rateKey{}
	}
	k := r.keys[key]
	if k == nil {
		k = &rateKey{}
		r.keys[key] = k
	}
	if !k.last.IsZero() && time.Since(k.last) < warnEvery {
		k.suppressed++
		r.mu.Unlock()
		return
	}
	n := k.suppressed
	k.last, k.suppressed = time.Now(), 0
	r.mu.Unlock()
	log.Warn(msg, append(args, "not_logged_since_last", n)...)
}

func (gt *gate) refuseStream(reason string) {
	b := gt.b
	b.metrics.streamsRefused.WithLabelValues(reason).Inc()
	msg := "stream refused: broker stream limit reached"
	switch reason {
	case reasonNoSubscribe:
		msg = "stream ended: no subscribe request in time"
	case reasonPerIdentity:
		msg = "stream refused: a client's stream limit reached"
	}
	gt.warnings.warn(b.log, "stream:"+reason, msg, "reason", reason, "max_streams", b.cfg.MaxStreams,
		"max_streams_per_identity", b.cfg.MaxStreamsPerIdentity, "first_message_timeout", b.cfg.FirstMessageTimeout)
}

// connRefusedFor counts and logs a call refused because its client had
// calls on held other connections.
func (gt *gate) connRefusedFor(c client, held int) {
	b := gt.b
	b.metrics.connsRefused.WithLabelValues(reasonPerIdentity).Inc()
	gt.warnings.warn(b.log, "conn:"+reasonPerIdentity, "call refused: a client's connection limit reached",
		"reason", reasonPerIdentity, "client", c.String(), "connections", held, "max_conns_per_identity", b.cfg.MaxConnsPerIdentity)
}

func (gt *gate) connRefused(reason connlimit.Reason, remote net.Addr) {
	b := gt.b
	b.metrics.connsRefused.WithLabelValues(string(reason)).Inc()
	msg := "connection refused: connection limit reached"
	switch reason {
	case connlimit.ReasonPerIP:
		msg = "connection refused: per-address connection limit reached"
	case connlimit.ReasonEvicted:
		msg = "connection closed to make room: it had made no call"
	case connlimit.ReasonHandshake:
		msg = "connection closed: it sent nothing within the handshake timeout"
	}
	gt.warnings.warn(b.log, "conn:"+string(reason), msg, "reason", string(reason), "remote", remote.String(),
		"max_conns", b.cfg.MaxConns, "max_conns_per_ip", b.cfg.MaxConnsPerIP)
}

// proven tells the limiting listeners that the connection of ctx's call
// works: it is never evicted to make room.
func (gt *gate) proven(ctx context.Context) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return
	}
	gt.listenersMu.Lock()
	ls := gt.listeners
	gt.listenersMu.Unlock()
	for _, l := range ls {
		l.Proven(p.Addr)
	}
}

// admitConn counts the call's connection for its client (claimConn)
// and, unless that refuses the call, tells the limiting listeners that
// the connection works. Without Auth a connection's client is its
// address, the same for all its calls: once admitted, it is settled and
// its calls skip this (enterConn).
func (gt *gate) admitConn(ctx context.Context, cn *conn) error {
	b := gt.b
	if err := gt.claimConn(ctx); err != nil {
		return err
	}
	gt.proven(ctx)
	if cn != nil && b.cfg.Auth == nil {
		cn.settled.Store(true)
	}
	return nil
}
