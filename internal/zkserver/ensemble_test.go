package zkserver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zkserver"
)

// The ensemble's leader is found with srvr; killing it elects another;
// the last member of a lost quorum reports ErrNotServing; restarting the
// members brings a leader back.
func TestEnsembleLeader(t *testing.T) {
	requireZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := zkserver.StartCluster(ctx, 3, zkserver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	leader, err := c.WaitServing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := c.Leader(); err != nil || l != leader {
		t.Fatalf("Leader() = %v, %v; WaitServing said %s", l, err, leader.Addr())
	}
	followers := 0
	for _, s := range c.Servers {
		mode, err := s.Mode()
		if err != nil {
			t.Fatalf("mode of %s: %v", s.Addr(), err)
		}
		if mode == "follower" {
			followers++
		}
	}
	if followers != 2 {
		t.Fatalf("got %d followers, want 2", followers)
	}

	leader.Kill()
	if _, err := leader.Mode(); err == nil {
		t.Fatal("a killed server reports a mode")
	}
	next, err := c.WaitServing(ctx)
	if err != nil {
		t.Fatalf("after killing the leader: %v", err)
	}
	if next == leader {
		t.Fatal("the killed server still leads")
	}

	if err := next.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitServing(ctx); !errors.Is(err, zkserver.ErrNotServing) {
		t.Fatalf("WaitServing with 1 of 3 members: %v, want ErrNotServing", err)
	}
	last := c.Running()[0]
	if err := retry(30*time.Second, func() error {
		if _, err := last.Mode(); !errors.Is(err, zkserver.ErrNotServing) {
			return fmt.Errorf("mode of the last member: %v, want ErrNotServing", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Leader(); err == nil {
		t.Fatal("a leader without quorum")
	}

	for _, s := range []*zkserver.Server{leader, next} {
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitServing(ctx); err != nil {
		t.Fatalf("after restoring the quorum: %v", err)
	}
	if n := len(c.Running()); n != 3 {
		t.Fatalf("%d members running, want 3", n)
	}
}
