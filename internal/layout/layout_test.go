package layout_test

import (
	"errors"
	"testing"

	"github.com/qbroker/qbroker/internal/layout"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		root string
		ok   bool
	}{
		{"/qbroker", true}, {"/a/b", true},
		{"", false}, {"/", false}, {"qbroker", false}, {"/a/", false}, {"/a//b", false}, {"/a/../b", false},
	} {
		_, err := layout.New(tc.root)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, layout.ErrBadRoot)) {
			t.Errorf("New(%q): got %v, want ok %v", tc.root, err, tc.ok)
		}
	}
}

func TestPaths(t *testing.T) {
	r, err := layout.New("/q")
	if err != nil {
		t.Fatal(err)
	}
	must := func(p string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct{ got, want string }{
		{r.Path(), "/q"}, {r.Parent(), "/"}, {r.Queues(), "/q/queues"}, {r.Brokers(), "/q/brokers"},
		{must(r.Broker("b1")), "/q/brokers/b1"}, {r.Election(), "/q/election"}, {r.Elections(), "/q/elections"},
		{must(r.ElectionOf("e")), "/q/elections/e"}, {r.Locks(), "/q/locks"}, {must(r.Lock("l")), "/q/locks/l"},
		{must(layout.Child(r.Locks()+"/l", "key", "lock-0000000001")), "/q/locks/l/lock-0000000001"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
	for _, name := range []string{"", ".", "..", "a/b", "a\x00"} {
		if _, err := r.Lock(name); !errors.Is(err, layout.ErrBadName) {
			t.Errorf("Lock(%q): got %v, want ErrBadName", name, err)
		}
		if _, err := r.ElectionOf(name); !errors.Is(err, layout.ErrBadName) {
			t.Errorf("ElectionOf(%q): got %v, want ErrBadName", name, err)
		}
	}
	for _, tc := range []struct {
		p    string
		want bool
	}{{"/q", true}, {"/q/queues/x", true}, {"/qq", false}, {"/", false}} {
		if got := r.Contains(tc.p); got != tc.want {
			t.Errorf("Contains(%s): got %v, want %v", tc.p, got, tc.want)
		}
	}
}
