package zktest

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a loopback TCP proxy in front of a server (a ZooKeeper member),
// for fault tests. It models two kinds of network failure while the
// server keeps running:
//
//   - Cut drops every connection and refuses new ones, as a partition
//     that resets connections would; Restore heals it.
//   - Stall stops forwarding in both directions without closing
//     anything, as a partition that silently drops packets would: both
//     ends see an open connection that carries nothing, so only their own
//     timeouts (the ZooKeeper session timeout, client pings) notice. New
//     connections are accepted but not forwarded. Resume heals it: the
//     bytes held meanwhile go through in order, as TCP retransmission
//     would deliver them, to whichever end still listens.
//
// A Proxy is safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	closed chan struct{} // closed when the proxy stops

	mu      sync.Mutex
	cut     bool
	flowing chan struct{} // closed while bytes are forwarded; open while stalled
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// NewProxy starts a proxy to target on a free 127.0.0.1 port, stopped when
// the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	flowing := make(chan struct{})
	close(flowing)
	p := &Proxy{target: target, ln: ln, closed: make(chan struct{}), flowing: flowing, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr returns the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes all proxied connections and refuses new ones until Restore.
// Connections held by a Stall close when it ends.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Restore lets connections through again after Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Stall stops forwarding without closing any connection, until Resume.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
		p.flowing = make(chan struct{})
	default: // already stalled
	}
}

// Resume forwards again after Stall, held bytes first.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
	default:
		close(p.flowing)
	}
}

// Stalled reports whether the proxy is stalled.
func (p *Proxy) Stalled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
		return false
	default:
		return true
	}
}

// waitFlowing blocks while the proxy is stalled; false means the proxy
// stopped.
func (p *Proxy) waitFlowing() bool {
	p.mu.Lock()
	flowing := p.flowing
	p.mu.Unlock()
	select {
	case <-flowing:
		return true
	case <-p.closed:
		return false
	}
}

func (p *Proxy) close() {
	p.ln.Close()
	close(p.closed)
	p.Cut()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.connect(c)
	}
}

// connect dials the target for an accepted connection once the proxy
// forwards (a stalled network does not carry the handshake either) and
// starts the two pipes.
func (p *Proxy) connect(c net.Conn) {
	defer p.wg.Done()
	if !p.waitFlowing() {
		p.untrack(c)
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(s) {
		if s != nil {
			s.Close()
		}
		p.untrack(c)
		return
	}
	p.wg.Add(2)
	go p.pipe(c, s)
	go p.pipe(s, c)
}

// pipe copies src to dst, holding what it read while the proxy is
// stalled. The read itself may complete during a stall: the bytes then
// wait here, as they would in a router's queue.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for p.waitFlowing() {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitFlowing() {
				break
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	p.untrack(dst)
	p.untrack(src)
}
