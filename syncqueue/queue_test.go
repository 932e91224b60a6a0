package syncqueue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/syncqueue"
	"github.com/qbroker/qbroker/zkqueue"
)

func newQueue(t *testing.T, conn *zk.Conn, path string, members int, opts ...syncqueue.Option) *syncqueue.Queue {
	t.Helper()
	q, err := syncqueue.New(conn, path, members, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// waitJoined waits until the queue counts want members.
func waitJoined(ctx context.Context, t *testing.T, q *syncqueue.Queue, want int) {
	t.Helper()
	for {
		n, err := q.Joined(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Joined = %d, want %d", n, want)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// startGroup returns the member ids named by the start node, sorted.
func startGroup(t *testing.T, conn *zk.Conn, path string) []string {
	t.Helper()
	data, _, err := conn.Get(path + "/start")
	if err != nil {
		t.Fatalf("get start: %v", err)
	}
	lines := strings.Split(string(data), "\n")
	return lines[1:]
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Five members with their own sessions: with four present the queue is
// closed (no start node, TryDequeue fails with ErrNotOpen, every Join
// still blocks); the fifth Join opens it for everyone.
func TestOpensExactlyWithFifthMember(t *testing.T) {
	const n = 5
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := zktest.Root(t) + "/sq"
	conns := make([]*zk.Conn, n)
	qs := make([]*syncqueue.Queue, n)
	for i := range qs {
		conns[i] = zktest.Conn(t)
		qs[i] = newQueue(t, conns[i], path, n)
	}
	if _, err := qs[0].Publish(ctx, []byte("early")); err != nil {
		t.Fatal(err)
	}

	type joined struct {
		m   *syncqueue.Membership
		err error
	}
	results := make(chan joined, n)
	for i := 0; i < n-1; i++ {
		go func() {
			m, err := qs[i].Join(ctx, fmt.Sprintf("member-%d", i))
			results <- joined{m, err}
		}()
	}
	waitJoined(ctx, t, qs[0], n-1)
	for i, q := range qs {
		if _, err := q.TryDequeue(ctx); !errors.Is(err, syncqueue.ErrNotOpen) {
			t.Fatalf("queue %d: TryDequeue with %d members: got %v, want ErrNotOpen", i, n-1, err)
		}
	}
	if ok, _, err := conns[0].Exists(path + "/start"); err != nil || ok {
		t.Fatalf("start exists = %v, %v with %d members; want false", ok, err, n-1)
	}
	if open, err := qs[1].IsOpen(ctx); err != nil || open {
		t.Fatalf("IsOpen = %v, %v; want false", open, err)
	}
	select {
	case r := <-results:
		t.Fatalf("a Join returned (%v) with %d of %d members", r.err, n-1, n)
	case <-time.After(100 * time.Millisecond):
	}

	last, err := qs[n-1].Join(ctx, "member-last")
	if err != nil {
		t.Fatal(err)
	}
	members := []*syncqueue.Membership{last}
	for i := 0; i < n-1; i++ {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if !isClosed(r.m.Opened()) || r.m.Err() != nil {
			t.Errorf("member %s: Join returned but Opened not closed (err %v)", r.m.ID(), r.m.Err())
		}
		members = append(members, r.m)
	}
	want := []string{"member-0", "member-1", "member-2", "member-3", "member-last"}
	if got := startGroup(t, conns[0], path); !slices.Equal(got, want) {
		t.Errorf("start names %v, want %v", got, want)
	}
	m, err := qs[2].TryDequeue(ctx)
	if err != nil || string(m.Payload) != "early" {
		t.Fatalf("TryDequeue after opening = %q, %v; want early", m.Payload, err)
	}
	for _, m := range members {
		if err := m.Leave(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := qs[0].Joined(ctx); err != nil || n != 0 {
		t.Errorf("Joined after everyone left = %d, %v; want 0", n, err)
	}
	if open, err := qs[0].IsOpen(ctx); err != nil || !open {
		t.Errorf("IsOpen after everyone left = %v, %v; want true (open until Reset)", open, err)
	}
}

// A member whose session ends before the group is complete frees its
// place: with 4 of 5 joined and one session closed, a 5th member does not
// open the queue; a 6th does, and start names the five present.
func TestSessionLossFreesPlace(t *testing.T) {
	const n = 5
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := zktest.Root(t) + "/sq"
	admin := zktest.Conn(t)
	q := newQueue(t, admin, path, n)

	join := func(id string) (*syncqueue.Membership, *zk.Conn) {
		t.Helper()
		conn := zktest.Conn(t)
		m, err := newQueue(t, conn, path, n).JoinAsync(ctx, id)
		if err != nil {
			t.Fatalf("JoinAsync %s: %v", id, err)
		}
		t.Cleanup(func() { _ = m.Leave(context.Background()) })
		return m, conn
	}
	var ms []*syncqueue.Membership
	var lost *syncqueue.Membership
	for i := 0; i < 4; i++ {
		m, conn := join(fmt.Sprintf("m%d", i))
		if i == 2 {
			lost = m
			conn.Close() // ends the session: ZooKeeper deletes its ephemeral node
			continue
		}
		ms = append(ms, m)
	}
	waitJoined(ctx, t, q, 3)
	select {
	case <-lost.Done():
		if err := lost.Err(); !errors.Is(err, zk.ErrClosing) {
			t.Errorf("membership of the closed session: Err = %v, want zk.ErrClosing", err)
		}
	case <-ctx.Done():
		t.Fatal("membership of the closed session did not stop")
	}

	fifth, _ := join("m4")
	if open, err := q.IsOpen(ctx); err != nil || open {
		t.Fatalf("IsOpen with 4 present = %v, %v; want false", open, err)
	}
	if n, err := q.Joined(ctx); err != nil || n != 4 {
		t.Fatalf("Joined = %d, %v; want 4", n, err)
	}
	if isClosed(fifth.Opened()) {
		t.Fatal("group opened with 4 members present")
	}
	sixth, _ := join("m5")
	if !isClosed(sixth.Opened()) {
		t.Fatal("the member completing the group: Opened not closed when JoinAsync returned")
	}
	for _, m := range append(ms, fifth) {
		if err := m.Wait(ctx); err != nil {
			t.Fatalf("member %s: Wait = %v", m.ID(), err)
		}
	}
	if got, want := startGroup(t, admin, path), []string{"m0", "m1", "m3", "m4", "m5"}; !slices.Equal(got, want) {
		t.Errorf("start names %v, want %v", got, want)
	}
}

func TestJoinRejections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := zktest.Root(t) + "/sq"
	admin := zktest.Conn(t)
	q1 := newQueue(t, zktest.Conn(t), path, 2)
	q2 := newQueue(t, zktest.Conn(t), path, 2)

	for _, id := range []string{"", ".", "..", "a/b", "a@1", "a b", strings.Repeat("x", 201)} {
		if _, err := q1.JoinAsync(ctx, id); !errors.Is(err, syncqueue.ErrBadID) {
			t.Errorf("JoinAsync(%q): got %v, want ErrBadID", id, err)
		}
	}
	a, err := q1.JoinAsync(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Leave(ctx)
	if _, err := q2.JoinAsync(ctx, "a"); !errors.Is(err, syncqueue.ErrDuplicateMember) {
		t.Fatalf("second member a: got %v, want ErrDuplicateMember", err)
	}
	if n, err := q1.Joined(ctx); err != nil || n != 1 {
		t.Fatalf("Joined after a duplicate = %d, %v; want 1", n, err)
	}
	b, err := q2.Join(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Leave(ctx)
	if err := a.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := q2.Join(ctx, "c"); !errors.Is(err, syncqueue.ErrGroupFull) {
		t.Fatalf("Join of an open group: got %v, want ErrGroupFull", err)
	}
	if children, _, err := admin.Children(path + "/members"); err != nil || len(children) != 2 {
		t.Fatalf("members after a rejected join = %v, %v; want a and b", children, err)
	}
	// A member can leave an open group; the queue stays open.
	if err := b.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := q1.Join(ctx, "c"); !errors.Is(err, syncqueue.ErrGroupFull) {
		t.Fatalf("Join of an open group after a leave: got %v, want ErrGroupFull", err)
	}

	// Reset closes the queue.
	if err := q1.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := q1.TryDequeue(ctx); !errors.Is(err, syncqueue.ErrNotOpen) {
		t.Fatalf("TryDequeue after Reset: got %v, want ErrNotOpen", err)
	}
	if err := q1.Reset(ctx); err != nil {
		t.Fatalf("second Reset: %v", err)
	}
}

// A waiting member that is not named in the start node (it arrived after
// the group was counted) learns it is out: ErrGroupFull, node removed.
func TestLateMemberIsOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := zktest.Root(t) + "/sq"
	admin := zktest.Conn(t)
	q := newQueue(t, zktest.Conn(t), path, 3)
	late, err := q.JoinAsync(ctx, "late")
	if err != nil {
		t.Fatal(err)
	}
	defer late.Leave(ctx)
	// As if two others had completed a group of three counted before
	// "late" arrived.
	if _, err := admin.Create(path+"/start", []byte("qbroker-sync 1\nx\ny\nz"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if err := late.Wait(ctx); !errors.Is(err, syncqueue.ErrGroupFull) {
		t.Fatalf("Wait of a member left out: got %v, want ErrGroupFull", err)
	}
	if isClosed(late.Opened()) {
		t.Error("Opened closed for a member left out")
	}
	if ok, _, err := admin.Exists(path + "/members/late"); err != nil || ok {
		t.Errorf("member node of a member left out: exists = %v, %v; want false", ok, err)
	}
}

// Progress reports every change of the member count, then the opening,
// as a broker's JoinSync stream would.
func TestProgress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := zktest.Root(t) + "/sq"
	q := newQueue(t, zktest.Conn(t), path, 3)
	a, err := q.JoinAsync(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.Progress(ctx, syncqueue.Status{})
	if want := (syncqueue.Status{Joined: 1, Members: 3}); err != nil || st != want {
		t.Fatalf("Progress = %+v, %v; want %+v", st, err, want)
	}
	b, err := newQueue(t, zktest.Conn(t), path, 3).JoinAsync(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	st, err = a.Progress(ctx, st)
	if want := (syncqueue.Status{Joined: 2, Members: 3}); err != nil || st != want {
		t.Fatalf("Progress = %+v, %v; want %+v", st, err, want)
	}
	c, err := newQueue(t, zktest.Conn(t), path, 3).JoinAsync(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	for !st.Open {
		st, err = a.Progress(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
	}
	if want := (syncqueue.Status{Joined: 3, Members: 3, Open: true}); st != want {
		t.Fatalf("Progress = %+v; want %+v", st, want)
	}
	if err := b.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	st, err = a.Progress(ctx, st)
	if want := (syncqueue.Status{Joined: 2, Members: 3, Open: true}); err != nil || st != want {
		t.Fatalf("Progress after a leave = %+v, %v; want %+v", st, err, want)
	}
	// Leave releases a Progress that is waiting.
	errc := make(chan error, 1)
	go func() {
		_, err := a.Progress(ctx, st)
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, syncqueue.ErrLeft) {
		t.Fatalf("Progress across Leave: got %v, want ErrLeft", err)
	}
	if err := c.Leave(ctx); err != nil {
		t.Fatal(err)
	}
}

// Dequeue blocks until the queue opens, delivers FIFO once open, and goes
// back to waiting when the queue is reset while it waits for a message.
func TestDequeueWaitsForOpen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := zktest.Root(t) + "/sq"
	consumer := newQueue(t, zktest.Conn(t), path, 2)
	admin := newQueue(t, zktest.Conn(t), path, 2)
	ids, err := admin.PublishBatch(ctx, [][]byte{[]byte("1"), []byte("2")})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := admin.Peek(ctx); err != nil || m.ID != ids[0] {
		t.Fatalf("Peek of a closed queue = %v, %v; want %s", m.ID, err, ids[0])
	}

	type result struct {
		m   syncqueue.Message
		err error
	}
	dequeue := func() <-chan result {
		c := make(chan result, 1)
		go func() {
			m, err := consumer.Dequeue(ctx)
			c <- result{m, err}
		}()
		return c
	}
	notYet := func(c <-chan result, what string) {
		t.Helper()
		select {
		case r := <-c:
			t.Fatalf("Dequeue returned %q, %v %s", r.m.Payload, r.err, what)
		case <-time.After(150 * time.Millisecond):
		}
	}
	expect := func(c <-chan result, want string) {
		t.Helper()
		select {
		case r := <-c:
			if r.err != nil || string(r.m.Payload) != want {
				t.Fatalf("Dequeue = %q, %v; want %q", r.m.Payload, r.err, want)
			}
		case <-ctx.Done():
			t.Fatalf("Dequeue did not return %q", want)
		}
	}

	c := dequeue()
	notYet(c, "before the queue opened")
	if err := admin.Open(ctx); err != nil {
		t.Fatal(err)
	}
	expect(c, "1")
	expect(dequeue(), "2")

	c = dequeue() // open and empty: waits for a message
	time.Sleep(50 * time.Millisecond)
	if err := admin.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Publish(ctx, []byte("3")); err != nil {
		t.Fatal(err)
	}
	notYet(c, "after Reset")
	if n, err := admin.Len(ctx); err != nil || n != 1 {
		t.Fatalf("Len = %d, %v; want 1", n, err)
	}
	if err := admin.Open(ctx); err != nil {
		t.Fatal(err)
	}
	expect(c, "3")
	if err := admin.Open(ctx); err != nil {
		t.Fatalf("Open of an open queue: %v", err)
	}
	if n, err := admin.Purge(ctx); err != nil || n != 0 {
		t.Fatalf("Purge = %d, %v; want 0", n, err)
	}
}

func TestLimitsAndSentinels(t *testing.T) {
	ctx := context.Background()
	conn := zktest.Conn(t)
	path := zktest.Root(t) + "/sq"
	q := newQueue(t, conn, path, 1, zkqueue.WithMaxPayload(100), zkqueue.WithMaxBatchCount(2))
	if _, err := q.Publish(ctx, make([]byte, 101)); !errors.Is(err, zkqueue.ErrTooLarge) {
		t.Errorf("oversized payload: got %v, want ErrTooLarge", err)
	}
	if _, err := q.PublishBatch(ctx, [][]byte{{1}, {2}, {3}}); !errors.Is(err, zkqueue.ErrBatchTooLarge) {
		t.Errorf("batch over count: got %v, want ErrBatchTooLarge", err)
	}
	if _, err := q.PublishBatch(ctx, nil); !errors.Is(err, zkqueue.ErrEmptyBatch) {
		t.Errorf("empty batch: got %v, want ErrEmptyBatch", err)
	}
	m, err := q.Join(ctx, "solo") // a group of one opens at once
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave(ctx)
	if _, err := q.TryDequeue(ctx); !errors.Is(err, zkqueue.ErrEmpty) {
		t.Errorf("TryDequeue of an open empty queue: got %v, want ErrEmpty", err)
	}
	for _, n := range []int{0, -1, syncqueue.MaxMembers + 1} {
		if _, err := syncqueue.New(conn, path, n); err == nil {
			t.Errorf("New with %d members: got nil error", n)
		}
	}
	if _, err := syncqueue.New(conn, "relative", 2); err == nil {
		t.Error("New with a relative path: got nil error")
	}
}

// Eight joiners with their own sessions race for a group of five, three
// rounds: exactly five are opened, exactly the five named by start, and
// the other three get ErrGroupFull with their nodes removed.
func TestRacingJoinersFillExactlyN(t *testing.T) {
	const n, joiners = 5, 8
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	path := zktest.Root(t) + "/sq"
	admin := zktest.Conn(t)
	qs := make([]*syncqueue.Queue, joiners)
	for i := range qs {
		qs[i] = newQueue(t, zktest.Conn(t), path, n)
	}
	for round := 0; round < 3; round++ {
		type result struct {
			id  string
			m   *syncqueue.Membership
			err error
		}
		results := make(chan result, joiners)
		start := make(chan struct{})
		for i, q := range qs {
			go func() {
				id := fmt.Sprintf("r%d-j%d", round, i)
				<-start
				m, err := q.Join(ctx, id)
				results <- result{id, m, err}
			}()
		}
		close(start)
		var opened []string
		var members []*syncqueue.Membership
		full := 0
		for range qs {
			r := <-results
			switch {
			case r.err == nil:
				opened = append(opened, r.id)
				members = append(members, r.m)
			case errors.Is(r.err, syncqueue.ErrGroupFull):
				full++
			default:
				t.Fatalf("round %d: Join %s: %v", round, r.id, r.err)
			}
		}
		slices.Sort(opened)
		if got := startGroup(t, admin, path); len(opened) != n || full != joiners-n || !slices.Equal(got, opened) {
			t.Fatalf("round %d: opened %v, %d group full; start names %v; want %d opened, all named", round, opened, full, got, n)
		}
		if c, _, err := admin.Children(path + "/members"); err != nil || len(c) != n {
			t.Fatalf("round %d: members %v, %v; want the %d opened", round, c, err, n)
		}
		for _, m := range members {
			if err := m.Leave(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := qs[0].Reset(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
