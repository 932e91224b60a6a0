package qcore

import "testing"

func mustName(t *testing.T, s string) Name {
	t.Helper()
	n, ok := ParseName(s)
	if !ok {
		t.Fatalf("ParseName(%q) failed", s)
	}
	return n
}

func TestRecentBoundAndTake(t *testing.T) {
	a, b, c := mustName(t, "qn-0000000001"), mustName(t, "qn-0000000002"), mustName(t, "qn-0000000003")
	data := make([]byte, 100)
	r := newRecent(2 * entryCost(a, data))
	r.put(a, data)
	r.put(b, data)
	r.put(c, data) // over the bound: not remembered
	if got := r.len(); got != 2 {
		t.Fatalf("len = %d, want 2", got)
	}
	if _, ok := r.take(c.Raw); ok {
		t.Error("took a message put while full")
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
	if r.bytes != 0 || r.len() != 0 {
		t.Errorf("empty cache holds %d bytes in %d entries", r.bytes, r.len())
	}
	if off := newRecent(-1); func() bool { off.put(a, nil); return off.len() != 0 }() {
		t.Error("disabled cache remembered a message")
	}
}

func TestRecentPrune(t *testing.T) {
	r := newRecent(1 << 20)
	for _, s := range []string{"qn-0000000001", "qn-0000000002.0000abcd", "p005-0000000003", "qn-0000000004"} {
		r.put(mustName(t, s), []byte(s))
	}
	// 1 was claimed elsewhere; 2 was claimed and requeued under another
	// incarnation (which sorts equal but is a different node).
	listed, _ := SortNames([]string{"qn-0000000002.1234abcd", "p005-0000000003", "qn-0000000004", "qn-0000000009"})
	r.prune(listed)
	for s, want := range map[string]bool{
		"qn-0000000001": false, "qn-0000000002.0000abcd": false, "p005-0000000003": true, "qn-0000000004": true,
	} {
		if _, ok := r.entries[s]; ok != want {
			t.Errorf("after prune %s remembered = %v, want %v", s, ok, want)
		}
	}
	want := entryCost(mustName(t, "p005-0000000003"), []byte("p005-0000000003")) + entryCost(mustName(t, "qn-0000000004"), []byte("qn-0000000004"))
	if r.bytes != want {
		t.Errorf("bytes = %d, want %d", r.bytes, want)
	}
}
