package broker

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
)

// Limits per client.
//
// MaxStreams and MaxConns bound what the broker serves; without bounds per
// client, one client could hold all of it and keep every other out. A
// client is the authenticated identity of a call when Config.Auth is set,
// else the IP address the call came from. clientUse counts each client's
// streams (admitted by enterStream, under MaxStreamsPerIdentity) and the
// connections it made calls on (claimed by claimConn, under
// MaxConnsPerIdentity); a connection's end, seen by the gRPC server's
// stats handler connEnds, frees its places.

// client names the client of a call: key is the map key ("" when the call
// has no client to count, such as a health check with authentication on);
// it prints as "identity alice" or "address 10.0.0.7".
type client struct {
	key  string
	kind string // "identity" or "address"
	name string
}

func (c client) String() string { return c.kind + " " + printable(c.name) }

// clientOf returns the client of ctx's call.
func (b *Broker) clientOf(ctx context.Context) client {
	if b.cfg.Auth != nil {
		if id, ok := IdentityFrom(ctx); ok && id.Name != "" {
			return client{key: "identity:" + id.Name, kind: "identity", name: id.Name}
		}
		return client{}
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return client{}
	}
	ip := p.Addr.String()
	if t, ok := p.Addr.(*net.TCPAddr); ok {
		ip = t.IP.String()
	} else if h, _, err := net.SplitHostPort(ip); err == nil {
		ip = h
	}
	return client{key: "address:" + ip, kind: "address", name: ip}
}

// clientUse counts streams and connections per client. The zero value is
// ready; it is safe for concurrent use.
type clientUse struct {
	mu sync.Mutex
	m  map[string]*clientCount
}

type clientCount struct{ streams, conns int }

// get returns key's counts, created when missing; mu is held.
func (u *clientUse) get(key string) *clientCount {
	if u.m == nil {
		u.m = map[string]*clientCount{}
	}
	n := u.m[key]
	if n == nil {
		n = &clientCount{}
		u.m[key] = n
	}
	return n
}

// put forgets key's counts once both are zero; mu is held.
func (u *clientUse) put(key string, n *clientCount) {
	if n.streams <= 0 && n.conns <= 0 {
		delete(u.m, key)
	}
}

// addStream counts a stream of key unless key holds limit already; it
// returns key's streams before and whether the stream was counted. An
// empty key is never bounded.
func (u *clientUse) addStream(key string, limit int) (int, bool) {
	if key == "" {
		return 0, true
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	n := u.get(key)
	if n.streams >= limit {
		u.put(key, n)
		return n.streams, false
	}
	n.streams++
	return n.streams - 1, true
}

// endStream uncounts a stream addStream counted.
func (u *clientUse) endStream(key string) {
	if key == "" {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	n := u.get(key)
	n.streams--
	u.put(key, n)
}

// conn is a client connection as connEnds tags it: the clients that made
// calls on it (usually one), uncounted when it ends. Guarded by
// clientUse.mu.
type conn struct {
	clients map[string]bool
	ended   bool
	// settled: without Auth, counted for its address and proven to the
	// limiting listeners (admitConn); its calls need neither again.
	settled atomic.Bool
}

type connKey struct{}

// claimConn counts ctx's connection for ctx's client, unless the client
// made calls on MaxConnsPerIdentity other connections still open: then it
// returns a ResourceExhausted status naming the limit. Calls without a
// connection the stats handler tagged (in-process calls) are not counted.
func (b *Broker) claimConn(ctx context.Context) error {
	cn, _ := ctx.Value(connKey{}).(*conn)
	if cn == nil {
		return nil
	}
	c := b.clientOf(ctx)
	if c.key == "" {
		return nil
	}
	u := &b.clients
	u.mu.Lock()
	if cn.ended || cn.clients[c.key] {
		u.mu.Unlock()
		return nil
	}
	n := u.get(c.key)
	if n.conns >= b.cfg.MaxConnsPerIdentity {
		held := n.conns
		u.put(c.key, n)
		u.mu.Unlock()
		b.connRefusedFor(c, held)
		return b.fail(fmt.Errorf("%w: %s has calls on %d open connections, the most one client may use (--max-conns-per-identity)",
			errLimit, c, held))
	}
	n.conns++
	if cn.clients == nil {
		cn.clients = map[string]bool{}
	}
	cn.clients[c.key] = true
	u.mu.Unlock()
	return nil
}

// connEnded uncounts cn for every client that made calls on it.
func (u *clientUse) connEnded(cn *conn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	cn.ended = true
	for key := range cn.clients {
		n := u.get(key)
		n.conns--
		u.put(key, n)
	}
	cn.clients = nil
}

// connEnds is the gRPC server's stats handler: it tags each connection's
// context with a conn (calls on it find it in their context) and uncounts
// the conn when the connection ends. Everything else is a no-op.
type connEnds struct{ b *Broker }

func (connEnds) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (connEnds) HandleRPC(context.Context, stats.RPCStats)                       {}

func (connEnds) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, &conn{})
}

func (h connEnds) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnEnd); !ok {
		return
	}
	if cn, ok := ctx.Value(connKey{}).(*conn); ok {
		h.b.clients.connEnded(cn)
	}
}
