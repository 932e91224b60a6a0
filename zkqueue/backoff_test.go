package zkqueue_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

func TestBackoffCheck(t *testing.T) {
	ms := time.Millisecond
	many := make([]time.Duration, zkqueue.MaxBackoffSteps+1)
	for i := range many {
		many[i] = time.Duration(i+1) * ms
	}
	for _, tc := range []struct {
		name  string
		b     zkqueue.Backoff
		field string // "" valid
		says  string
	}{
		{"steps", zkqueue.Backoff{Steps: []time.Duration{200 * ms, 400 * ms, 800 * ms}}, "", ""},
		{"one step", zkqueue.Backoff{Steps: []time.Duration{time.Second}}, "", ""},
		{"exponential", zkqueue.Backoff{Initial: time.Second, Multiplier: 2, Max: time.Minute}, "", ""},
		{"constant", zkqueue.Backoff{Initial: time.Second, Multiplier: 1, Max: time.Second}, "", ""},
		{"not increasing", zkqueue.Backoff{Steps: []time.Duration{time.Second, 5 * time.Second, 5 * time.Second}}, "steps[2]", "not greater than steps[1]"},
		{"decreasing", zkqueue.Backoff{Steps: []time.Duration{time.Second, ms}}, "steps[1]", "steps must increase"},
		{"zero step", zkqueue.Backoff{Steps: []time.Duration{0, time.Second}}, "steps[0]", "not in"},
		{"negative step", zkqueue.Backoff{Steps: []time.Duration{-time.Second}}, "steps[0]", "not in"},
		{"step too long", zkqueue.Backoff{Steps: []time.Duration{13 * time.Hour}}, "steps[0]", "not in"},
		{"too many steps", zkqueue.Backoff{Steps: many}, "steps", "33 steps > 32"},
		{"both kinds", zkqueue.Backoff{Steps: []time.Duration{time.Second}, Initial: time.Second}, "steps", "both"},
		{"no initial", zkqueue.Backoff{Multiplier: 2, Max: time.Minute}, "initial", "not in"},
		{"multiplier below 1", zkqueue.Backoff{Initial: time.Second, Multiplier: 0.5, Max: time.Minute}, "multiplier", "not in [1, 100]"},
		{"multiplier NaN", zkqueue.Backoff{Initial: time.Second, Multiplier: math.NaN(), Max: time.Minute}, "multiplier", "not in"},
		{"max below initial", zkqueue.Backoff{Initial: time.Minute, Multiplier: 2, Max: time.Second}, "max", "below initial"},
		{"max too long", zkqueue.Backoff{Initial: time.Minute, Multiplier: 2, Max: 24 * time.Hour}, "max", "> 12h"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.b.Check()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			var be *zkqueue.BackoffError
			if !errors.As(err, &be) || !errors.Is(err, zkqueue.ErrBadSpec) || be.Field != tc.field || !strings.Contains(be.Reason, tc.says) {
				t.Fatalf("got %v, want a BackoffError on %s saying %q", err, tc.field, tc.says)
			}
		})
	}
}

func TestBackoffDelay(t *testing.T) {
	s := time.Second
	steps := zkqueue.Backoff{Steps: []time.Duration{s, 5 * s, 30 * s}}
	exp := zkqueue.Backoff{Initial: s, Multiplier: 3, Max: 20 * s}
	for _, tc := range []struct {
		b          zkqueue.Backoff
		deliveries int
		want       time.Duration
	}{
		{steps, 0, s}, {steps, 1, s}, {steps, 2, 5 * s}, {steps, 3, 30 * s}, {steps, 4, 30 * s}, {steps, 1000, 30 * s},
		{exp, 1, s}, {exp, 2, 3 * s}, {exp, 3, 9 * s}, {exp, 4, 20 * s}, {exp, 5000, 20 * s},
	} {
		if got := tc.b.Delay(tc.deliveries); got != tc.want {
			t.Errorf("%+v after %d deliveries: got %v, want %v", tc.b, tc.deliveries, got, tc.want)
		}
	}
}

// A spec keeps its schedule through its stored form; a spec with a bad
// schedule does not validate.
func TestSpecBackoffRoundTrip(t *testing.T) {
	for _, b := range []*zkqueue.Backoff{
		{Steps: []time.Duration{200 * time.Millisecond, 5 * time.Second}},
		{Initial: time.Second, Multiplier: 1.5, Max: time.Minute},
	} {
		s := zkqueue.Spec{Kind: zkqueue.KindFIFO, Visibility: time.Second, Backoff: b}
		data, err := s.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := zkqueue.DecodeSpec(data)
		if err != nil || got.Backoff == nil || got.Backoff.Initial != b.Initial || got.Backoff.Multiplier != b.Multiplier ||
			got.Backoff.Max != b.Max || len(got.Backoff.Steps) != len(b.Steps) || got.Policy().Backoff != got.Backoff {
			t.Fatalf("%s decoded to %+v, %v", data, got.Backoff, err)
		}
	}
	bad := zkqueue.Spec{Kind: zkqueue.KindFIFO, Backoff: &zkqueue.Backoff{Steps: []time.Duration{time.Second, time.Second}}}
	if err := bad.Validate(); !errors.Is(err, zkqueue.ErrBadSpec) {
		t.Fatalf("Validate of a schedule that does not increase: %v, want ErrBadSpec", err)
	}
}

// With a backoff, a nack without a delay and an expiry hold the message
// back (in flight, not ready) until its step passed, then the sweep puts
// it back; an explicit delay wins over the schedule; past MaxDeliveries
// the message is dead-lettered at once.
func TestBackoffHoldsBackNacksAndExpiries(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	items, err := zkqueue.New(conn, root+"/items")
	if err != nil {
		t.Fatal(err)
	}
	leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	sweeper := zkqueue.NewLeaseSweeper(zktest.Conn(t), root+"/items", root+"/leases", root+"/dead", zkqueue.SweeperConfig{})
	step := 300 * time.Millisecond
	p := zkqueue.Policy{MaxDeliveries: 3, DeadLetter: true,
		Backoff: &zkqueue.Backoff{Steps: []time.Duration{step, 2 * step}}}
	if _, err := items.Publish(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	take := func(ttl time.Duration) zkqueue.Lease {
		t.Helper()
		ls, err := leases.Take(ctx, 1, zkqueue.Room{}, ttl, false)
		if err != nil || len(ls) != 1 {
			t.Fatalf("Take: %v, %v", ls, err)
		}
		return ls[0]
	}
	// waitBack sweeps until the message is ready again, and returns when.
	waitBack := func(what string) time.Time {
		t.Helper()
		var back time.Time
		zktest.WaitFor(t, 10*time.Second, what, func() bool {
			ex, err := sweeper.Sweep(ctx, time.Now(), p)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ex {
				if e.Outcome == zkqueue.Requeued {
					back = time.Now()
					return true
				}
			}
			return false
		})
		return back
	}
	notReady := func(what string) {
		t.Helper()
		if n, err := items.Len(ctx); err != nil || n != 0 {
			t.Fatalf("%s: %d ready (%v), want 0", what, n, err)
		}
		if n, err := leases.InFlight(ctx); err != nil || n != 1 {
			t.Fatalf("%s: %d in flight (%v), want 1", what, n, err)
		}
	}

	l := take(time.Minute)
	nacked := time.Now()
	if _, out, err := leases.Nack(ctx, l.Token, 0, p); err != nil || out != zkqueue.Delayed {
		t.Fatalf("Nack without a delay: %v, %v; want Delayed", out, err)
	}
	notReady("after the nack")
	if back := waitBack("the first step"); back.Sub(nacked) < step {
		t.Fatalf("back %v after the nack, before the first step (%v)", back.Sub(nacked), step)
	}

	// An expiry waits the second step once the sweep found it.
	l = take(50 * time.Millisecond)
	var held time.Time
	zktest.WaitFor(t, 10*time.Second, "the expired lease held back", func() bool {
		held = time.Now()
		ex, err := sweeper.Sweep(ctx, held, p)
		if err != nil {
			t.Fatal(err)
		}
		return len(ex) == 1 && ex[0].Outcome == zkqueue.Delayed
	})
	if next := sweeper.NextDue(); !next.Equal(held.Add(2 * step)) {
		t.Fatalf("NextDue %v after the sweep, want the second step (%v)", next.Sub(held), 2*step)
	}
	notReady("after the expiry")
	if back := waitBack("the second step"); back.Sub(held) < 2*step {
		t.Fatalf("back %v after the expiry's sweep, before the second step (%v)", back.Sub(held), 2*step)
	}
	if !sweeper.NextDue().IsZero() {
		t.Fatalf("NextDue %v with no nacked lease left", sweeper.NextDue())
	}

	// The third delivery is the last: its nack dead-letters it at once.
	l = take(time.Minute)
	if l.Deliveries != 3 {
		t.Fatalf("third delivery counts %d", l.Deliveries)
	}
	if _, out, err := leases.Nack(ctx, l.Token, 0, p); err != nil || out != zkqueue.DeadLettered {
		t.Fatalf("Nack past max deliveries: %v, %v; want DeadLettered", out, err)
	}

	// An explicit delay wins over the schedule.
	if _, err := leases.Redrive(ctx, nil); err != nil {
		t.Fatal(err)
	}
	l = take(time.Minute)
	if _, out, err := leases.Nack(ctx, l.Token, time.Hour, p); err != nil || out != zkqueue.Delayed {
		t.Fatalf("Nack with a delay: %v, %v", out, err)
	}
	if _, err := sweeper.Sweep(ctx, time.Now(), p); err != nil {
		t.Fatal(err)
	}
	if next := time.Until(sweeper.NextDue()); next < 59*time.Minute {
		t.Fatalf("a nack delayed an hour is due in %v", next)
	}
}

// Maintain releases a nacked lease at its deadline, not at its next
// interval: here the nack's step (3s) ends half an interval (2s) before
// the sweep after it.
func TestMaintainReleasesNackedLeasesOnTime(t *testing.T) {
	ctx := context.Background()
	c := newCatalog(t, zktest.Conn(t), zkqueue.CatalogConfig{})
	const step = 3 * time.Second
	spec := fifo(time.Minute)
	spec.Backoff = &zkqueue.Backoff{Steps: []time.Duration{step}}
	mustCreate(t, c, "q", spec)
	h := openQueue(t, c, "q")
	if _, err := h.Items.Publish(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	ls, err := h.Leases.Take(ctx, 1, zkqueue.Room{}, time.Minute, false)
	if err != nil || len(ls) != 1 {
		t.Fatalf("Take: %v, %v", ls, err)
	}
	released := make(chan time.Time, 1)
	runMaintain(t, c, zkqueue.MaintainConfig{
		Interval: 2 * time.Second,
		Released: func(_ string, e []zkqueue.Expired) {
			if len(e) == 1 && e[0].Outcome == zkqueue.Requeued {
				released <- time.Now()
			}
		},
	})
	nacked := time.Now()
	if _, out, err := h.Leases.Nack(ctx, ls[0].Token, 0, h.Spec.Policy()); err != nil || out != zkqueue.Delayed {
		t.Fatalf("Nack: %v, %v; want Delayed by the backoff", out, err)
	}
	select {
	case at := <-released:
		if late := at.Sub(nacked) - step; late < 0 || late > 500*time.Millisecond {
			t.Fatalf("released %v after its deadline, want within 500ms", late)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the nacked lease was not released")
	}
}
