package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// messageNodes counts the nodes in the segments of the queue at path.
func messageNodes(t *testing.T, conn *zk.Conn, path string) int {
	t.Helper()
	segs, _, err := conn.Children(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range segs {
		children, _, err := conn.Children(path + "/" + s)
		if err != nil {
			t.Fatal(err)
		}
		n += len(children)
	}
	return n
}

func packed() zkqueue.Option { return zkqueue.WithPacking(zkqueue.PackLimits{}) }

// TestPackedPublishTakeInOrder: a batch becomes one node; concurrent
// single publishes share nodes; every message is taken once, in order per
// producer, across takes of any size (the rest of a pack waits in the
// buffer).
func TestPackedPublishTakeInOrder(t *testing.T) {
	ctx := context.Background()
	path := zktest.Root(t) + "/q"
	conn := zktest.Conn(t)
	q := newQueue(t, conn, path, packed())
	batch := make([][]byte, 100)
	for i := range batch {
		batch[i] = []byte(fmt.Sprintf("b-%03d", i))
	}
	ids, err := q.PublishBatch(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 100 || !strings.HasSuffix(ids[0], "#1") || !strings.HasSuffix(ids[99], "#100") {
		t.Fatalf("ids %v ... %v", ids[0], ids[len(ids)-1])
	}
	if n := messageNodes(t, conn, path); n != 1 {
		t.Fatalf("%d message nodes after a batch of 100, want 1 pack", n)
	}
	const producers, each = 8, 50
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := q.Publish(ctx, []byte(fmt.Sprintf("p%d-%03d", p, i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	n, err := q.Len(ctx)
	if err != nil || n != 100+producers*each {
		t.Fatalf("Len = %d, %v; want %d", n, err, 100+producers*each)
	}
	nodes := messageNodes(t, conn, path)
	t.Logf("%d messages in %d nodes", 100+producers*each, nodes)
	if nodes >= 1+producers*each {
		t.Fatalf("%d nodes for %d concurrent single publishes: none shared a pack", nodes, producers*each)
	}
	seen := map[string]bool{}
	last := map[string]int{}
	for sizes := []int{1, 7, 64, 3}; len(seen) < 100+producers*each; sizes = append(sizes[1:], sizes[0]) {
		ms, err := q.Take(ctx, sizes[0], zkqueue.Room{}, false)
		if err != nil {
			t.Fatalf("after %d: %v", len(seen), err)
		}
		if len(ms) > sizes[0] {
			t.Fatalf("take %d returned %d", sizes[0], len(ms))
		}
		for _, m := range ms {
			if seen[m.ID] {
				t.Fatalf("%s delivered twice", m.ID)
			}
			seen[m.ID] = true
			var who string
			var i int
			p := string(m.Payload)
			fmt.Sscanf(strings.Replace(p, "-", " ", 1), "%s %d", &who, &i)
			if prev, ok := last[who]; ok && i <= prev {
				t.Fatalf("%s after %s-%03d", p, who, prev)
			}
			last[who] = i
			if m.Deliveries != 1 {
				t.Fatalf("%s: deliveries %d", m.ID, m.Deliveries)
			}
		}
	}
	if _, err := q.TryDequeue(ctx); err != zkqueue.ErrEmpty && !strings.Contains(fmt.Sprint(err), "empty") {
		t.Fatalf("after the drain: %v", err)
	}
}

// TestPackLeases: a pack leased whole and handed out in takes of any size;
// per-message acks (concurrent ones coalesced), a nack in the middle of
// the pack, an extend, a release past max deliveries into the dead
// letters, and an expiry of a partly acked pack swept: every message acked
// exactly once, a nacked or expired message back at its place before
// younger ones, an acked one never delivered again.
func TestPackLeases(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	items := newQueue(t, conn, root+"/items", packed())
	leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	batch := make([][]byte, 20)
	for i := range batch {
		batch[i] = []byte(fmt.Sprintf("m%02d", i))
	}
	if _, err := items.PublishBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	const ttl = time.Minute
	take := func(n int, ttl time.Duration) []zkqueue.Lease {
		t.Helper()
		ls, err := leases.Take(ctx, n, zkqueue.Room{}, ttl, false)
		if err != nil {
			t.Fatal(err)
		}
		return ls
	}
	first := take(5, ttl) // claims the pack: 5 handed out, 15 buffered
	if len(first) != 5 || string(first[0].Payload) != "m00" || string(first[4].Payload) != "m04" {
		t.Fatalf("first take: %d, %q..%q", len(first), first[0].Payload, first[len(first)-1].Payload)
	}
	if nodes, _, err := conn.Children(root + "/leases"); err != nil || len(nodes) != 2 {
		t.Fatalf("lease nodes %v, %v; want the pack's lease and its messages", nodes, err)
	}
	if n, _ := leases.InFlight(ctx); n != 20 {
		t.Fatalf("%d in flight, want the pack's 20", n)
	}
	rest := take(100, ttl) // the buffer's 15 only
	if len(rest) != 15 || string(rest[0].Payload) != "m05" {
		t.Fatalf("second take: %d from %q", len(rest), rest[0].Payload)
	}
	later, err := items.Publish(ctx, []byte("later")) // a node after the pack
	if err != nil {
		t.Fatal(err)
	}
	all := append(first, rest...)
	for _, le := range all {
		if le.FencingToken == 0 || le.FencingToken != all[0].FencingToken || le.Deliveries != 1 {
			t.Fatalf("%s: token %d, deliveries %d", le.ID, le.FencingToken, le.Deliveries)
		}
	}
	// Concurrent acks of m00..m09 are coalesced into few writes.
	var wg sync.WaitGroup
	for _, le := range all[:10] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := leases.Ack(ctx, le.Token); err != nil {
				t.Errorf("ack %s: %v", le.ID, err)
			}
		}()
	}
	wg.Wait()
	if _, err := leases.Ack(ctx, all[3].Token); !errors.Is(err, zkqueue.ErrUnknownLease) {
		t.Fatalf("second ack of %s: %v, want ErrUnknownLease", all[3].ID, err)
	}
	// A nack of m12: it comes back before "later", at its place.
	if _, out, err := leases.Nack(ctx, all[12].Token, 0, zkqueue.Policy{}); err != nil || out != zkqueue.Requeued {
		t.Fatalf("nack: %v, %v", out, err)
	}
	again := take(1, ttl) // (claims "later" too, into the buffer)
	if len(again) != 1 || again[0].ID != all[12].ID || again[0].Deliveries != 2 {
		t.Fatalf("after the nack: %+v, want %s delivered twice", again, all[12].ID)
	}
	if _, err := leases.Ack(ctx, again[0].Token); err != nil {
		t.Fatal(err)
	}
	// Extend m10; release m11 past max deliveries into the dead letters.
	if d, err := leases.Extend(ctx, all[10].Token, time.Hour); err != nil || time.Until(d) < 50*time.Minute {
		t.Fatalf("extend: %v, %v", d, err)
	}
	if _, out, ok, err := leases.Release(ctx, all[11].Token, zkqueue.Policy{MaxDeliveries: 1, DeadLetter: true}); err != nil || !ok || out != zkqueue.DeadLettered {
		t.Fatalf("release: %v %v %v", out, ok, err)
	}
	dead, err := leases.DeadLetters(ctx, 10)
	if err != nil || len(dead) != 1 || dead[0].ID != all[11].ID || string(dead[0].Payload) != "m11" {
		t.Fatalf("dead letters: %+v, %v", dead, err)
	}
	// The rest (m13..m19) expire: extend them to a short deadline and
	// sweep; they come back in order, ahead of "later".
	for _, le := range all[13:] {
		if _, err := leases.Extend(ctx, le.Token, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	sw := zkqueue.NewLeaseSweeper(zktest.Conn(t), root+"/items", root+"/leases", root+"/dead", zkqueue.SweeperConfig{})
	expired := sweepUntil(ctx, t, "the expired part of the pack swept", sw, zkqueue.Policy{}, 7)
	for _, e := range expired {
		if e.Outcome != zkqueue.Requeued {
			t.Fatalf("%s: outcome %v", e.Message.ID, e.Outcome)
		}
	}
	// (This Queue's snapshot may still hold "later": a FIFO snapshot is
	// walked to its end before messages another process put back are
	// seen.)
	var got []string
	for len(got) < 7 {
		for _, le := range take(100, ttl) {
			if le.ID == later {
				if _, err := leases.Ack(ctx, le.Token); err != nil {
					t.Fatal(err)
				}
				later = ""
				continue
			}
			got = append(got, string(le.Payload))
			if le.Deliveries != 2 {
				t.Fatalf("%s: deliveries %d, want 2", le.ID, le.Deliveries)
			}
			if _, err := leases.Ack(ctx, le.Token); err != nil {
				t.Fatal(err)
			}
		}
	}
	if want := "[m13 m14 m15 m16 m17 m18 m19]"; fmt.Sprint(got) != want {
		t.Fatalf("after the expiry: %v, want %v", got, want)
	}
	// m10 is still leased (extended); the redrive of m11 puts it back.
	if _, err := leases.Ack(ctx, all[10].Token); err != nil {
		t.Fatal(err)
	}
	if n, err := leases.Redrive(ctx, nil); err != nil || n != 1 {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	leases.Flush(ctx) // "later", if buffered, goes back
	var tail []string
	for {
		ls, err := leases.Take(ctx, 10, zkqueue.Room{}, ttl, false)
		if errors.Is(err, zkqueue.ErrEmpty) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, le := range ls {
			tail = append(tail, string(le.Payload))
			if _, err := leases.Ack(ctx, le.Token); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := "[m11]"
	if later != "" {
		want = "[m11 later]"
	}
	if fmt.Sprint(tail) != want {
		t.Fatalf("the rest: %v, want %s", tail, want)
	}
	if n, _ := leases.InFlight(ctx); n != 0 {
		t.Fatalf("%d leases left", n)
	}
}

// TestPackedPriorities: a batch across levels is a pack per level, in one
// transaction; the most urgent level's pack is taken first, and a take of
// one message hands out the most urgent message.
func TestPackedPriorities(t *testing.T) {
	ctx := context.Background()
	path := zktest.Root(t) + "/q"
	conn := zktest.Conn(t)
	q := newQueue(t, conn, path, packed(), zkqueue.WithPriorities())
	var drafts []zkqueue.Draft
	for i := range 60 {
		p := 9
		if i%3 == 0 {
			p = 2
		}
		drafts = append(drafts, zkqueue.Draft{Payload: []byte(fmt.Sprintf("%d-%02d", p, i)), Priority: p})
	}
	ids, err := q.PublishAll(ctx, drafts)
	if err != nil || len(ids) != 60 {
		t.Fatalf("publish: %d ids, %v", len(ids), err)
	}
	if n := messageNodes(t, conn, path); n != 2 {
		t.Fatalf("%d nodes for a batch across two levels, want a pack each", n)
	}
	var got []string
	for len(got) < 60 {
		ms, err := q.Take(ctx, 1, zkqueue.Room{}, false)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(ms[0].Payload))
	}
	for i, p := range got {
		if urgent := i < 20; urgent != strings.HasPrefix(p, "2-") {
			t.Fatalf("take %d: %s (order %v)", i, p, got)
		}
	}
}

// TestPackedBrowse: Browse pages through packs message by message, a
// cursor in the middle of a pack resuming after it, a plain node among
// them in its place, claiming nothing; Purge counts the packs' messages.
func TestPackedBrowse(t *testing.T) {
	ctx := context.Background()
	path := zktest.Root(t) + "/q"
	conn := zktest.Conn(t)
	plain := newQueue(t, conn, path)
	if _, err := plain.Publish(ctx, []byte("first")); err != nil { // written before packing
		t.Fatal(err)
	}
	q := newQueue(t, zktest.Conn(t), path, packed())
	batch := make([][]byte, 20)
	for i := range batch {
		batch[i] = []byte(fmt.Sprintf("m%02d", i))
	}
	if _, err := q.PublishBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		ms, next, err := q.Browse(ctx, after, 7, zkqueue.Room{})
		if err != nil || pages > 10 {
			t.Fatalf("page %d: %v", pages, err)
		}
		for _, m := range ms {
			got = append(got, string(m.Payload))
		}
		if next == "" {
			break
		}
		after = next
	}
	want := []string{"first"}
	for i := range 20 {
		want = append(want, fmt.Sprintf("m%02d", i))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("browsed %v, want %v", got, want)
	}
	if n, err := q.Len(ctx); err != nil || n != 21 {
		t.Fatalf("Len after browsing: %d, %v; want 21", n, err)
	}
	m, err := q.Peek(ctx)
	if err != nil || string(m.Payload) != "first" {
		t.Fatalf("Peek: %q, %v", m.Payload, err)
	}
	ms, err := q.Take(ctx, 3, zkqueue.Room{}, false) // the plain node, then the pack's first two
	if err != nil || len(ms) != 3 || string(ms[0].Payload) != "first" || string(ms[2].Payload) != "m01" {
		t.Fatalf("take: %v, %v", ms, err)
	}
	// Flush puts the pack's other 18 back as one node; Purge counts the
	// messages of the packs it deletes.
	if err := q.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Len(ctx); err != nil || n != 18 {
		t.Fatalf("Len after Flush: %d, %v; want 18", n, err)
	}
	if _, err := q.PublishBatch(ctx, batch[:5]); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Purge(ctx); err != nil || n != 23 {
		t.Fatalf("Purge: %d, %v; want 23", n, err)
	}
	if n, err := q.Len(ctx); err != nil || n != 0 {
		t.Fatalf("Len after Purge: %d, %v", n, err)
	}
}

// TestAckMany: acks of messages of two pack leases, a lone message, one
// acked twice in the same call and a malformed token, in one call: each
// answered on its own, the pack leases settled with one write each (their
// version), and the queue empty after.
func TestAckMany(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	items := newQueue(t, conn, root+"/items", packed())
	leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // two packs of 10
		batch := make([][]byte, 10)
		for i := range batch {
			batch[i] = []byte(fmt.Sprintf("m%02d", i))
		}
		if _, err := items.PublishBatch(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := leases.Take(ctx, 20, zkqueue.Room{}, time.Minute, false)
	if err != nil || len(ls) != 20 {
		t.Fatalf("take: %d, %v", len(ls), err)
	}
	if _, err := items.Publish(ctx, []byte("lone")); err != nil {
		t.Fatal(err)
	}
	lone, err := leases.Take(ctx, 1, zkqueue.Room{}, time.Minute, false)
	if err != nil || len(lone) != 1 || string(lone[0].Payload) != "lone" {
		t.Fatalf("take lone: %v, %v", lone, err)
	}
	// The first pack's first half, the second pack's all, m03 twice,
	// the lone message, garbage.
	var tokens []string
	var ids []string
	for _, le := range slices.Concat(ls[:5], ls[10:]) {
		tokens, ids = append(tokens, le.Token), append(ids, le.ID)
	}
	tokens = append(tokens, ls[3].Token, lone[0].Token, "not-a-lease")
	ms, errs := leases.AckMany(ctx, tokens)
	if len(ms) != len(tokens) || len(errs) != len(tokens) {
		t.Fatalf("%d messages, %d errors for %d tokens", len(ms), len(errs), len(tokens))
	}
	for i := range 15 {
		if errs[i] != nil || ms[i].ID != ids[i] {
			t.Errorf("ack %d (%s): %q, %v", i, ids[i], ms[i].ID, errs[i])
		}
	}
	if !errors.Is(errs[15], zkqueue.ErrUnknownLease) {
		t.Errorf("m03 acked again in the same call: %v, want ErrUnknownLease", errs[15])
	}
	if errs[16] != nil {
		t.Errorf("lone ack: %v", errs[16])
	}
	if !errors.Is(errs[17], zkqueue.ErrUnknownLease) {
		t.Errorf("garbage token: %v, want ErrUnknownLease", errs[17])
	}
	// The first pack's lease holds its second half, written once: the
	// second pack's lease is gone with its messages.
	nodes, _, err := conn.Children(root + "/leases")
	if err != nil || len(nodes) != 2 {
		t.Fatalf("lease nodes %v, %v; want the first pack's lease and its messages", nodes, err)
	}
	for _, n := range nodes {
		if strings.HasSuffix(n, ".msgs") {
			continue
		}
		_, st, err := conn.Get(root + "/leases/" + n)
		if err != nil || st.Version != 2 {
			t.Errorf("lease %s: version %v, %v; want 2 (written at the claim, then once by the acks)", n, st, err)
		}
	}
	ms, errs = leases.AckMany(ctx, []string{ls[5].Token, ls[9].Token, ls[0].Token})
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], zkqueue.ErrUnknownLease) || ms[1].ID != ls[9].ID {
		t.Fatalf("second call: %v, %v", ms, errs)
	}
	rest := []string{ls[6].Token, ls[7].Token, ls[8].Token}
	if _, errs := leases.AckMany(ctx, rest); errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("acks of m06..m08: %v", errs)
	}
	if nodes, _, err := conn.Children(root + "/leases"); err != nil || len(nodes) != 0 {
		t.Fatalf("lease nodes left: %v, %v", nodes, err)
	}
}
