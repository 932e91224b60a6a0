package zkqueue_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

func newCatalog(t *testing.T, conn *zk.Conn, cfg zkqueue.CatalogConfig) *zkqueue.Catalog {
	t.Helper()
	c, err := zkqueue.NewCatalog(conn, zktest.Root(t)+"/queues", cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func fifo(vis time.Duration) zkqueue.Spec {
	return zkqueue.Spec{Kind: zkqueue.KindFIFO, Visibility: vis, Created: time.Now().UTC().Truncate(time.Millisecond)}
}

func mustCreate(t *testing.T, c *zkqueue.Catalog, name string, s zkqueue.Spec) zkqueue.Spec {
	t.Helper()
	got, err := c.Create(context.Background(), name, s)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return got
}

// queueNodes lists what is under a queue's node.
func queueNodes(t *testing.T, conn *zk.Conn, p string) []string {
	t.Helper()
	children, _, err := conn.Children(p)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(children)
	return children
}

// Create makes the queue's node with its five parents and stores the
// spec; creating it again with the same configuration returns the stored
// spec, with another fails ErrQueueExists and returns the stored one.
// Info, List and Count see it; bad names and specs change nothing.
func TestCatalogCreate(t *testing.T) {
	conn := zktest.Conn(t)
	c := newCatalog(t, conn, zkqueue.CatalogConfig{})
	ctx := context.Background()
	s := fifo(1500*time.Millisecond + 300*time.Microsecond)
	got := mustCreate(t, c, "a.jobs", s)
	if got.Visibility != 1500*time.Millisecond || got.Kind != zkqueue.KindFIFO || !got.Created.Equal(s.Created) {
		t.Fatalf("created %+v", got)
	}
	want := []string{"consumers", "dead", "delayed", "expired", "items", "leases", "members"}
	if nodes := queueNodes(t, conn, c.Path("a.jobs")); !slices.Equal(nodes, want) {
		t.Fatalf("queue nodes %v, want %v", nodes, want)
	}
	later := s
	later.Created = s.Created.Add(time.Hour)
	if again, err := c.Create(ctx, "a.jobs", later); err != nil || !reflect.DeepEqual(again, got) {
		t.Fatalf("create again: got %+v, %v; want %+v", again, err, got)
	}
	prio := zkqueue.Spec{Kind: zkqueue.KindPriority, Visibility: time.Second}
	if old, err := c.Create(ctx, "a.jobs", prio); !errors.Is(err, zkqueue.ErrQueueExists) || !reflect.DeepEqual(old, got) {
		t.Fatalf("create with another configuration: got %+v, %v; want ErrQueueExists and %+v", old, err, got)
	}
	mustCreate(t, c, "a.sync", zkqueue.Spec{Kind: zkqueue.KindSync, SyncMembers: 3})
	mustCreate(t, c, "b", prio)
	if names, err := c.List(ctx, "a."); err != nil || !slices.Equal(names, []string{"a.jobs", "a.sync"}) {
		t.Fatalf("List(a.): %v, %v", names, err)
	}
	if info, err := c.Info("a.sync"); err != nil || info.Kind != zkqueue.KindSync || info.SyncMembers != 3 {
		t.Fatalf("Info(a.sync): %+v, %v", info, err)
	}
	if _, err := c.Info("nope"); !errors.Is(err, zkqueue.ErrQueueNotFound) {
		t.Fatalf("Info(nope): %v, want ErrQueueNotFound", err)
	}
	bad := map[string]zkqueue.Spec{
		"kind":     {Kind: "lifo"},
		"sync":     {Kind: zkqueue.KindSync, SyncMembers: 1},
		"members":  {Kind: zkqueue.KindFIFO, SyncMembers: 2},
		"negative": {Kind: zkqueue.KindFIFO, MaxDeliveries: -1},
		"marked":   {Kind: zkqueue.KindFIFO, Deleting: true},
	}
	for name, s := range bad {
		if _, err := c.Create(ctx, name, s); !errors.Is(err, zkqueue.ErrBadSpec) {
			t.Errorf("spec %s: got %v, want ErrBadSpec", name, err)
		}
	}
	for _, name := range []string{"", ".", "..", "a/items"} {
		if _, err := c.Create(ctx, name, prio); !errors.Is(err, zkqueue.ErrBadName) {
			t.Errorf("name %q: got %v, want ErrBadName", name, err)
		}
	}
	if n, err := c.Count(); err != nil || n != 3 {
		t.Fatalf("Count: %d, %v; want 3", n, err)
	}
}

// Beyond MaxQueues Create fails ErrTooManyQueues and creates nothing; an
// existing queue can still be created again, and a deletion makes room.
func TestCatalogMaxQueues(t *testing.T) {
	conn := zktest.Conn(t)
	c := newCatalog(t, conn, zkqueue.CatalogConfig{MaxQueues: 2})
	ctx := context.Background()
	mustCreate(t, c, "a", fifo(time.Second))
	mustCreate(t, c, "b", fifo(time.Second))
	if _, err := c.Create(ctx, "c", fifo(time.Second)); !errors.Is(err, zkqueue.ErrTooManyQueues) {
		t.Fatalf("third queue: %v, want ErrTooManyQueues", err)
	}
	if zktest.Exists(t, conn, c.Path("c")) {
		t.Fatal("the refused queue exists")
	}
	mustCreate(t, c, "a", fifo(time.Second))
	if err := c.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, c, "c", fifo(time.Second))
}

// Delete removes every node of the queue, messages and consumers
// included, and fires the metadata watch of Load; a second Delete, Info
// and Load answer ErrQueueNotFound.
func TestCatalogDelete(t *testing.T) {
	conn := zktest.Conn(t)
	c := newCatalog(t, conn, zkqueue.CatalogConfig{})
	ctx := context.Background()
	mustCreate(t, c, "q", fifo(time.Second))
	p := c.Path("q")
	for _, n := range []string{p + "/items/qn-", p + "/consumers/b1~", p + "/start"} {
		if _, err := conn.Create(n, nil, zk.FlagSequence, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	_, watch, err := c.Load("q")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-watch:
	case <-time.After(30 * time.Second):
		t.Fatal("the metadata watch did not fire")
	}
	if zktest.Exists(t, conn, p) {
		t.Fatal("the queue's node is still there")
	}
	if err := c.Delete(ctx, "q"); !errors.Is(err, zkqueue.ErrQueueNotFound) {
		t.Fatalf("second delete: %v, want ErrQueueNotFound", err)
	}
	if _, _, err := c.Load("q"); !errors.Is(err, zkqueue.ErrQueueNotFound) {
		t.Fatalf("Load: %v, want ErrQueueNotFound", err)
	}
}

// A child created between a deletion's listing of a node and the node's
// delete (a publisher's message in items/, a consumer's registration
// recreating consumers/ under the queue's node) does not fail Delete with
// a node-not-empty error: the node is listed again, and the queue is gone.
// Staged deterministically at both levels with the listing hook.
func TestCatalogDeleteChildCreatedAfterListing(t *testing.T) {
	conn := zktest.Conn(t)
	for _, level := range []string{"items", "queue"} {
		t.Run(level, func(t *testing.T) {
			c := newCatalog(t, conn, zkqueue.CatalogConfig{})
			mustCreate(t, c, "b", fifo(time.Second))
			p := c.Path("b")
			target, late := p+"/items", p+"/items/qn-"
			if level == "queue" {
				target, late = p, p+"/consumers" // parents are gone by then
			}
			staged := 0
			zkqueue.SetCatalogListedHook(c, func(listed string) {
				if listed != target || staged > 0 {
					return
				}
				staged++
				if _, err := conn.Create(late, nil, zk.FlagSequence, zk.WorldACL(zk.PermAll)); err != nil {
					t.Errorf("staging: %v", err)
				}
			})
			if err := c.Delete(context.Background(), "b"); err != nil {
				t.Fatalf("delete with a child created after the listing: %v", err)
			}
			if staged != 1 {
				t.Fatalf("staged %d times, want 1", staged)
			}
			if zktest.Exists(t, conn, p) {
				t.Fatal("the queue's node is still there")
			}
		})
	}
}

// markQueue stages a Delete that marked the queue and went no further,
// after deleting its items parent (a deleter that died half-way).
func markQueue(t *testing.T, conn *zk.Conn, c *zkqueue.Catalog, name string) int32 {
	t.Helper()
	st, _, err := c.Lookup(name)
	if err != nil || st.Err != nil {
		t.Fatal(err, st.Err)
	}
	st.Spec.Deleting = true
	data, err := st.Spec.Encode()
	if err != nil {
		t.Fatal(err)
	}
	stat, err := conn.Set(c.Path(name), data, st.Version)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Delete(c.Path(name)+"/items", -1); err != nil {
		t.Fatal(err)
	}
	return stat.Version
}

// A queue marked for deletion is absent to Info and Load, listed by List
// and Names (for sweeps), seen by Lookup with its mark's version; Create
// finishes the deletion and creates the queue anew, and a deleter
// resuming with the old mark's version leaves the new queue alone.
func TestCatalogMarkedQueue(t *testing.T) {
	conn := zktest.Conn(t)
	c := newCatalog(t, conn, zkqueue.CatalogConfig{})
	ctx := context.Background()
	mustCreate(t, c, "q", fifo(time.Second))
	version := markQueue(t, conn, c, "q")
	if _, err := c.Info("q"); !errors.Is(err, zkqueue.ErrQueueNotFound) {
		t.Fatalf("Info of a marked queue: %v, want ErrQueueNotFound", err)
	}
	if _, _, err := c.Load("q"); !errors.Is(err, zkqueue.ErrQueueNotFound) {
		t.Fatalf("Load of a marked queue: %v, want ErrQueueNotFound", err)
	}
	if names, _, err := c.Names(); err != nil || !slices.Equal(names, []string{"q"}) {
		t.Fatalf("Names: %v, %v", names, err)
	}
	st, _, err := c.Lookup("q")
	if err != nil || st.Err != nil || !st.Spec.Deleting || st.Version != version || st.Modified.IsZero() {
		t.Fatalf("Lookup of a marked queue: %+v, %v", st, err)
	}
	fresh := mustCreate(t, c, "q", zkqueue.Spec{Kind: zkqueue.KindPriority, Visibility: time.Second})
	if info, err := c.Info("q"); err != nil || !reflect.DeepEqual(info, fresh) {
		t.Fatalf("Info after Create over a marked queue: %+v, %v; want %+v", info, err, fresh)
	}
	if err := c.FinishDelete(ctx, "q", version); err != nil {
		t.Fatal(err)
	}
	want := []string{"consumers", "dead", "delayed", "expired", "items", "leases", "members"}
	if nodes := queueNodes(t, conn, c.Path("q")); !slices.Equal(nodes, want) {
		t.Fatalf("a stale deleter touched the new queue: nodes %v, want %v", nodes, want)
	}
	// A FinishDelete of the current, unmarked incarnation does nothing.
	if err := c.FinishDelete(ctx, "q", 0); err != nil || !zktest.Exists(t, conn, c.Path("q")+"/items") {
		t.Fatalf("FinishDelete of an unmarked queue: %v, or it deleted", err)
	}
}

// A queue left without some of its parents (metadata not marked): Create
// with the same configuration creates the missing ones.
func TestCatalogRepair(t *testing.T) {
	conn := zktest.Conn(t)
	c := newCatalog(t, conn, zkqueue.CatalogConfig{})
	s := mustCreate(t, c, "q", fifo(time.Second))
	for _, sub := range []string{"items", "members"} {
		if err := conn.Delete(c.Path("q")+"/"+sub, -1); err != nil {
			t.Fatal(err)
		}
	}
	if got := mustCreate(t, c, "q", s); !reflect.DeepEqual(got, s) {
		t.Fatalf("create again: %+v, want %+v", got, s)
	}
	want := []string{"consumers", "dead", "delayed", "expired", "items", "leases", "members"}
	if nodes := queueNodes(t, conn, c.Path("q")); !slices.Equal(nodes, want) {
		t.Fatalf("queue nodes %v, want %v", nodes, want)
	}
}

// The stored form: the keys the queues of earlier releases have, a round
// trip, unknown versions and kinds rejected, a mark over anything decoded.
func TestSpecEncoding(t *testing.T) {
	s := zkqueue.Spec{Kind: zkqueue.KindSync, SyncMembers: 2, Visibility: 2500 * time.Millisecond,
		MaxDeliveries: 3, DeadLetter: true, Created: time.Date(2024, 5, 1, 2, 3, 4, 5e6, time.UTC)}
	data, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	const stored = `{"v":1,"kind":"sync","sync_members":2,"visibility_ms":2500,"max_deliveries":3,"dead_letter":true,"created":"2024-05-01T02:03:04.005Z"}`
	if string(data) != stored {
		t.Fatalf("encoded %s, want %s", data, stored)
	}
	if got, err := zkqueue.DecodeSpec(data); err != nil || !reflect.DeepEqual(got, s) {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, s)
	}
	for _, bad := range []string{`{"v":2,"kind":"fifo"}`, `{"v":1,"kind":"lifo"}`, `not json`} {
		if _, err := zkqueue.DecodeSpec([]byte(bad)); err == nil {
			t.Errorf("decoded %s", bad)
		}
	}
	if got, err := zkqueue.DecodeSpec([]byte(`{"v":7,"deleting":true}`)); err != nil || !got.Deleting {
		t.Fatalf("a mark: %+v, %v", got, err)
	}
}
