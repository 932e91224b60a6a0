package election_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/internal/zktest"
)

// ProclaimKey and ResignKey act for a candidate from another session: a
// waiting candidate cannot proclaim, the leader's value changes, a
// resigned leader's Election sees Done close and the next one leads; a
// key gone or malformed is refused.
func TestKeyFunctions(t *testing.T) {
	root := zktest.Root(t) + "/election"
	other := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := newElection(t, zktest.Conn(t), root)
	if err := first.Campaign(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	second := newElection(t, zktest.Conn(t), root)
	won := campaign(ctx, second, "b")
	// Its node shows in the listing before Campaign has recorded it.
	zktest.WaitFor(t, 30*time.Second, "the second candidate", func() bool {
		return second.Key() != "" && len(children(t, other, root)) == 2
	})
	waiting := second.Key()

	if err := election.ProclaimKey(ctx, other, waiting, []byte("x")); !errors.Is(err, election.ErrNotLeader) {
		t.Fatalf("ProclaimKey of a waiting candidate: got %v, want ErrNotLeader", err)
	}
	if err := election.ProclaimKey(ctx, other, first.Key(), []byte("a2")); err != nil {
		t.Fatal(err)
	}
	l, err := first.Leader(ctx)
	if err != nil || string(l.Value) != "a2" || l.Key != first.Key() {
		t.Fatalf("Leader after ProclaimKey: got %+v, %v, want value a2 of %s", l, err, first.Key())
	}
	key := first.Key()
	if err := election.ResignKey(ctx, other, key); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "the resigned leadership to end", func() bool { return isClosed(first.Done()) })
	if err := waitErr(t, won, 30*time.Second, "the second to lead"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []func() error{
		func() error { return election.ResignKey(ctx, other, key) },
		func() error { return election.ProclaimKey(ctx, other, key, nil) },
	} {
		if err := f(); !errors.Is(err, election.ErrNoCandidate) {
			t.Fatalf("on a resigned key: got %v, want ErrNoCandidate", err)
		}
	}
	for _, bad := range []string{"", "n-0000000001", root + "/x-1", root + "/../n-0000000001", "/n-0000000001"} {
		if err := election.ResignKey(ctx, other, bad); !errors.Is(err, election.ErrInvalid) {
			t.Errorf("ResignKey(%q): got %v, want ErrInvalid", bad, err)
		}
	}
}
