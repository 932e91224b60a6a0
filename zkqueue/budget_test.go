package zkqueue

import "testing"

func mustName(t *testing.T, s string) Name {
	t.Helper()
	n, ok := ParseName(s)
	if !ok {
		t.Fatalf("ParseName(%q) failed", s)
	}
	return n
}

// len returns the number of remembered messages.
func (r *recent) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}

// consuming returns a recent whose Store has a consumer.
func consuming(b *Budget) *recent {
	r := newRecent(b)
	r.taking(+1)
	return r
}

func TestRecentBudgetAndTake(t *testing.T) {
	a, b, c := mustName(t, "qn-0000000001"), mustName(t, "qn-0000000002"), mustName(t, "qn-0000000003")
	data := make([]byte, 100)
	budget := NewBudget(2 * entryCost(a, data))
	r := consuming(budget)
	r.put(a, data)
	r.put(b, data)
	r.put(c, data) // over the budget: not remembered
	if got := r.len(); got != 2 {
		t.Fatalf("len = %d, want 2", got)
	}
	if _, ok := r.take(c.Raw); ok {
		t.Error("took a message put while the budget was spent")
	}
	if d, ok := r.take(a.Raw); !ok || len(d) != 100 {
		t.Errorf("take(a) = %d bytes, %v", len(d), ok)
	}
	if _, ok := r.take(a.Raw); ok {
		t.Error("took a twice")
	}
	r.put(c, data) // room again
	if _, ok := r.take(c.Raw); !ok {
		t.Error("c not remembered after a was taken")
	}
	r.take(b.Raw)
	if r.bytes != 0 || r.len() != 0 || int(budget.used.Load()) != 0 {
		t.Errorf("empty cache holds %d bytes in %d entries, budget used %d", r.bytes, r.len(), int(budget.used.Load()))
	}
	off := consuming(NewBudget(0))
	if off.put(a, nil); off.len() != 0 {
		t.Error("a zero budget remembered a message")
	}
}

// Stores sharing a Budget share its bound.
func TestRecentSharedBudget(t *testing.T) {
	a, b := mustName(t, "qn-0000000001"), mustName(t, "qn-0000000002")
	data := make([]byte, 100)
	budget := NewBudget(entryCost(a, data))
	r1, r2 := consuming(budget), consuming(budget)
	r1.put(a, data)
	r2.put(b, data)
	if r1.len() != 1 || r2.len() != 0 {
		t.Fatalf("remembered %d and %d, want 1 and 0", r1.len(), r2.len())
	}
	r1.forget()
	r2.put(b, data)
	if r2.len() != 1 || int(budget.used.Load()) != entryCost(b, data) {
		t.Errorf("after the first forgot: %d remembered, budget used %d", r2.len(), int(budget.used.Load()))
	}
}

// A Store nobody here consumes from remembers nothing, and forgets what it
// held once its consumers have been gone a while.
func TestRecentOnlyWhileConsumed(t *testing.T) {
	a, b := mustName(t, "qn-0000000001"), mustName(t, "qn-0000000002")
	budget := NewBudget(1 << 20)
	r := newRecent(budget)
	if r.put(a, []byte("x")); r.len() != 0 {
		t.Fatal("remembered a message without consumers")
	}
	r.taking(+1)
	r.put(a, []byte("x"))
	r.taking(-1) // the consumer just left: still remembering
	r.put(b, []byte("y"))
	if r.len() != 2 {
		t.Fatalf("len = %d, want 2", r.len())
	}
	r.lastTake.Store(0) // gone for long
	r.put(mustName(t, "qn-0000000003"), []byte("z"))
	if r.len() != 0 || int(budget.used.Load()) != 0 {
		t.Errorf("idle store still holds %d messages, budget used %d", r.len(), int(budget.used.Load()))
	}
}

func TestRecentPrune(t *testing.T) {
	budget := NewBudget(1 << 20)
	r := consuming(budget)
	for _, s := range []string{"qn-0000000001", "qn-0000000002.0000abcd", "p005-0000000003", "qn-0000000004"} {
		r.put(mustName(t, s), []byte(s))
	}
	// 1 was claimed elsewhere; 2 was claimed and requeued under another
	// incarnation (which sorts equal but is a different node).
	listed, _ := SortNames([]string{"qn-0000000002.1234abcd", "p005-0000000003", "qn-0000000004", "qn-0000000009"})
	mark := r.mark()
	// 5 was published after the listing was asked for: missing from it,
	// but not claimed by anyone.
	r.put(mustName(t, "qn-0000000005"), []byte("qn-0000000005"))
	r.prune(listed, mark)
	for s, want := range map[string]bool{
		"qn-0000000001": false, "qn-0000000002.0000abcd": false, "p005-0000000003": true, "qn-0000000004": true,
		"qn-0000000005": true,
	} {
		if _, ok := r.entries[s]; ok != want {
			t.Errorf("after prune %s remembered = %v, want %v", s, ok, want)
		}
	}
	want := entryCost(mustName(t, "p005-0000000003"), []byte("p005-0000000003")) + entryCost(mustName(t, "qn-0000000004"), []byte("qn-0000000004")) +
		entryCost(mustName(t, "qn-0000000005"), []byte("qn-0000000005"))
	if r.bytes != want || int(budget.used.Load()) != want {
		t.Errorf("bytes = %d, budget used %d, want %d", r.bytes, int(budget.used.Load()), want)
	}
}
