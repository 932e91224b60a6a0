package zkqueue

import "testing"

func TestParseRegistration(t *testing.T) {
	tests := []struct {
		name string
		id   string
		ok   bool
	}{
		{"b1~0123456789abcdef", "b1", true},
		{"host-7~0123456789abcdef", "host-7", true},
		{"a~b~0123456789abcdef", "a~b", true}, // the nonce is hex: the last separator splits
		{"b1-0000000007", "b1", true},         // legacy: sequential suffix
		{"host-7-0000000012", "host-7", true},
		{"~0123456789abcdef", "", false}, // no process id
		{"-0000000007", "", false},
		{"b1", "", false},
		{"b1-7", "", false},
		{"0000000007", "", false},
		{"", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, ok := ParseRegistration(tc.name)
			if id != tc.id || ok != tc.ok {
				t.Errorf("got %q %v, want %q %v", id, ok, tc.id, tc.ok)
			}
		})
	}
}

func TestShareOf(t *testing.T) {
	tests := []struct {
		ids     []string
		id      string
		rank, n int
	}{
		{nil, "b", 0, 1},
		{[]string{"b"}, "b", 0, 1},
		{[]string{"c", "a", "b"}, "b", 1, 3},
		{[]string{"c", "c", "a", "b", "a"}, "c", 2, 3}, // several consumers of one process count once
		{[]string{"c", "a"}, "b", 0, 1},                // no consumer here: the whole queue
	}
	for _, tc := range tests {
		ids := append([]string(nil), tc.ids...)
		sh := shareOf(tc.ids, tc.id)
		if sh.Rank != tc.rank || sh.N != tc.n {
			t.Errorf("shareOf(%v, %q) = %d of %d, want %d of %d", tc.ids, tc.id, sh.Rank, sh.N, tc.rank, tc.n)
		}
		if sh.N > 1 && (len(sh.Publishers) != sh.N || sh.Publishers[sh.Rank] != PublisherTag(tc.id)) {
			t.Errorf("shareOf(%v, %q) publishers %v, want %d with %q at %d", tc.ids, tc.id, sh.Publishers, sh.N, PublisherTag(tc.id), sh.Rank)
		}
		for i := range ids {
			if ids[i] != tc.ids[i] {
				t.Fatalf("shareOf reordered its argument: %v", tc.ids)
			}
		}
	}
}

// A registration's path is <dir>/<id>~<nonce>, parsed back to the id, and
// unique.
func TestNewRegistrationPath(t *testing.T) {
	g := &ConsumerGroup{dir: "/q/consumers", id: "b-1"}
	p1, p2 := g.NewRegistrationPath(), g.NewRegistrationPath()
	if p1 == p2 {
		t.Fatalf("two registrations named %s", p1)
	}
	const prefix = "/q/consumers/"
	if len(p1) <= len(prefix) || p1[:len(prefix)] != prefix {
		t.Fatalf("got %s, want a child of %s", p1, prefix)
	}
	if id, ok := ParseRegistration(p1[len(prefix):]); !ok || id != "b-1" {
		t.Fatalf("ParseRegistration(%s) = %q %v, want b-1", p1, id, ok)
	}
}
