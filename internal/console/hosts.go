package console

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// Host names.
//
// A web page can reach the console through its visitor's browser by DNS
// rebinding: its name resolves first to its own server, then to the
// console's address, and the browser, seeing one name, lets the page read
// the console's answers and send its forms. The browser still sends the
// page's name in Host. So the console answers only requests whose Host is
// one of its own names: localhost, a loopback address, the address the
// request reached (a numeric Host cannot be rebound), the host of its
// listen address, and the names configured (Config.Hosts, qbroker's
// --console-host). Any other Host gets 421 Misdirected Request and a
// line saying how to add the name.

// HostFlag is qbroker's flag that adds a host name to Config.Hosts.
const HostFlag = "--console-host"

// hostName is a normalized host: a DNS name in lower case without a
// trailing dot, or an IP address in its canonical form; port is empty
// when not given.
type hostName struct {
	host, port string
}

func (h hostName) String() string {
	host := h.host
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if h.port == "" {
		return host
	}
	return host + ":" + h.port
}

// parseHost normalizes a Host header or a configured name: host, [v6],
// either with :port, or a bare IPv6 address.
func parseHost(s string) (hostName, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	var h hostName
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.Index(s, "]")
		if end < 0 {
			return h, fmt.Errorf("%q: no closing ]", s)
		}
		h.host = s[1:end]
		if rest := s[end+1:]; rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return h, fmt.Errorf("%q: want [address] or [address]:port", s)
			}
			h.port = rest[1:]
			if h.port == "" {
				return h, fmt.Errorf("%q: empty port", s)
			}
		}
		if _, err := netip.ParseAddr(h.host); err != nil {
			return h, fmt.Errorf("%q: not an IPv6 address in brackets", s)
		}
	case strings.Count(s, ":") == 1:
		var err error
		if h.host, h.port, err = net.SplitHostPort(s); err != nil {
			return h, fmt.Errorf("%q: %v", s, err)
		}
		if h.port == "" {
			return h, fmt.Errorf("%q: empty port", s)
		}
	default: // a name, or a bare IPv6 address
		h.host = s
	}
	if h.port != "" {
		if n, err := strconv.ParseUint(h.port, 10, 16); err != nil || n == 0 {
			return h, fmt.Errorf("%q: port %q: want 1 to 65535", s, h.port)
		}
	}
	if a, err := netip.ParseAddr(h.host); err == nil {
		if a.Zone() != "" {
			return h, fmt.Errorf("%q: an address with a zone", s)
		}
		h.host = a.Unmap().String()
		return h, nil
	}
	h.host = strings.TrimSuffix(h.host, ".")
	if h.host == "" || len(h.host) > 253 {
		return h, fmt.Errorf("%q: want a host name, an IP address, either with :port", s)
	}
	for _, label := range strings.Split(h.host, ".") {
		if label == "" || len(label) > 63 {
			return h, fmt.Errorf("%q: want a host name, an IP address, either with :port", s)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return h, fmt.Errorf("%q: %q is not allowed in a host name", s, r)
			}
		}
	}
	return h, nil
}

// CheckHost reports whether s can be a name of Config.Hosts: a host name
// or an IP address (IPv6 in brackets when a port follows), optionally
// with :port.
func CheckHost(s string) error {
	_, err := parseHost(s)
	if err != nil {
		return fmt.Errorf("console: host %w", err)
	}
	return nil
}

// hosts is what a console answers to, besides loopback names and the
// address a request reached.
type hosts struct {
	names  []hostName // configured; a name without port matches any port
	listen string     // the host of the listen address, when a name or a specific address
}

func newHosts(names []string, listen string) (hosts, error) {
	var hs hosts
	for _, n := range names {
		h, err := parseHost(n)
		if err != nil {
			return hs, fmt.Errorf("console: host %w", err)
		}
		hs.names = append(hs.names, h)
	}
	if listen != "" {
		if host, _, err := net.SplitHostPort(listen); err == nil && host != "" {
			if h, err := parseHost(host); err == nil {
				if a, err := netip.ParseAddr(h.host); err != nil || !a.IsUnspecified() {
					hs.listen = h.host
				}
			}
		}
	}
	return hs, nil
}

// allowed reports whether r's Host is a name of the console.
func (hs hosts) allowed(r *http.Request) bool {
	h, err := parseHost(r.Host)
	if err != nil || r.Host == "" {
		return false
	}
	if h.host == "localhost" || h.host == hs.listen {
		return true
	}
	if a, err := netip.ParseAddr(h.host); err == nil {
		if a.IsLoopback() {
			return true
		}
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if ap, err := netip.ParseAddrPort(la.String()); err == nil && ap.Addr().Unmap() == a {
				return true
			}
		}
	}
	port := h.port
	if port == "" {
		port = "80"
		if r.TLS != nil {
			port = "443"
		}
	}
	for _, n := range hs.names {
		if n.host == h.host && (n.port == "" || n.port == port) {
			return true
		}
	}
	return false
}

// check answers a request whose Host is not the console's with 421 and
// a short text naming the names it answers to and the flag that adds
// one; nothing of the console is served to it.
func (hs hosts) check(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hs.allowed(r) {
			next.ServeHTTP(w, r)
			return
		}
		known := "localhost, loopback addresses, the address it was reached at"
		if hs.listen != "" {
			known += ", " + hs.listen
		}
		configured := "none"
		if len(hs.names) > 0 {
			s := make([]string, len(hs.names))
			for i, n := range hs.names {
				s[i] = n.String()
			}
			configured = strings.Join(s, ", ")
		}
		add := "the name"
		if h, err := parseHost(r.Host); err == nil {
			add = h.host
			if strings.Contains(add, ":") {
				add = "[" + add + "]"
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusMisdirectedRequest)
		fmt.Fprintf(w, "qbroker console: refused: Host %q is not a name of this console.\n"+
			"It answers to %s, and the names given with %s (now: %s).\n"+
			"If this is its name, restart qbroker with %s %s.\n",
			r.Host, known, HostFlag, configured, HostFlag, add)
	})
}
