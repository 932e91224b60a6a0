package election_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
)

func newElection(t *testing.T, conn *zk.Conn, p string, opts ...election.Option) *election.Election {
	t.Helper()
	e, err := election.New(conn, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// campaign runs e.Campaign in the background; its result arrives on the
// channel.
func campaign(ctx context.Context, e *election.Election, value string) <-chan error {
	c := make(chan error, 1)
	go func() { c <- e.Campaign(ctx, []byte(value)) }()
	return c
}

func waitErr(t *testing.T, c <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
		return nil
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// children lists the election's candidate nodes.
func children(t *testing.T, conn *zk.Conn, p string) []string {
	t.Helper()
	c, _, err := conn.Children(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Five contenders, each with its own session, campaign four times each:
// every time exactly one leads (a marker only the leader may hold is an
// ephemeral node: a second leader's create would fail), the leader is the
// one Leader reports, and the fencing token grows with every leadership.
func TestOneLeaderAtATime(t *testing.T) {
	const contenders, rounds = 5, 4
	root := zktest.Root(t) + "/election"
	marker := zktest.Root(t) + "-marker"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var (
		leaders atomic.Int32
		mu      sync.Mutex
		tokens  []int64
		wg      sync.WaitGroup
	)
	errc := make(chan error, contenders*rounds)
	for i := range contenders {
		conn := zktest.Conn(t)
		e := newElection(t, conn, root)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				if err := leadOnce(ctx, e, conn, marker, fmt.Sprintf("c%d-r%d", i, r), &leaders, &mu, &tokens); err != nil {
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
	if len(tokens) != contenders*rounds {
		t.Fatalf("%d leaderships, want %d", len(tokens), contenders*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("fencing token %d after %d: want strictly increasing", tokens[i], tokens[i-1])
		}
	}
}

func leadOnce(ctx context.Context, e *election.Election, conn *zk.Conn, marker, value string,
	leaders *atomic.Int32, mu *sync.Mutex, tokens *[]int64) error {
	if err := e.Campaign(ctx, []byte(value)); err != nil {
		return err
	}
	if n := leaders.Add(1); n != 1 {
		return fmt.Errorf("%d leaders at once", n)
	}
	if _, err := conn.Create(marker, []byte(value), zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		return fmt.Errorf("taking the leader's marker: %w", err)
	}
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	if l.Key != e.Key() || l.Token != e.Token() || string(l.Value) != value {
		return fmt.Errorf("Leader() = %s %d %q, want us: %s %d %q", l.Key, l.Token, l.Value, e.Key(), e.Token(), value)
	}
	if isClosed(e.Done()) {
		return errors.New("Done closed while leading")
	}
	mu.Lock()
	*tokens = append(*tokens, e.Token())
	mu.Unlock()
	if err := conn.Delete(marker, -1); err != nil {
		return fmt.Errorf("dropping the marker: %w", err)
	}
	leaders.Add(-1)
	done := e.Done()
	if err := e.Resign(ctx); err != nil {
		return err
	}
	if !isClosed(done) {
		return errors.New("Done still open after Resign")
	}
	return nil
}

// Six candidates queue up; the leader resigns five times over. Each
// candidate waits for the node just before its own, and each resignation
// is seen (as a NodeDeleted watch event, counted on each session) by the
// successor alone: with every candidate watching the leader, each
// resignation would wake them all.
func TestHerdFree(t *testing.T) {
	const n = 6
	root := zktest.Root(t) + "/election"
	var mu sync.Mutex
	waits := map[string][]string{} // candidate -> the predecessors it waited for
	t.Cleanup(election.SetWaitingHook(func(key, pred string) {
		mu.Lock()
		waits[path.Base(key)] = append(waits[path.Base(key)], pred)
		mu.Unlock()
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	conns := make([]*zk.Conn, n)
	dels := make([]*zktest.Deletions, n)
	els := make([]*election.Election, n)
	results := make([]<-chan error, n)
	keys := make([]string, n)
	for i := range n {
		conns[i], dels[i] = zktest.ConnCounting(t, []string{zktest.Addr(t)}, 4*time.Second)
		els[i] = newElection(t, conns[i], root)
		results[i] = campaign(ctx, els[i], fmt.Sprint("c", i))
		zktest.WaitFor(t, 20*time.Second, "the candidate's node", func() bool { return els[i].Key() != "" })
		keys[i] = els[i].Key()
	}
	if err := waitErr(t, results[0], 20*time.Second, "the first to lead"); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 20*time.Second, "every other candidate waiting", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(waits) == n-1
	})
	for i := 1; i < n; i++ {
		if got := waits[path.Base(keys[i])]; len(got) != 1 || got[0] != path.Base(keys[i-1]) {
			t.Fatalf("candidate %d waited for %v, want only its predecessor %s", i, got, path.Base(keys[i-1]))
		}
	}

	for i := 0; i < n-1; i++ {
		if err := els[i].Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, results[i+1], 20*time.Second, fmt.Sprintf("candidate %d to lead", i+1)); err != nil {
			t.Fatal(err)
		}
		// ZooKeeper delivers a session's watch event before the answer
		// to any later read of that session that sees the change: once
		// each session has seen the node gone, its count is final.
		for j := i + 1; j < n; j++ {
			if ok, _, err := conns[j].Exists(keys[i]); err != nil || ok {
				t.Fatalf("session %d still sees %s (%v)", j, keys[i], err)
			}
			want := 0
			if j == i+1 {
				want = 1
			}
			if got := dels[j].Count(keys[i]); got != want {
				t.Errorf("resignation of candidate %d: session %d got %d deletion events, want %d", i, j, got, want)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k, w := range waits {
		if len(w) != 1 {
			t.Errorf("candidate %s waited %d times (%v), want once", k, len(w), w)
		}
	}
}

// A Campaign whose ctx ends while it waits returns ctx.Err() and leaves no
// node; one whose ctx has ended already creates none.
func TestCampaignCancelled(t *testing.T) {
	root := zktest.Root(t) + "/election"
	conn := zktest.Conn(t)
	a := newElection(t, conn, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Campaign(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan string, 1)
	t.Cleanup(election.SetWaitingHook(func(key, _ string) {
		select {
		case waiting <- key:
		default:
		}
	}))

	b := newElection(t, zktest.Conn(t), root)
	bctx, bcancel := context.WithCancel(ctx)
	res := campaign(bctx, b, "b")
	select {
	case <-waiting:
	case <-time.After(20 * time.Second):
		t.Fatal("b never waited")
	}
	bcancel()
	if err := waitErr(t, res, 20*time.Second, "the cancelled campaign"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Campaign: got %v, want context.Canceled", err)
	}
	if got := children(t, conn, root); len(got) != 1 || root+"/"+got[0] != a.Key() {
		t.Fatalf("candidates after the cancel: %v, want only the leader's %s", got, a.Key())
	}
	if b.Key() != "" || b.Token() != 0 || !isClosed(b.Done()) {
		t.Fatalf("cancelled candidate: key %q token %d, want none", b.Key(), b.Token())
	}
	if err := b.Campaign(bctx, []byte("b")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Campaign with an ended ctx: got %v, want context.Canceled", err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if got := children(t, conn, root); len(got) != 0 {
		t.Fatalf("candidates left: %v", got)
	}
	if _, err := a.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader of an empty election: got %v, want ErrNoLeader", err)
	}
}

// The leader's session expires (its network is cut for longer than the
// session timeout): the next candidate leads with a greater token, and the
// old leader's Done closes once its client learns of the expiry; it can
// then campaign again with its new session.
func TestLeaderSessionExpiry(t *testing.T) {
	root := zktest.Root(t) + "/election"
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	connA, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 2*time.Second)
	a := newElection(t, connA, root)
	b := newElection(t, zktest.Conn(t), root)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := a.Campaign(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	aToken, aDone := a.Token(), a.Done()
	bRes := campaign(ctx, b, "b")
	zktest.WaitFor(t, 20*time.Second, "b's node", func() bool { return b.Key() != "" })

	proxy.Cut()
	if err := waitErr(t, bRes, 60*time.Second, "b to lead after a's session expired"); err != nil {
		t.Fatal(err)
	}
	if b.Token() <= aToken {
		t.Fatalf("token %d after %d: want greater", b.Token(), aToken)
	}
	proxy.Restore()
	select {
	case <-aDone:
	case <-time.After(60 * time.Second):
		t.Fatal("the expired leader's Done did not close")
	}
	if err := a.Proclaim(ctx, []byte("a2")); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("Proclaim after the loss: got %v, want ErrNotLeader", err)
	}
	if a.Token() != 0 || a.Key() != "" {
		t.Fatalf("after the loss: token %d key %q, want none", a.Token(), a.Key())
	}

	// Again, with the new session: behind b, then leading.
	if err := zkutil.WaitConnected(connA, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	aRes := campaign(ctx, a, "a again")
	zktest.WaitFor(t, 20*time.Second, "a's new node", func() bool { return a.Key() != "" })
	bToken := b.Token()
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, aRes, 20*time.Second, "a to lead again"); err != nil {
		t.Fatal(err)
	}
	if a.Token() <= bToken {
		t.Fatalf("token %d after b's %d: want greater", a.Token(), bToken)
	}
}

// Closing the leader's connection ends its leadership (Done closes) and the
// next candidate leads.
func TestLeaderConnectionClosed(t *testing.T) {
	root := zktest.Root(t) + "/election"
	connA, err := zkutil.Connect([]string{zktest.Addr(t)}, 4*time.Second, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(connA.Close)
	a := newElection(t, connA, root)
	b := newElection(t, zktest.Conn(t), root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.Campaign(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	bRes := campaign(ctx, b, "b")
	zktest.WaitFor(t, 20*time.Second, "b's node", func() bool { return b.Key() != "" })
	done := a.Done()
	connA.Close()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Done did not close with the connection")
	}
	if err := waitErr(t, bRes, 20*time.Second, "b to lead"); err != nil {
		t.Fatal(err)
	}
}

// Another client deleting the leader's node ends the leadership.
func TestLeaderNodeDeleted(t *testing.T) {
	root := zktest.Root(t) + "/election"
	e := newElection(t, zktest.Conn(t), root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Campaign(ctx, []byte("v")); err != nil {
		t.Fatal(err)
	}
	done := e.Done()
	if err := zktest.Conn(t).Delete(e.Key(), -1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Done did not close when the node was deleted")
	}
	if e.Token() != 0 {
		t.Fatalf("token %d after the loss, want 0", e.Token())
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatalf("Resign after the loss: %v", err)
	}
}

// A candidate node of our own live session that Campaign did not create (a
// create whose answer was lost) is deleted: owned by a live session, it
// would otherwise never go, and stall the election for every candidate
// behind it.
func TestOrphanOfOwnSessionRemoved(t *testing.T) {
	root := zktest.Root(t) + "/election"
	conn := zktest.Conn(t)
	e := newElection(t, conn, root)
	orphan, err := conn.Create(root+"/n-", []byte("lost answer"), zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other := newElection(t, zktest.Conn(t), root)
	otherRes := campaign(ctx, other, "other") // stalled behind the orphan
	zktest.WaitFor(t, 20*time.Second, "the other candidate's node", func() bool { return other.Key() != "" })
	eRes := campaign(ctx, e, "me")
	if err := waitErr(t, otherRes, 20*time.Second, "the candidate behind the orphan to lead"); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := conn.Exists(orphan); ok {
		t.Fatalf("orphan %s still there", orphan)
	}
	select {
	case err := <-eRes:
		t.Fatalf("Campaign behind the leader returned %v while the leader leads", err)
	default:
	}
	if err := other.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, eRes, 20*time.Second, "us to lead"); err != nil {
		t.Fatal(err)
	}
	if got := children(t, conn, root); len(got) != 1 || root+"/"+got[0] != e.Key() {
		t.Fatalf("candidates: %v, want only ours, %s", got, e.Key())
	}

	// Alone, behind an orphan of our own: we lead.
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if orphan, err = conn.Create(root+"/n-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if err := e.Campaign(ctx, []byte("me")); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := conn.Exists(orphan); ok {
		t.Fatalf("orphan %s still there", orphan)
	}
}

// Proclaim changes the leader's value (a versioned write): Leader and
// Observe see it; it fails for a non-leader and after another client
// wrote the node.
func TestProclaim(t *testing.T) {
	root := zktest.Root(t) + "/election"
	conn := zktest.Conn(t)
	e := newElection(t, conn, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Proclaim(ctx, []byte("x")); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("Proclaim before Campaign: got %v, want ErrNotLeader", err)
	}
	if err := e.Campaign(ctx, []byte("v1")); err != nil {
		t.Fatal(err)
	}
	token := e.Token()
	for i, v := range []string{"v2", "v3"} {
		if err := e.Proclaim(ctx, []byte(v)); err != nil {
			t.Fatal(err)
		}
		l, err := e.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(l.Value) != v || l.Version != int32(i+1) || l.Token != token || l.Key != e.Key() {
			t.Fatalf("Leader after Proclaim(%s) = %+v", v, l)
		}
	}
	if isClosed(e.Done()) {
		t.Fatal("Proclaim ended the leadership")
	}
	if _, err := zktest.Conn(t).Set(e.Key(), []byte("someone else"), -1); err != nil {
		t.Fatal(err)
	}
	if err := e.Proclaim(ctx, []byte("v4")); !errors.Is(err, zk.ErrBadVersion) {
		t.Fatalf("Proclaim over another client's write: got %v, want zk.ErrBadVersion", err)
	}
}

// Observe reports each leader in turn, and each value a leader proclaims,
// with growing tokens; the stream closes with its ctx.
func TestObserve(t *testing.T) {
	const n = 4
	root := zktest.Root(t) + "/election"
	obs := newElection(t, zktest.Conn(t), root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	octx, ocancel := context.WithCancel(ctx)
	stream := obs.Observe(octx)
	next := func(what string) election.LeaderInfo {
		t.Helper()
		select {
		case l, ok := <-stream:
			if !ok {
				t.Fatalf("stream closed, waiting for %s", what)
			}
			return l
		case <-time.After(20 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
		return election.LeaderInfo{}
	}

	els := make([]*election.Election, n)
	results := make([]<-chan error, n)
	for i := range n {
		els[i] = newElection(t, zktest.Conn(t), root)
		results[i] = campaign(ctx, els[i], fmt.Sprint("c", i))
		zktest.WaitFor(t, 20*time.Second, "the candidate's node", func() bool { return els[i].Key() != "" })
	}
	var last int64
	for i, e := range els {
		if err := waitErr(t, results[i], 20*time.Second, "the next leader"); err != nil {
			t.Fatal(err)
		}
		l := next(fmt.Sprint("leader ", i))
		if l.Key != e.Key() || string(l.Value) != fmt.Sprint("c", i) || l.Token != e.Token() || l.Token <= last {
			t.Fatalf("observed %+v, want %s c%d token %d (after %d)", l, e.Key(), i, e.Token(), last)
		}
		last = l.Token
		if err := e.Proclaim(ctx, []byte(fmt.Sprint("c", i, "-2"))); err != nil {
			t.Fatal(err)
		}
		l = next(fmt.Sprint("leader ", i, "'s new value"))
		if l.Key != e.Key() || !bytes.Equal(l.Value, []byte(fmt.Sprint("c", i, "-2"))) || l.Version != 1 || l.Token != last {
			t.Fatalf("observed %+v, want the new value of %s", l, e.Key())
		}
		if err := e.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ocancel()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-stream:
			if !ok {
				return
			}
			t.Fatalf("unexpected leader after the last resigned: %+v", l)
		case <-deadline:
			t.Fatal("stream not closed after its ctx ended")
		}
	}
}

// Resign is idempotent; Done is closed while not leading; an Election
// campaigns again after resigning, with a greater token.
func TestResign(t *testing.T) {
	root := zktest.Root(t) + "/election"
	conn := zktest.Conn(t)
	e := newElection(t, conn, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Resign(ctx); err != nil {
		t.Fatalf("Resign without a campaign: %v", err)
	}
	if !isClosed(e.Done()) {
		t.Fatal("Done open while not leading")
	}
	var last int64
	for round := range 3 {
		if err := e.Campaign(ctx, []byte("v")); err != nil {
			t.Fatal(err)
		}
		if e.Token() <= last {
			t.Fatalf("round %d: token %d after %d", round, e.Token(), last)
		}
		last = e.Token()
		key, done := e.Key(), e.Done()
		for range 2 {
			if err := e.Resign(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if !isClosed(done) {
			t.Fatal("Done open after Resign")
		}
		if ok, _, _ := conn.Exists(key); ok {
			t.Fatalf("%s still there after Resign", key)
		}
	}
}

// One session has one candidate per election: a second Campaign, through
// the same Election or another on the same connection, is refused while
// the first leads or waits.
func TestOneCandidatePerSession(t *testing.T) {
	root := zktest.Root(t) + "/election"
	conn := zktest.Conn(t)
	e1 := newElection(t, conn, root)
	e2 := newElection(t, conn, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e1.Campaign(ctx, []byte("1")); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*election.Election{e1, e2} {
		if err := e.Campaign(ctx, []byte("again")); !errors.Is(err, election.ErrCampaigning) {
			t.Fatalf("second Campaign: got %v, want ErrCampaigning", err)
		}
	}
	if isClosed(e1.Done()) {
		t.Fatal("the refused Campaign ended the leadership")
	}
	if err := e1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e2.Campaign(ctx, []byte("2")); err != nil {
		t.Fatalf("Campaign after the other resigned: %v", err)
	}
	// A different election on the same session is independent.
	e3 := newElection(t, conn, root+"-other")
	if err := e3.Campaign(ctx, []byte("3")); err != nil {
		t.Fatal(err)
	}
}

// Close ends a waiting Campaign (ErrClosed, its node deleted) and the
// Observe streams, and resigns a leadership.
func TestClose(t *testing.T) {
	root := zktest.Root(t) + "/election"
	conn := zktest.Conn(t)
	leader := newElection(t, zktest.Conn(t), root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := leader.Campaign(ctx, []byte("l")); err != nil {
		t.Fatal(err)
	}
	e, err := election.New(conn, root)
	if err != nil {
		t.Fatal(err)
	}
	stream := e.Observe(ctx)
	res := campaign(ctx, e, "w")
	zktest.WaitFor(t, 20*time.Second, "the candidate's node", func() bool { return e.Key() != "" })
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, res, 20*time.Second, "the closed campaign"); !errors.Is(err, election.ErrClosed) {
		t.Fatalf("Campaign ended by Close: got %v, want ErrClosed", err)
	}
	for range stream { // drains the leader seen before Close; ends when closed
	}
	if got := children(t, conn, root); len(got) != 1 || root+"/"+got[0] != leader.Key() {
		t.Fatalf("candidates after Close: %v, want only %s", got, leader.Key())
	}
	if err := e.Campaign(ctx, nil); !errors.Is(err, election.ErrClosed) {
		t.Fatalf("Campaign after Close: got %v, want ErrClosed", err)
	}
	done := leader.Done()
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	if !isClosed(done) {
		t.Fatal("Done open after Close")
	}
	if got := children(t, conn, root); len(got) != 0 {
		t.Fatalf("candidates after the leader's Close: %v", got)
	}
}

func TestNew(t *testing.T) {
	conn := zktest.Conn(t)
	for _, p := range []string{"", "/", "rel", "/a/", "/a//b", "/a/./b"} {
		if _, err := election.New(conn, p); !errors.Is(err, election.ErrInvalid) {
			t.Errorf("New(%q): got %v, want ErrInvalid", p, err)
		}
	}
	if _, err := election.New(nil, "/a"); !errors.Is(err, election.ErrInvalid) {
		t.Errorf("New(nil conn): got %v, want ErrInvalid", err)
	}
	root := zktest.Root(t)
	e := newElection(t, conn, root+"/x/election", election.WithCreateParents(false))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Campaign(ctx, nil); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("Campaign without the election's node: got %v, want zk.ErrNoNode", err)
	}
	newElection(t, conn, root+"/x/election")
	if ok, _, err := conn.Exists(root + "/x/election"); err != nil || !ok {
		t.Fatalf("New did not create the election's node (%v)", err)
	}
	if err := e.Campaign(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// Candidates are ordered by their sequence as a number; names that are not
// candidates are skipped.
func TestOrder(t *testing.T) {
	children := []string{"n-0000000010", "lock", "n-0000000009", "n-abc", "n-+000000001", "n-000000001",
		"n--000000005", "x-0000000001", "n-0000000011"}
	if got := election.Lowest(children); got != "n--000000005" {
		t.Errorf("Lowest = %q, want n--000000005", got)
	}
	for _, tc := range []struct {
		mine int32
		want string
	}{{11, "n-0000000010"}, {10, "n-0000000009"}, {9, "n--000000005"}, {-5, ""}} {
		got, ok := election.Predecessor(children, tc.mine)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("Predecessor(%d) = %q %v, want %q", tc.mine, got, ok, tc.want)
		}
	}
	if got := election.Lowest([]string{"lock"}); got != "" {
		t.Errorf("Lowest without candidates = %q", got)
	}
}

// A Campaign whose create fails with the connection may have created its
// node unseen (the answer lost): Close looks for this session's nodes and
// deletes them. The test stands in for the lost answer with a node the
// same session creates once the connection is back.
func TestCloseRemovesLostCreate(t *testing.T) {
	root := zktest.Root(t) + "/election"
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	conn, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 10*time.Second)
	e, err := election.New(conn, root)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	proxy.Cut()
	if err := e.Campaign(ctx, []byte("v")); err == nil || !zkutil.IsUnavailable(err) {
		t.Fatalf("Campaign without a connection: got %v, want an unavailable error", err)
	}
	proxy.Restore()
	// The state may still read "has session" before the client noticed
	// the cut, and a request queued while it reconnects through the cut
	// proxy fails: wait for one that succeeds.
	zktest.WaitFor(t, 30*time.Second, "a request after the reconnection", func() bool {
		_, _, err := conn.Exists(root)
		return err == nil
	})
	lost, err := conn.Create(root+"/n-", []byte("v"), zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if ok, _, _ := conn.Exists(lost); ok {
		t.Fatalf("%s still there after Close", lost)
	}
}
