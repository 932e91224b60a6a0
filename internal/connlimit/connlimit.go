// Package connlimit bounds the connections a server accepts, so that
// connections that never get anywhere (TCP connected, then silent, as a
// flood of half-open connections is) cannot starve the clients that work.
//
// A Listener wraps a net.Listener. Every accepted connection is in one of
// three states: new (nothing received yet), greeted (it sent the 24-byte
// HTTP/2 client preface, or bytes wait unread on it) and proven (a call
// arrived on it, reported by the server through Proven). When the bound is
// reached, the oldest silent connection is closed to make room, else the
// oldest greeted one; only when every connection is proven is the new one
// refused. Before closing a new connection the Listener peeks at its
// socket: a client that sent its preface while the server was busy
// accepting others is not taken for a silent one. A new connection that
// sends nothing for HandshakeTimeout is closed. An optional per-IP bound
// refuses a remote address's connections beyond it.
//
// A Listener is safe for concurrent use.
package connlimit

import (
	"container/list"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Reason names why a connection was refused or closed by a limit.
type Reason string

// The reasons, used as metric labels.
const (
	// ReasonMaxConns: the bound was reached and every open connection had
	// proven itself; the new connection is refused.
	ReasonMaxConns Reason = "max_conns"
	// ReasonPerIP: the remote address had MaxPerIP connections open.
	ReasonPerIP Reason = "per_ip"
	// ReasonEvicted: an unproven connection was closed to make room for a
	// new one.
	ReasonEvicted Reason = "evicted_unproven"
	// ReasonHandshake: a connection sent nothing within HandshakeTimeout.
	ReasonHandshake Reason = "handshake_timeout"
)

// Reasons are all the reasons, for metrics that show each from the start.
var Reasons = []Reason{ReasonMaxConns, ReasonPerIP, ReasonEvicted, ReasonHandshake}

// prefaceLen is the length of the HTTP/2 client connection preface
// ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").
const prefaceLen = 24

// Config configures a Listener.
type Config struct {
	// Max bounds the open connections; at least 1.
	Max int
	// MaxPerIP bounds the open connections of one remote IP address; 0
	// means no bound.
	MaxPerIP int
	// HandshakeTimeout is how long a new connection may stay silent
	// before it is closed; 0 means no limit.
	HandshakeTimeout time.Duration
	// OnOpen and OnClose, when set, are called as connections are
	// admitted and as they end (either way once per connection).
	OnOpen, OnClose func()
	// OnRefuse, when set, is called for every connection refused or
	// closed by a limit, without locks held.
	OnRefuse func(reason Reason, remote net.Addr)
}

// Listener is a net.Listener that enforces Config's limits.
type Listener struct {
	net.Listener
	cfg Config

	mu     sync.Mutex
	open   int
	perIP  map[string]int
	byAddr map[string]*conn
	fresh  *list.List // state new, oldest first
	greet  *list.List // state greeted, oldest first
}

// New wraps inner. It panics when cfg.Max < 1.
func New(inner net.Listener, cfg Config) *Listener {
	if cfg.Max < 1 {
		panic("connlimit: Max < 1")
	}
	return &Listener{
		Listener: inner,
		cfg:      cfg,
		perIP:    map[string]int{},
		byAddr:   map[string]*conn{},
		fresh:    list.New(),
		greet:    list.New(),
	}
}

// Connection states.
const (
	stateNew int32 = iota
	stateGreeted
	stateProven
)

// conn is an admitted connection. Its tracking fields are guarded by the
// Listener's mu.
type conn struct {
	net.Conn
	l      *Listener
	ip     string
	addr   string
	state  atomic.Int32
	read   atomic.Int64 // bytes read while new
	elem   *list.Element
	live   bool // counted in the Listener
	timer  *time.Timer
	closed sync.Once
}

// Accept returns the next admitted connection. Refused connections are
// closed here and never returned.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		w, victim, reason := l.admit(c)
		if victim != nil {
			victim.shut()
			l.refused(ReasonEvicted, victim.RemoteAddr())
		}
		if w == nil {
			_ = c.Close()
			l.refused(reason, c.RemoteAddr())
			continue
		}
		if l.cfg.OnOpen != nil {
			l.cfg.OnOpen()
		}
		return w, nil
	}
}

// admit decides on a new connection: the wrapper to return, or nil and
// why not; and the connection evicted to make room, if any (already
// untracked, to be closed by the caller).
func (l *Listener) admit(c net.Conn) (w, victim *conn, reason Reason) {
	ip := hostOf(c.RemoteAddr())
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cfg.MaxPerIP > 0 && l.perIP[ip] >= l.cfg.MaxPerIP {
		return nil, nil, ReasonPerIP
	}
	if l.open >= l.cfg.Max {
		victim = l.oldestUnproven()
		if victim == nil {
			return nil, nil, ReasonMaxConns
		}
		l.untrack(victim)
	}
	w = &conn{Conn: c, l: l, ip: ip, addr: c.RemoteAddr().String(), live: true}
	w.elem = l.fresh.PushBack(w)
	l.open++
	l.perIP[ip]++
	l.byAddr[w.addr] = w
	if l.cfg.HandshakeTimeout > 0 {
		w.timer = time.AfterFunc(l.cfg.HandshakeTimeout, w.handshakeExpired)
	}
	return w, victim, ""
}

// oldestUnproven picks the connection to close: the oldest silent one,
// else the oldest greeted one. A connection whose bytes wait unread (the
// server has not got to it yet, as in a burst of accepts) is not silent:
// it joins the greeted ones instead. mu is held.
func (l *Listener) oldestUnproven() *conn {
	for e := l.fresh.Front(); e != nil; e = l.fresh.Front() {
		c := e.Value.(*conn)
		if c.read.Load() == 0 && !pending(c.Conn) {
			return c
		}
		l.promoteLocked(c, stateGreeted)
	}
	if e := l.greet.Front(); e != nil {
		return e.Value.(*conn)
	}
	return nil
}

// pending reports whether bytes from the peer wait unread on c. It peeks
// without blocking and without the read lock a blocked Read holds.
func pending(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var buf [1]byte
	n := 0
	_ = rc.Control(func(fd uintptr) {
		n, _, _ = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
}

// untrack forgets c; mu is held. It reports whether c was tracked.
func (l *Listener) untrack(c *conn) bool {
	if !c.live {
		return false
	}
	c.live = false
	l.unlist(c)
	l.open--
	if l.perIP[c.ip]--; l.perIP[c.ip] <= 0 {
		delete(l.perIP, c.ip)
	}
	if l.byAddr[c.addr] == c {
		delete(l.byAddr, c.addr)
	}
	return true
}

func (l *Listener) unlist(c *conn) {
	if c.elem == nil {
		return
	}
	switch c.state.Load() {
	case stateNew:
		l.fresh.Remove(c.elem)
	case stateGreeted:
		l.greet.Remove(c.elem)
	}
	c.elem = nil
}

// promote moves c forward to state st.
func (l *Listener) promote(c *conn, st int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.promoteLocked(c, st)
}

func (l *Listener) promoteLocked(c *conn, st int32) {
	if !c.live || c.state.Load() >= st {
		return
	}
	l.unlist(c)
	c.state.Store(st)
	if st == stateGreeted {
		c.elem = l.greet.PushBack(c)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
}

// Proven marks the connection from remote as proven: a call arrived on it,
// so it is never closed to make room. Unknown addresses are ignored.
func (l *Listener) Proven(remote net.Addr) {
	if remote == nil {
		return
	}
	l.mu.Lock()
	c := l.byAddr[remote.String()]
	l.mu.Unlock()
	if c != nil && c.state.Load() != stateProven {
		l.promote(c, stateProven)
	}
}

// Open returns the number of open connections.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

func (l *Listener) refused(reason Reason, remote net.Addr) {
	if l.cfg.OnRefuse != nil {
		l.cfg.OnRefuse(reason, remote)
	}
}

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.state.Load() == stateNew && c.read.Add(int64(n)) >= prefaceLen {
		c.l.promote(c, stateGreeted)
	}
	return n, err
}

// Close closes the connection and frees its place.
func (c *conn) Close() error {
	c.l.mu.Lock()
	c.l.untrack(c)
	c.l.mu.Unlock()
	return c.shut()
}

// shut closes the underlying connection once; the server's own Close
// follows (it finds the connection untracked).
func (c *conn) shut() error {
	err := net.ErrClosed
	c.closed.Do(func() {
		if c.timer != nil {
			c.timer.Stop()
		}
		err = c.Conn.Close()
		if c.l.cfg.OnClose != nil {
			c.l.cfg.OnClose()
		}
	})
	return err
}

func (c *conn) handshakeExpired() {
	c.l.mu.Lock()
	expired := c.state.Load() == stateNew && c.l.untrack(c)
	c.l.mu.Unlock()
	if expired {
		_ = c.shut()
		c.l.refused(ReasonHandshake, c.RemoteAddr())
	}
}

func hostOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}
