package errfmt

import (
	"errors"
	"testing"
)

func TestErrorf(t *testing.T) {
	errNotHeld := errors.New("lock: not held")
	other := errors.New("zk: node does not exist")
	for _, tc := range []struct {
		err  error
		want string
		is   []error
	}{
		{Errorf("lock: unlock %s: %w", "k", errNotHeld), "lock: unlock k: not held", []error{errNotHeld}},
		{Errorf("lock: unlock %s: %w: %w", "k", errNotHeld, other), "lock: unlock k: not held: zk: node does not exist", []error{errNotHeld, other}},
		{Errorf("lock: get %s: %w", "k", other), "lock: get k: zk: node does not exist", []error{other}},
		{Errorf("no prefix here: %w", errNotHeld), "no prefix here: lock: not held", []error{errNotHeld}},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
		for _, target := range tc.is {
			if !errors.Is(tc.err, target) {
				t.Errorf("%q does not match %q", tc.err, target)
			}
		}
	}
}
