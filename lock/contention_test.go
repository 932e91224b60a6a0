package lock_test

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/lock"
)

// Sixteen contenders, each with its own session, increment a counter kept
// in a ZooKeeper node 2,000 times in total, each increment under the lock.
// The counter ends exact; no two hold at once (each holder takes a marker,
// an ephemeral node a second holder could not create, and an in-process
// count); the fencing tokens grow with every grant.
func TestMutualExclusion(t *testing.T) {
	const contenders, total = 16, 2000
	root := zktest.Root(t)
	lockPath, counter, marker := root+"/lock", root+"/counter", root+"/holder"
	admin := zktest.Conn(t)
	newMutex(t, admin, lockPath)
	if _, err := admin.Create(counter, []byte("0"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 5*time.Minute)

	var (
		holding atomic.Int32
		mu      sync.Mutex
		tokens  []int64
		wg      sync.WaitGroup
	)
	errc := make(chan error, contenders)
	for i := range contenders {
		conn := zktest.Conn(t)
		m := newMutex(t, conn, lockPath, lock.WithValue([]byte(fmt.Sprint("c", i))))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range total / contenders {
				g, err := m.Lock(ctx)
				if err != nil {
					errc <- fmt.Errorf("contender %d round %d: %w", i, r, err)
					return
				}
				err = increment(conn, counter, marker, &holding)
				mu.Lock()
				tokens = append(tokens, g.Token())
				mu.Unlock()
				if uerr := g.Unlock(ctx); err == nil {
					err = uerr
				}
				if err != nil {
					errc <- fmt.Errorf("contender %d round %d: %w", i, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	data, _, err := admin.Get(counter)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != strconv.Itoa(total) {
		t.Fatalf("counter %s, want %d", data, total)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d: token %d after %d, want strictly increasing", i, tokens[i], tokens[i-1])
		}
	}
}

// increment adds one to the counter as a lock holder: it takes the marker
// (failing if another holder has it), reads, writes at the version read
// (failing if someone wrote meanwhile), and drops the marker.
func increment(conn *zk.Conn, counter, marker string, holding *atomic.Int32) error {
	if n := holding.Add(1); n != 1 {
		return fmt.Errorf("%d holders at once", n)
	}
	defer holding.Add(-1)
	if _, err := conn.Create(marker, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		return fmt.Errorf("taking the holder's marker: %w", err)
	}
	data, st, err := conn.Get(counter)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(string(data))
	if err != nil {
		return err
	}
	if _, err := conn.Set(counter, []byte(strconv.Itoa(n+1)), st.Version); err != nil {
		return fmt.Errorf("writing the counter: %w", err)
	}
	return conn.Delete(marker, -1)
}

// Six contenders queue up; the holder unlocks five times over. Each waiter
// waits for the node just before its own, and each release is seen (a
// NodeDeleted watch event, counted per session) by the successor alone:
// with every waiter watching the holder, each release would wake them all.
func TestHerdFree(t *testing.T) {
	const n = 6
	root := zktest.Root(t) + "/lock"
	var mu sync.Mutex
	waits := map[string][]string{} // contender's node -> the nodes it waited for
	t.Cleanup(lock.SetWaitingHook(func(key, pred string) {
		mu.Lock()
		waits[path.Base(key)] = append(waits[path.Base(key)], path.Base(pred))
		mu.Unlock()
	}))
	ctx := testCtx(t, 2*time.Minute)

	conns := make([]*zk.Conn, n)
	dels := make([]*zktest.Deletions, n)
	results := make([]<-chan result, n)
	for i := range n {
		conns[i], dels[i] = zktest.ConnCounting(t, []string{zktest.Addr(t)}, 4*time.Second)
		m := newMutex(t, conns[i], root)
		results[i] = async(ctx, m.Lock)
		zktest.WaitFor(t, 30*time.Second, "the contender's node", func() bool { return len(children(t, conns[0], root)) == i+1 })
	}
	grants := make([]*lock.Grant, n)
	r := await(t, results[0], "the first grant")
	if r.err != nil {
		t.Fatal(r.err)
	}
	grants[0] = r.g
	zktest.WaitFor(t, 30*time.Second, "every other contender waiting", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(waits) == n-1
	})
	for i := 1; i < n; i++ {
		if !pending(results[i]) {
			t.Fatalf("contender %d holds while the first does", i)
		}
	}
	for i := 0; i < n-1; i++ {
		if err := grants[i].Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		r := await(t, results[i+1], fmt.Sprintf("contender %d's grant", i+1))
		if r.err != nil {
			t.Fatal(r.err)
		}
		grants[i+1] = r.g
		// ZooKeeper delivers a session's watch event before the answer to
		// any later read of that session that sees the change: once each
		// session has seen the node gone, its count is final.
		for j := i + 1; j < n; j++ {
			if ok, _, err := conns[j].Exists(grants[i].Key()); err != nil || ok {
				t.Fatalf("session %d still sees %s (%v)", j, grants[i].Key(), err)
			}
			want := 0
			if j == i+1 {
				want = 1
			}
			if got := dels[j].Count(grants[i].Key()); got != want {
				t.Errorf("release by contender %d: session %d got %d deletion events, want %d", i, j, got, want)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < n; i++ {
		k := path.Base(grants[i].Key())
		if w := waits[k]; len(w) != 1 || w[0] != path.Base(grants[i-1].Key()) {
			t.Errorf("contender %d waited for %v, want only its predecessor %s", i, w, path.Base(grants[i-1].Key()))
		}
	}
	if err := grants[n-1].Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Readers share the lock; a writer excludes readers and writers; waiters
// are served in order, so a reader behind a waiting writer waits too.
func TestRWMutex(t *testing.T) {
	root := zktest.Root(t) + "/rw"
	conn := zktest.Conn(t)
	rws := make([]*lock.RWMutex, 5)
	for i := range rws {
		rws[i] = newRWMutex(t, zktest.Conn(t), root)
	}
	ctx := testCtx(t, 2*time.Minute)
	// Three readers hold at once.
	var readers []*lock.Grant
	for i := range 3 {
		g, err := rws[i].RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, g)
	}
	hs, err := lock.Holders(ctx, conn, root)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 3 || !hs[0].Shared {
		t.Fatalf("holders %+v, want the 3 readers", hs)
	}
	if _, err := rws[3].TryLock(ctx); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryLock while readers hold: got %v, want ErrLocked", err)
	}
	writer := async(ctx, rws[3].Lock)
	zktest.WaitFor(t, 30*time.Second, "the writer's node", func() bool { return len(children(t, conn, root)) == 4 })
	if _, err := rws[4].TryRLock(ctx); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryRLock behind a waiting writer: got %v, want ErrLocked", err)
	}
	lateReader := async(ctx, rws[4].RLock)
	zktest.WaitFor(t, 30*time.Second, "the late reader's node", func() bool { return len(children(t, conn, root)) == 5 })
	for i, g := range readers {
		if !pending(writer) {
			t.Fatalf("the writer holds while %d readers do", 3-i)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w := await(t, writer, "the writer's grant")
	if w.err != nil {
		t.Fatal(w.err)
	}
	if w.g.Token() <= readers[2].Token() {
		t.Fatalf("writer's token %d not above the readers' (%d)", w.g.Token(), readers[2].Token())
	}
	if _, err := rws[0].TryRLock(ctx); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryRLock while a writer holds: got %v, want ErrLocked", err)
	}
	if _, err := rws[1].TryLock(ctx); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryLock while a writer holds: got %v, want ErrLocked", err)
	}
	if !pending(lateReader) {
		t.Fatal("a reader holds with the writer")
	}
	if err := w.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := await(t, lateReader, "the late reader's grant")
	if r.err != nil {
		t.Fatal(r.err)
	}
	// A reader arriving now shares with the late reader at once.
	g, err := rws[0].TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock beside a reader: %v", err)
	}
	for _, g := range []*lock.Grant{g, r.g} {
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := children(t, conn, root); len(got) != 0 {
		t.Fatalf("nodes left: %v", got)
	}
}

// A Mutex and an RWMutex on one path: the Mutex counts as a writer.
func TestMutexAndRWMutex(t *testing.T) {
	root := zktest.Root(t) + "/mixed"
	m := newMutex(t, zktest.Conn(t), root)
	rw := newRWMutex(t, zktest.Conn(t), root)
	ctx := testCtx(t, time.Minute)
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.TryRLock(ctx); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryRLock while a Mutex holds: got %v, want ErrLocked", err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := rw.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryLock(ctx); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("Mutex.TryLock while a reader holds: got %v, want ErrLocked", err)
	}
	if err := r.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}
