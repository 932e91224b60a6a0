package twophase_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/twophase"
)

const waitLong = 30 * time.Second

// decisions counts, per transaction, the decision nodes created: a
// transaction must never get two.
type decisions struct {
	mu sync.Mutex
	n  map[string]int
}

// countDecisions installs the counter; call it before starting any Tx, so
// that its reset runs after their Close.
func countDecisions(t *testing.T) *decisions {
	d := &decisions{n: make(map[string]int)}
	t.Cleanup(twophase.SetDecidedHook(func(p string, _ twophase.Decision) {
		d.mu.Lock()
		d.n[p]++
		d.mu.Unlock()
	}))
	return d
}

func (d *decisions) count(p string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[p]
}

func begin(t *testing.T, conn *zk.Conn, p string, parts []string, timeout time.Duration) *twophase.Tx {
	t.Helper()
	tx, err := twophase.Begin(context.Background(), conn, p, twophase.Plan{Participants: parts, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Close() })
	return tx
}

// join joins p as name on a session of its own.
func join(t *testing.T, p, name string) (*twophase.Tx, *zk.Conn) {
	t.Helper()
	conn := zktest.Conn(t)
	tx, err := twophase.Join(context.Background(), conn, p, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Close() })
	return tx, conn
}

func vote(t *testing.T, tx *twophase.Tx, v twophase.Vote) {
	t.Helper()
	if err := tx.Vote(context.Background(), v); err != nil {
		t.Fatalf("vote %v: %v", v, err)
	}
}

func wait(t *testing.T, tx *twophase.Tx) twophase.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	d, err := tx.Wait(ctx)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	return d
}

// agree waits for every Tx and checks that they, and Outcome read on a
// fresh session, all hold the same decision, made once; it returns it.
func agree(t *testing.T, dc *decisions, p string, txs ...*twophase.Tx) twophase.Decision {
	t.Helper()
	want, err := twophase.Outcome(context.Background(), zktest.Conn(t), p)
	for _, tx := range txs {
		got := wait(t, tx)
		if err != nil { // the first read may precede the decision
			want, err = got, nil
		}
		if got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
	}
	if out, err := twophase.Outcome(context.Background(), zktest.Conn(t), p); err != nil || out != want {
		t.Errorf("Outcome: got %+v, %v, want %+v", out, err, want)
	}
	if n := dc.count(p); n != 1 {
		t.Errorf("decisions made: got %d, want 1", n)
	}
	return want
}

func voteData(t *testing.T, conn *zk.Conn, p, name string) string {
	t.Helper()
	data, _, err := conn.Get(p + "/p-" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestAllCommit(t *testing.T) {
	dc := countDecisions(t)
	p := zktest.Root(t) + "/tx"
	coord := begin(t, zktest.Conn(t), p, []string{"a", "b", "c"}, time.Minute)
	a, _ := join(t, p, "a")
	b, _ := join(t, p, "b")
	c, conn := join(t, p, "c")
	vote(t, a, twophase.Commit)
	vote(t, b, twophase.Commit)
	select {
	case <-c.Done():
		t.Fatal("decided before the last vote")
	default:
	}
	vote(t, c, twophase.Commit)
	d := agree(t, dc, p, coord, a, b, c)
	if !d.Committed || d.Reason != "all voted commit" {
		t.Errorf("got %+v, want a commit", d)
	}
	for _, n := range []string{"a", "b", "c"} {
		if got := voteData(t, conn, p, n); got != "commit" {
			t.Errorf("vote of %s: got %q, want commit", n, got)
		}
	}
	// A vote repeated (its first answer lost, say) is accepted; another
	// vote is not.
	if err := c.Vote(context.Background(), twophase.Commit); err != nil {
		t.Errorf("repeated vote: got %v, want nil", err)
	}
	if err := c.Vote(context.Background(), twophase.Abort); !errors.Is(err, twophase.ErrVoted) {
		t.Errorf("changed vote: got %v, want ErrVoted", err)
	}
	if out, _ := twophase.Outcome(context.Background(), conn, p); !out.Committed {
		t.Errorf("after a refused vote: got %+v, want the commit", out)
	}
}

func TestOneAbort(t *testing.T) {
	dc := countDecisions(t)
	p := zktest.Root(t) + "/tx"
	coord := begin(t, zktest.Conn(t), p, []string{"a", "b", "c"}, time.Minute)
	a, _ := join(t, p, "a")
	b, _ := join(t, p, "b")
	c, conn := join(t, p, "c")
	vote(t, a, twophase.Commit)
	vote(t, b, twophase.Abort)
	d := agree(t, dc, p, coord, a, b, c)
	if d.Committed || d.By != "b" || d.Reason != "b voted abort" {
		t.Errorf("got %+v, want an abort by b", d)
	}
	// c votes after the decision: recorded, without effect.
	vote(t, c, twophase.Commit)
	if got := voteData(t, conn, p, "c"); got != "commit" {
		t.Errorf("late vote of c: got %q, want commit", got)
	}
	if out, _ := twophase.Outcome(context.Background(), conn, p); out != d {
		t.Errorf("after c's vote: got %+v, want %+v", out, d)
	}
}

// A participant never votes; the coordinator is gone from the start: the
// other participants abort at the deadline, and the latecomer learns it.
func TestNeverVotesTimesOut(t *testing.T) {
	dc := countDecisions(t)
	p := zktest.Root(t) + "/tx"
	coordConn := zktest.Conn(t)
	coord := begin(t, coordConn, p, []string{"a", "b", "c"}, 2*time.Second)
	_ = coord.Close()
	coordConn.Close()
	a, _ := join(t, p, "a")
	b, conn := join(t, p, "b")
	vote(t, a, twophase.Commit)
	vote(t, b, twophase.Commit)
	d := agree(t, dc, p, a, b)
	if d.Committed || (d.By != "a" && d.By != "b") || d.Reason != "deadline passed: c did not vote" {
		t.Errorf("got %+v, want an abort at the deadline by a or b", d)
	}
	if time.Now().Before(a.Deadline()) {
		t.Errorf("decided before the deadline %v", a.Deadline())
	}
	if got := voteData(t, conn, p, "c"); got != "timeout" {
		t.Errorf("vote of c: got %q, want timeout", got)
	}
	c, _ := join(t, p, "c")
	if err := c.Vote(context.Background(), twophase.Commit); !errors.Is(err, twophase.ErrLate) {
		t.Errorf("late vote: got %v, want ErrLate", err)
	}
	if got := wait(t, c); got != d {
		t.Errorf("latecomer: got %+v, want %+v", got, d)
	}
}

// Participants vote commit and crash; the decision is made (by the
// coordinator's Tx or the last voter's), and the coordinator's session
// ends right after. Restarted, the participants read the
// decision.
func TestCoordinatorGoneAfterDecision(t *testing.T) {
	dc := countDecisions(t)
	p := zktest.Root(t) + "/tx"
	coordConn := zktest.Conn(t)
	coord := begin(t, coordConn, p, []string{"a", "b"}, time.Minute)
	for _, n := range []string{"a", "b"} {
		tx, conn := join(t, p, n)
		vote(t, tx, twophase.Commit)
		_ = tx.Close()
		conn.Close()
	}
	d := wait(t, coord)
	_ = coord.Close()
	coordConn.Close()
	// Whichever handle saw the last vote first decided: the coordinator's,
	// or the last voter's own before it closed.
	if !d.Committed || (d.By != twophase.Coordinator && d.By != "a" && d.By != "b") {
		t.Fatalf("got %+v, want a commit by the coordinator or a voter", d)
	}
	conn := zktest.Conn(t)
	if out, err := twophase.Outcome(context.Background(), conn, p); err != nil || out != d {
		t.Errorf("Outcome after restart: got %+v, %v, want %+v", out, err, d)
	}
	a, _ := join(t, p, "a")
	b, _ := join(t, p, "b")
	vote(t, a, twophase.Commit) // a restarted participant repeats its vote harmlessly
	agree(t, dc, p, a, b)

	// The coordinator aborts a second transaction and dies at once; a
	// participant that had joined and one that joins later both learn it.
	p2 := zktest.Root(t) + "/tx2"
	coordConn = zktest.Conn(t)
	coord = begin(t, coordConn, p2, []string{"a", "b"}, time.Minute)
	a2, _ := join(t, p2, "a")
	vote(t, a2, twophase.Commit)
	d2, err := coord.Abort(context.Background(), "cancelled")
	if err != nil {
		t.Fatal(err)
	}
	_ = coord.Close()
	coordConn.Close()
	b2, _ := join(t, p2, "b")
	got := agree(t, dc, p2, a2, b2)
	if got != d2 || got.Committed || got.By != twophase.Coordinator || got.Reason != "cancelled" {
		t.Errorf("got %+v, want the coordinator's abort %+v", got, d2)
	}
}

// Participants a and b both reach the deadline and are about to decide
// abort while c's vote, the last one, arrives: one decision in all, and the
// vote agrees with it.
func TestDeadlineRacesLastVote(t *testing.T) {
	for _, tc := range []struct {
		name      string
		voteFirst bool // c's vote lands before a and b try to abort
	}{
		{"vote before the aborts", true},
		{"vote concurrent", false},
	} {
		for round := range 2 {
			t.Run(fmt.Sprintf("%s/%d", tc.name, round), func(t *testing.T) {
				raceRound(t, tc.voteFirst, round)
			})
		}
	}
}

func raceRound(t *testing.T, voteFirst bool, round int) {
	dc := countDecisions(t)
	arrived := make(chan string, 8)
	release := make(chan struct{})
	var once sync.Map
	t.Cleanup(twophase.SetBeforeDecideHook(func(_, by string, d twophase.Decision) {
		if d.Committed || !strings.HasPrefix(d.Reason, "deadline passed") {
			return
		}
		if _, held := once.LoadOrStore(by, true); held {
			return // only a Tx's first attempt is held
		}
		arrived <- by
		select {
		case <-release:
		case <-time.After(waitLong):
		}
	}))
	p := zktest.Root(t) + "/tx"
	coordConn := zktest.Conn(t)
	coord := begin(t, coordConn, p, []string{"a", "b", "c"}, 3*time.Second)
	_ = coord.Close()
	a, _ := join(t, p, "a")
	b, _ := join(t, p, "b")
	vote(t, a, twophase.Commit)
	vote(t, b, twophase.Commit)
	held := map[string]bool{}
	for len(held) < 2 {
		select {
		case by := <-arrived:
			held[by] = true
		case <-time.After(waitLong):
			t.Fatalf("round %d: a and b did not both reach the deadline: %v", round, held)
		}
	}
	var c *twophase.Tx
	var cErr error
	if voteFirst {
		c, _ = join(t, p, "c")
		cErr = c.Vote(context.Background(), twophase.Commit)
		close(release)
	} else {
		close(release)
		c, _ = join(t, p, "c")
		cErr = c.Vote(context.Background(), twophase.Commit)
	}
	d := agree(t, dc, p, a, b, c)
	if voteFirst && (!d.Committed || cErr != nil) {
		t.Errorf("round %d: got %+v, vote %v, want a commit", round, d, cErr)
	}
	cData := voteData(t, coordConn, p, "c")
	t.Logf("decision %+v; c's vote: %v, reads %q", d, cErr, cData)
	switch {
	case d.Committed && (cErr != nil || cData != "commit"):
		t.Errorf("round %d: commit, but c's vote returned %v and reads %q", round, cErr, cData)
	case !d.Committed && (!errors.Is(cErr, twophase.ErrLate) || cData != "timeout"):
		t.Errorf("round %d: abort, but c's vote returned %v and reads %q", round, cErr, cData)
	}
}

func TestWaitHonoursContext(t *testing.T) {
	p := zktest.Root(t) + "/tx"
	conn := zktest.Conn(t)
	coord := begin(t, conn, p, []string{"a"}, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := twophase.Join(ctx, conn, p, "a"); !errors.Is(err, context.Canceled) {
		t.Errorf("Join with a cancelled ctx: got %v, want context.Canceled", err)
	}
	a, _ := join(t, p, "a")
	ctx, cancel = context.WithCancel(context.Background())
	res := make(chan error, 1)
	go func() {
		_, err := a.Wait(ctx)
		res <- err
	}()
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Wait: got %v, want context.Canceled", err)
		}
	case <-time.After(waitLong):
		t.Fatal("Wait did not return after its ctx ended")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	default:
		t.Error("Done open after Close")
	}
	if _, err := a.Wait(context.Background()); !errors.Is(err, twophase.ErrClosed) {
		t.Errorf("Wait after Close: got %v, want ErrClosed", err)
	}
	if err := a.Vote(context.Background(), twophase.Commit); err != nil {
		t.Errorf("Vote after Close: got %v, want nil (a vote needs no goroutine)", err)
	}
	if d := wait(t, coord); !d.Committed {
		t.Errorf("got %+v, want a commit", d)
	}
}

func TestInvalid(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	many := make([]string, twophase.MaxParticipants+1)
	for i := range many {
		many[i] = fmt.Sprintf("p%d", i)
	}
	for _, tc := range []struct {
		name    string
		path    string
		parts   []string
		timeout time.Duration
	}{
		{"relative path", "tx", []string{"a"}, time.Second},
		{"root path", "/", []string{"a"}, time.Second},
		{"unclean path", root + "/x/../tx", []string{"a"}, time.Second},
		{"no participants", root + "/tx", nil, time.Second},
		{"too many", root + "/tx", many, time.Second},
		{"slash in name", root + "/tx", []string{"a/b"}, time.Second},
		{"dot-dot name", root + "/tx", []string{".."}, time.Second},
		{"empty name", root + "/tx", []string{""}, time.Second},
		{"twice", root + "/tx", []string{"a", "a"}, time.Second},
		{"no timeout", root + "/tx", []string{"a"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := twophase.Begin(ctx, conn, tc.path, twophase.Plan{Participants: tc.parts, Timeout: tc.timeout}); !errors.Is(err, twophase.ErrInvalid) {
				t.Errorf("got %v, want ErrInvalid", err)
			}
		})
	}
	if ok, _, err := conn.Exists(root); err != nil || ok {
		t.Errorf("refused Begins created %s (%v)", root, err)
	}
	p := root + "/tx"
	coord := begin(t, conn, p, []string{"a"}, time.Minute)
	if _, err := twophase.Begin(ctx, conn, p, twophase.Plan{Participants: []string{"a"}, Timeout: time.Minute}); !errors.Is(err, twophase.ErrExists) {
		t.Errorf("second Begin: got %v, want ErrExists", err)
	}
	if _, err := twophase.Join(ctx, conn, p, "z"); !errors.Is(err, twophase.ErrNotParticipant) {
		t.Errorf("Join as a stranger: got %v, want ErrNotParticipant", err)
	}
	if _, err := twophase.Join(ctx, conn, p, "a/../a"); !errors.Is(err, twophase.ErrInvalid) {
		t.Errorf("Join with a bad name: got %v, want ErrInvalid", err)
	}
	if _, err := twophase.Join(ctx, conn, root+"/none", "a"); !errors.Is(err, twophase.ErrNoTransaction) {
		t.Errorf("Join a missing transaction: got %v, want ErrNoTransaction", err)
	}
	if err := coord.Vote(ctx, twophase.Commit); !errors.Is(err, twophase.ErrNotParticipant) {
		t.Errorf("coordinator's vote: got %v, want ErrNotParticipant", err)
	}
	a, _ := join(t, p, "a")
	if err := a.Vote(ctx, twophase.Vote(7)); !errors.Is(err, twophase.ErrInvalid) {
		t.Errorf("Vote(7): got %v, want ErrInvalid", err)
	}
	if _, err := twophase.Outcome(ctx, conn, p); !errors.Is(err, twophase.ErrUndecided) {
		t.Errorf("Outcome before the decision: got %v, want ErrUndecided", err)
	}
	if err := twophase.Delete(ctx, conn, p); !errors.Is(err, twophase.ErrUndecided) {
		t.Errorf("Delete before the decision: got %v, want ErrUndecided", err)
	}
	if got := voteData(t, conn, p, "a"); got != "" {
		t.Errorf("refused calls wrote a's vote: %q", got)
	}
}

func TestDelete(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	p := zktest.Root(t) + "/tx"
	begin(t, conn, p, []string{"a"}, time.Minute)
	a, _ := join(t, p, "a")
	vote(t, a, twophase.Abort)
	wait(t, a)
	if err := twophase.Delete(ctx, conn, p); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := conn.Exists(p); err != nil || ok {
		t.Errorf("after Delete: exists %v, %v", ok, err)
	}
	if _, err := twophase.Outcome(ctx, conn, p); !errors.Is(err, twophase.ErrNoTransaction) {
		t.Errorf("Outcome after Delete: got %v, want ErrNoTransaction", err)
	}
	if err := twophase.Delete(ctx, conn, p); err != nil {
		t.Errorf("second Delete: got %v, want nil", err)
	}
	p2 := zktest.Root(t) + "/tx"
	coord := begin(t, conn, p2, []string{"a", "b"}, time.Minute)
	if _, err := coord.Abort(ctx, "stop"); err != nil {
		t.Fatal(err)
	}
	if err := twophase.Delete(ctx, conn, p2); err != nil {
		t.Fatal(err)
	}
	if _, err := twophase.Join(ctx, conn, p2, "a"); !errors.Is(err, twophase.ErrNoTransaction) {
		t.Errorf("Join after Delete: got %v, want ErrNoTransaction", err)
	}
}
