package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// groupListings counts a queue's listings of its groups and keeps the
// watches they armed. go-zookeeper keeps a channel per watched listing
// until its watch fires, so the watches not fired are the channels the
// queue has outstanding in its ZooKeeper client.
type groupListings struct {
	mu        sync.Mutex
	watched   int
	unwatched int
	watches   []<-chan zk.Event
	lastBare  string // the last group listed without a watch
}

func (c *groupListings) listed(g string, w <-chan zk.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w == nil {
		c.unwatched++
		c.lastBare = g
		return
	}
	c.watched++
	c.watches = append(c.watches, w)
}

func (c *groupListings) counts() (watched, unwatched int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watched, c.unwatched
}

// outstanding is the number of watches armed and not fired.
func (c *groupListings) outstanding() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, w := range c.watches {
		select {
		case <-w:
		default:
			n++
		}
	}
	return n
}

// With more groups blocked at once than a snapshot's waiters watch
// (1,200: each group's first message leased, its second waiting), a pass
// over the queue after the first lists none of the blocked groups again
// and arms no new watch: the queue keeps one outstanding watch per blocked group however
// many passes run. With the cache bounded below the blocked set, the
// groups beyond it are listed without a watch, and the outstanding
// watches stay within the bound. A freed group's next message is still
// delivered to a waiting take.
func TestManyBlockedGroupsNotRelisted(t *testing.T) {
	const groups, passes = 1200, 3
	for _, tc := range []struct {
		name       string
		maxBlocked int // 0: the default bound, above groups
	}{
		{"cached", 0},
		{"beyond_bound", 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			root := zktest.Root(t)
			q, l := groupedQueue(t, root, 0, 1)
			zkqueue.SetMaxBlockedGroups(q, tc.maxBlocked)
			var c groupListings
			zkqueue.SetGroupListedHook(q, c.listed)

			// Every group's first message, then every group's second.
			for round := range 2 {
				publishEach(t, ctx, groups, func(i int) error {
					d := zkqueue.Draft{Payload: []byte(fmt.Sprintf("g%04d-%d", i, round))}
					d.Group = fmt.Sprintf("g%04d", i)
					_, err := q.PublishDraft(ctx, d)
					return err
				})
			}
			// Lease every first message: every group is then blocked.
			tokens := map[string]string{} // group -> lease token
			for len(tokens) < groups {
				ls, err := l.Take(ctx, groups, zkqueue.Room{}, time.Hour, false)
				if err != nil && !errors.Is(err, zkqueue.ErrEmpty) {
					t.Fatal(err)
				}
				if len(ls) == 0 {
					t.Fatalf("%d groups leased, then nothing to take", len(tokens))
				}
				for _, x := range ls {
					tokens[string(x.Payload[:5])] = x.Token
				}
			}
			watchedSetup, _ := c.counts()
			t.Logf("setup: %d watched group listings, %d watches outstanding", watchedSetup, c.outstanding())

			bound := groups
			if tc.maxBlocked > 0 {
				bound = tc.maxBlocked
			}
			for pass := range passes + 1 { // the first pass finds the groups blocked
				w0, u0 := c.counts()
				// A plain message changes the queue: the take lists it
				// again and walks every blocked message to reach it.
				if _, err := q.Publish(ctx, []byte("plain")); err != nil {
					t.Fatal(err)
				}
				ls, err := l.Take(ctx, 10, zkqueue.Room{}, time.Hour, false)
				if err != nil && !errors.Is(err, zkqueue.ErrEmpty) {
					t.Fatal(err)
				}
				if len(ls) != 1 || string(ls[0].Payload) != "plain" {
					t.Fatalf("pass %d: took %d messages, want the plain one", pass, len(ls))
				}
				w1, u1 := c.counts()
				t.Logf("pass %d: %d watched and %d unwatched group listings, %d watches outstanding", pass, w1-w0, u1-u0, c.outstanding())
				if pass == 0 {
					continue
				}
				if w1-w0 > 10 {
					t.Fatalf("pass %d listed %d blocked groups with a watch again, want none", pass, w1-w0)
				}
				// One listing per candidate of a group beyond the
				// bound: its next message, and its leased one when the
				// listing still shows it.
				if u1-u0 > 2*(groups-bound)+10 {
					t.Fatalf("pass %d listed %d blocked groups without a watch, want at most two per group beyond the bound (%d)", pass, u1-u0, groups-bound)
				}
				if n := c.outstanding(); n > bound+10 {
					t.Fatalf("pass %d: %d group watches outstanding, want at most one per cached group (%d)", pass, n, bound)
				}
			}

			// A freed group's second message reaches a waiting take. A
			// take that finds nothing first arms the watches; the ack
			// then changes the group alone (the message left the queue
			// when it was leased): beyond the bound, or beyond the
			// watches a wait selects over, no watch of the take sees
			// it, and the groupPoll wake must.
			if ls, err := l.Take(ctx, 1, zkqueue.Room{}, time.Hour, false); !errors.Is(err, zkqueue.ErrEmpty) {
				t.Fatalf("a take with every group blocked: %d messages, %v; want ErrEmpty", len(ls), err)
			}
			g := "g0007"
			if tc.maxBlocked > 0 {
				c.mu.Lock()
				g = c.lastBare
				c.mu.Unlock()
			}
			acked := time.Now()
			if _, err := l.AckUnread(ctx, tokens[g]); err != nil {
				t.Fatal(err)
			}
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			defer wcancel()
			ls, err := l.Take(wctx, 1, zkqueue.Room{}, time.Hour, true)
			if err != nil || len(ls) != 1 {
				t.Fatalf("a waiting take after %s's ack: %d messages, %v", g, len(ls), err)
			}
			t.Logf("%s's next message taken %v after the ack", g, time.Since(acked))
			if p := string(ls[0].Payload); p != g+"-1" {
				t.Fatalf("a waiting take after %s's ack: got %s, want %s-1", g, p, g)
			}
		})
	}
}

// publishEach runs publish(0..n-1) on a few goroutines.
func publishEach(t *testing.T, ctx context.Context, n int, publish func(i int) error) {
	t.Helper()
	const workers = 8
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if err := publish(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
