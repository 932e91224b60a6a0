package broker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// A thousand lock names, each locked and unlocked once, and a few
// election names leave no node behind once the leader's reaper passed;
// a name used again afterwards works as before.
func TestIdleCoordinationNamesReaped(t *testing.T) {
	t.Cleanup(broker.SetCoordReapInterval(200 * time.Millisecond))
	root := zktest.Root(t)
	tb := startBroker(t, []string{zktest.Addr(t)}, root)
	conn := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	locks := pb.NewLockClient(tb.grpcConn)

	const names = 1000
	next := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				s, _, err := lockGranted(ctx, locks, fmt.Sprintf("entity-%04d", i), "")
				if err == nil {
					err = unlockStream(s)
				}
				if err != nil {
					errs <- fmt.Errorf("lock %d: %w", i, err)
					return
				}
			}
		}()
	}
	for i := range names {
		select {
		case next <- i:
		case err := <-errs:
			close(next)
			wg.Wait()
			t.Fatal(err)
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	elections := electionClient(tb)
	for i := range 5 {
		cctx, stop := context.WithCancel(ctx)
		c, err := elections.Campaign(cctx, &pb.CampaignRequest{Name: fmt.Sprintf("job-%d", i), Value: []byte("v")})
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := c.Recv(); err != nil || ev.GetType() != pb.LeaderEvent_TYPE_LEADING {
			t.Fatalf("campaign %d: %v, %v", i, ev, err)
		}
		stop() // resigns
	}
	empty := func(p string) func() bool {
		return func() bool {
			c, _, err := conn.Children(p)
			if err != nil {
				t.Fatalf("children %s: %v", p, err)
			}
			return len(c) == 0
		}
	}
	zktest.WaitFor(t, 2*time.Minute, "no lock node left under locks/", empty(root+"/locks"))
	zktest.WaitFor(t, time.Minute, "no election node left under elections/", empty(root+"/elections"))

	s, _, err := lockGranted(ctx, locks, "entity-0007", "")
	if err != nil {
		t.Fatalf("a reaped lock name used again: %v", err)
	}
	if err := unlockStream(s); err != nil {
		t.Fatal(err)
	}
}

// Lock and Campaign create nodes, so they count in the ZooKeeper data
// budget: past it they are refused with ResourceExhausted naming the
// budget, as publishes are.
func TestCoordinationRefusedPastDataBudget(t *testing.T) {
	tb := startBroker(t, []string{zktest.Addr(t)}, zktest.Root(t), func(c *broker.Config) { c.ZKDataBudget = 1 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	locks := pb.NewLockClient(tb.grpcConn)
	var refused error
	// Until the broker has read ZooKeeper's data size it admits (the
	// size is unknown); it reads it at start.
	zktest.WaitFor(t, 30*time.Second, "a Lock refused past the data budget", func() bool {
		s, _, err := lockGranted(ctx, locks, "budget", "")
		if err == nil {
			if err := unlockStream(s); err != nil {
				t.Fatal(err)
			}
			return false
		}
		refused = err
		return true
	})
	if status.Code(refused) != codes.ResourceExhausted || !strings.Contains(refused.Error(), "ZooKeeper data budget") ||
		!strings.Contains(refused.Error(), "lock request") {
		t.Fatalf("Lock past the budget: got %v, want ResourceExhausted naming the data budget", refused)
	}
	c, err := electionClient(tb).Campaign(ctx, &pb.CampaignRequest{Name: "budget", Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Recv()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "ZooKeeper data budget") {
		t.Fatalf("Campaign past the budget: got %v, want ResourceExhausted naming the data budget", err)
	}
}
