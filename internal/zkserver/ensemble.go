package zkserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrNotServing reports a server that runs but serves no clients: it is
// starting, or it lost its ensemble's quorum and is looking for one.
var ErrNotServing = errors.New("zkserver: server is not serving requests")

// Mode returns the server's role as its srvr command reports it:
// "leader", "follower", "observer" or "standalone". A stopped server
// answers an error; one that runs without a quorum answers ErrNotServing.
func (s *Server) Mode() (string, error) {
	if !s.Running() {
		return "", fmt.Errorf("zkserver: server %s is stopped", s.Addr())
	}
	out, err := FourLetter(s.Addr(), "srvr", 2*time.Second)
	if err != nil {
		return "", fmt.Errorf("zkserver: srvr %s: %w", s.Addr(), err)
	}
	for _, line := range strings.Split(out, "\n") {
		if mode, ok := strings.CutPrefix(strings.TrimSpace(line), "Mode:"); ok {
			return strings.TrimSpace(mode), nil
		}
	}
	// "This ZooKeeper instance is not currently serving requests".
	return "", fmt.Errorf("%w: %s", ErrNotServing, s.Addr())
}

// Leader returns the running member that leads the ensemble now. It fails
// when no member reports itself leader (an election under way, or no
// quorum).
func (c *Cluster) Leader() (*Server, error) {
	for _, s := range c.Servers {
		if mode, err := s.Mode(); err == nil && mode == "leader" {
			return s, nil
		}
	}
	return nil, fmt.Errorf("%w: no member leads the ensemble", ErrNotServing)
}

// Running returns the members whose process is alive.
func (c *Cluster) Running() []*Server {
	var out []*Server
	for _, s := range c.Servers {
		if s.Running() {
			out = append(out, s)
		}
	}
	return out
}

// WaitServing waits until every running member serves clients (as leader
// or follower) and one of them leads, and returns the leader. It fails
// when ctx ends first or fewer than a quorum of members run.
func (c *Cluster) WaitServing(ctx context.Context) (*Server, error) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		running := c.Running()
		if 2*len(running) <= len(c.Servers) {
			return nil, fmt.Errorf("%w: %d of %d members run, no quorum", ErrNotServing, len(running), len(c.Servers))
		}
		var leader *Server
		serving := 0
		for _, s := range running {
			switch mode, err := s.Mode(); {
			case err != nil:
			case mode == "leader":
				leader = s
				serving++
			default:
				serving++
			}
		}
		if leader != nil && serving == len(running) {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("zkserver: ensemble not serving (%d of %d running members serve, leader %v): %w",
				serving, len(running), leader != nil, ctx.Err())
		case <-t.C:
		}
	}
}
