// Package ports picks free loopback ports for servers that tests and the
// load tester start by address, and may stop and start again on the same
// address.
//
// A port picked by listening on port 0 and closing the listener comes
// from the kernel's ephemeral range, the range every outgoing connection
// on the machine takes its local port from: between the pick and the
// server's bind, or between a server's stop and its restart, any
// connection (of this process or another) can take it, and the server
// then fails with "address already in use". The ports picked here lie
// below that range, where only servers binding them on purpose go.
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the lowest port picked: above the well-known and the usual
// registered service ports.
const lowest = 10000

// given holds the ports this process handed out: never twice, since a
// server may not have bound its port yet, or may be down for a restart.
var given = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Free returns n loopback ports that were free a moment ago, none given
// before by this process. The listeners that proved them free are held
// until all n are chosen.
func Free(n int) ([]int, error) {
	hi := ephemeralLow() - 1
	if hi-lowest < 1000 {
		return fromKernel(n) // no room below the ephemeral range
	}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 100*n {
			return nil, fmt.Errorf("ports: no %d free loopback ports in [%d, %d] after %d tries", n, lowest, hi, tries)
		}
		p := lowest + rand.IntN(hi-lowest+1)
		given.Lock()
		mine := given.ports[p]
		given.Unlock()
		if mine {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // taken
		}
		ls = append(ls, l)
		ports = append(ports, p)
	}
	given.Lock()
	for _, p := range ports {
		given.ports[p] = true
	}
	given.Unlock()
	return ports, nil
}

// FreeAddr returns "127.0.0.1:<port>" with a port of Free.
func FreeAddr() (string, error) {
	p, err := Free(1)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(p[0]), nil
}

// ephemeralLow is the first port of the kernel's ephemeral range; 32768
// where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

// fromKernel picks n ports the kernel's way (port 0), holding each
// listener until all are chosen.
func fromKernel(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("ports: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
