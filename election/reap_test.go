package election_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/internal/zktest"
)

// A Reaper deletes an election's node once it had no candidate for a
// whole pass; Campaign makes it again, and an Observe that watched it go
// sees the next leader.
func TestReaperAndCampaignAgain(t *testing.T) {
	dir := zktest.Root(t) + "/elections"
	conn := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newElection(t, conn, dir+"/sched", election.WithOwner("carol"))
	watcher := newElection(t, zktest.Conn(t), dir+"/sched", election.WithCreateParents(false))
	leaders := watcher.Observe(ctx)
	r, err := election.NewReaper(conn, dir)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := r.Reap(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := children(t, conn, dir); len(got) != 0 {
		t.Fatalf("after two idle passes: %v, want none", got)
	}
	if err := e.Campaign(ctx, []byte("v")); err != nil {
		t.Fatalf("Campaign after the election's node was reaped: %v", err)
	}
	select {
	case l := <-leaders:
		if l.Key != e.Key() || string(l.Value) != "v" || l.Owner != "carol" {
			t.Fatalf("observed %+v, want %s with value v of carol", l, e.Key())
		}
	case <-ctx.Done():
		t.Fatal("the observer saw no leader after the node came back")
	}
}

// Candidates racing a reaper that runs without pause always take part,
// round after round.
func TestCampaignRacesReaper(t *testing.T) {
	dir := zktest.Root(t) + "/elections"
	conn := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := election.NewReaper(conn, dir)
	if err != nil {
		t.Fatal(err)
	}
	var es []*election.Election
	for i := range 5 {
		es = append(es, newElection(t, conn, fmt.Sprintf("%s/e%d", dir, i)))
	}
	reapCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	reaped := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for reapCtx.Err() == nil {
			n, err := r.Reap(reapCtx)
			if err != nil && reapCtx.Err() == nil && !errors.Is(err, zk.ErrNoNode) {
				t.Errorf("Reap: %v", err)
				return
			}
			reaped += n
		}
	}()
	const rounds = 200
	for i := range rounds {
		e := es[i%len(es)]
		if err := e.Campaign(ctx, []byte("x")); err != nil {
			t.Fatalf("round %d: Campaign raced with the reaper: %v", i, err)
		}
		if err := e.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	wg.Wait()
	if reaped == 0 {
		t.Fatalf("the reaper deleted nothing in %d rounds: no race was run", rounds)
	}
	t.Logf("%d rounds, %d election nodes reaped meanwhile", rounds, reaped)
}

// With IfOwner, ProclaimKey and ResignKey act only on the owner's
// candidates; ProclaimKey keeps the owner.
func TestKeyOwnerConditions(t *testing.T) {
	root := zktest.Root(t) + "/election"
	other := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newElection(t, zktest.Conn(t), root, election.WithOwner("carol"))
	if err := e.Campaign(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := election.ProclaimKey(ctx, other, e.Key(), []byte("evil"), election.IfOwner("dave")); !errors.Is(err, election.ErrNotOwner) {
		t.Fatalf("ProclaimKey by dave: got %v, want ErrNotOwner", err)
	}
	if err := election.ResignKey(ctx, other, e.Key(), election.IfOwner("dave")); !errors.Is(err, election.ErrNotOwner) {
		t.Fatalf("ResignKey by dave: got %v, want ErrNotOwner", err)
	}
	if err := election.ProclaimKey(ctx, other, e.Key(), []byte("b"), election.IfOwner("carol")); err != nil {
		t.Fatal(err)
	}
	l, err := e.Leader(ctx)
	if err != nil || string(l.Value) != "b" || l.Owner != "carol" || isClosed(e.Done()) {
		t.Fatalf("Leader = %+v, %v; want carol's candidate with value b, leading", l, err)
	}
	if err := election.ResignKey(ctx, other, e.Key(), election.IfOwner("carol")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Done():
	case <-ctx.Done():
		t.Fatal("Done did not close after ResignKey")
	}
}
