package faults_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/faults"
)

func TestPayloadRoundTrip(t *testing.T) {
	for _, size := range []int{0, 10, 100, 4096} {
		k := faults.Key{Producer: 3, Seq: 1234}
		b := faults.Payload(k, size)
		if len(b) < size {
			t.Fatalf("size %d: got %d bytes", size, len(b))
		}
		got, err := faults.ParsePayload(b)
		if err != nil || got != k {
			t.Fatalf("size %d: got %v, %v; want %v", size, got, err, k)
		}
	}
	b := faults.Payload(faults.Key{Producer: 1, Seq: 2}, 64)
	b[40] ^= 1
	if _, err := faults.ParsePayload(b); err == nil {
		t.Fatal("a corrupt payload parsed")
	}
	for _, bad := range []string{"", "hello", "qbf1|x|1|", "qbf1|1|0|", "qbf1|1"} {
		if _, err := faults.ParsePayload([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestCertain(t *testing.T) {
	for _, c := range []struct {
		err     error
		code    codes.Code
		certain bool
	}{
		{nil, codes.OK, true},
		{&qbroker.Error{Code: codes.InvalidArgument}, codes.InvalidArgument, true},
		{fmt.Errorf("wrapped: %w", &qbroker.Error{Code: codes.NotFound}), codes.NotFound, true},
		{&qbroker.Error{Code: codes.ResourceExhausted}, codes.ResourceExhausted, true},
		{&qbroker.Error{Code: codes.Unavailable}, codes.Unavailable, false},
		{&qbroker.Error{Code: codes.Internal}, codes.Internal, false},
		{status.Error(codes.FailedPrecondition, "x"), codes.FailedPrecondition, true},
		{context.DeadlineExceeded, codes.DeadlineExceeded, false},
		{fmt.Errorf("x: %w", context.Canceled), codes.Canceled, false},
		{errors.New("mystery"), codes.Unknown, false},
	} {
		if got := faults.Code(c.err); got != c.code {
			t.Errorf("Code(%v) = %v, want %v", c.err, got, c.code)
		}
		if c.err != nil {
			if got := faults.Certain(c.err); got != c.certain {
				t.Errorf("Certain(%v) = %v, want %v", c.err, got, c.certain)
			}
		}
	}
}

var (
	unavailable = &qbroker.Error{Code: codes.Unavailable, Message: "down"}
	invalid     = &qbroker.Error{Code: codes.InvalidArgument, Message: "bad"}
	t0          = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func key(seq int) faults.Key { return faults.Key{Seq: seq} }

// delivery at ms with count n; the lease runs 3s unless the mode is at
// most once.
func dl(c *faults.Checker, seq, n, ms int) faults.Delivery {
	d := faults.Delivery{Key: key(seq), ID: fmt.Sprintf("qn-%d", seq), Count: n, At: at(ms), Consumer: "c"}
	if c.Mode() == qbroker.AtLeastOnce {
		d.Deadline = at(ms + 3000)
	}
	return d
}

// verdictCase is a case of TestCheckerVerdicts: what a checker in mode
// records, a check of its Result, and whether the Result is OK.
type verdictCase struct {
	name  string
	mode  qbroker.DeliveryMode
	build func(c *faults.Checker)
	check func(r faults.Result) error
	ok    bool
}

var verdictCases = []verdictCase{
	{"clean at least once", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1), key(2)}, at(0), nil)
		c.Delivered(dl(c, 1, 1, 10))
		c.Delivered(dl(c, 2, 1, 10))
		c.Delivered(dl(c, 2, 2, 4000)) // lease expired: a counted redelivery
	}, func(r faults.Result) error {
		return want(r.Published == 2 && r.Delivered == 2 && r.Deliveries == 3 && r.Redelivered == 1, r)
	}, true},
	{"lost", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1), key(2)}, at(0), nil)
		c.Delivered(dl(c, 1, 1, 10))
	}, func(r faults.Result) error { return want(r.Lost == 1, r) }, false},
	{"uncertain publishes are never lost", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), unavailable)
		c.Published([]faults.Key{key(2)}, at(0), context.DeadlineExceeded)
		c.Delivered(dl(c, 2, 1, 10))
	}, func(r faults.Result) error { return want(r.Lost == 0 && r.Uncertain == 2 && r.Delivered == 1, r) }, true},
	{"a refused publish delivered", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), invalid)
		c.Delivered(dl(c, 1, 1, 10))
	}, func(r faults.Result) error { return want(r.Phantoms == 1 && r.Refused == 1, r) }, false},
	{"a delivery never published", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Delivered(dl(c, 9, 1, 10))
	}, func(r faults.Result) error { return want(r.Phantoms == 1, r) }, false},
	{"same count twice", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.Delivered(dl(c, 1, 1, 10))
		c.Delivered(dl(c, 1, 1, 20))
	}, func(r faults.Result) error { return want(r.Uncounted == 1, r) }, false},
	{"a stale copy after the newer one", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.Delivered(dl(c, 1, 2, 4000))
		d := dl(c, 1, 1, 4100)
		d.Deadline = at(3000)
		c.Delivered(d)
	}, func(r faults.Result) error { return want(r.Uncounted == 1 && r.Redelivered == 1, r) }, false},
	{"delivered after a confirmed ack", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.Delivered(dl(c, 1, 1, 10))
		c.Acked(key(1), at(20), nil)
		c.Delivered(dl(c, 1, 2, 5000))
	}, func(r faults.Result) error { return want(r.Uncounted == 1, r) }, false},
	{"a failed ack confirms nothing", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.Delivered(dl(c, 1, 1, 10))
		c.Acked(key(1), at(20), unavailable)
		c.Delivered(dl(c, 1, 2, 5000))
	}, func(r faults.Result) error { return want(r.Uncounted == 0 && r.Errors["ack Unavailable"] == 1, r) }, true},
	{"arrived past its lease deadline", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		d := dl(c, 1, 1, 5000)
		d.Deadline = at(1000)
		c.Delivered(d)
	}, func(r faults.Result) error { return want(r.Uncounted == 1, r) }, false},
	{"within the stale tolerance", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		d := dl(c, 1, 1, 1000)
		d.Deadline = at(1000).Add(-faults.StaleTolerance)
		c.Delivered(d)
	}, func(r faults.Result) error { return want(r.Uncounted == 0, r) }, true},
	{"duplicate at most once", qbroker.AtMostOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.Delivered(dl(c, 1, 1, 10))
		c.Delivered(dl(c, 1, 1, 20))
		c.Delivered(dl(c, 1, 1, 30))
	}, func(r faults.Result) error { return want(r.Duplicates == 2, r) }, false},
	{"losses in doubt at most once", qbroker.AtMostOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1), key(2), key(3)}, at(0), nil)
		c.ReceiveFailed(2, unavailable)
		c.ReceiveFailed(5, invalid) // refused: claimed nothing
	}, func(r faults.Result) error { return want(r.Lost == 1 && r.InDoubt == 2, r) }, false},
	{"in doubt covers all", qbroker.AtMostOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1), key(2)}, at(0), nil)
		c.ReceiveFailed(8, context.DeadlineExceeded)
	}, func(r faults.Result) error { return want(r.Lost == 0 && r.InDoubt == 2, r) }, true},
	{"a killed broker's claims in doubt at most once", qbroker.AtMostOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1), key(2), key(3), key(4)}, at(0), nil)
		c.Delivered(dl(c, 1, 1, 10))
		c.MayLose(2)
		c.ReceiveFailed(1, unavailable)
	}, func(r faults.Result) error { return want(r.Lost == 0 && r.InDoubt == 3, r) }, true},
	{"a loss beyond a killed broker's claims", qbroker.AtMostOnce, func(c *faults.Checker) {
		keys := []faults.Key{key(1), key(2), key(3)}
		c.Published(keys, at(0), nil)
		c.Stored(keys, []string{"qn-0-0000000007#1", "qn-0-0000000007#2", "qn-0-0000000007#3"})
		c.MayLose(2)
	}, func(r faults.Result) error {
		return want(r.Lost == 1 && r.InDoubt == 2 && strings.Contains(strings.Join(r.Problems, "\n"), "(qn-0-0000000007#1) never delivered"), r)
	}, false},
	{"an uncertain packed Receive: its claim's packs in doubt", qbroker.AtMostOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1), key(2), key(3), key(4)}, at(0), nil)
		c.PackReceiveFailed(1, 3, at(100), unavailable)
	}, func(r faults.Result) error { return want(r.Lost == 1 && r.InDoubt == 3, r) }, false},
	{"a loss published after the last uncertain packed Receive", qbroker.AtMostOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.PackReceiveFailed(1, 100, at(100), unavailable)
		c.Published([]faults.Key{key(2), key(3)}, at(200), nil)
		c.Delivered(dl(c, 1, 1, 300))
	}, func(r faults.Result) error { return want(r.Lost == 1 && r.InDoubt == 1, r) }, false},
	{"a refused packed Receive claimed nothing", qbroker.AtMostOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1), key(2)}, at(0), nil)
		c.PackReceiveFailed(1, 100, at(100), invalid)
	}, func(r faults.Result) error { return want(r.Lost == 2 && r.InDoubt == 0, r) }, false},
	{"no packed claims in doubt at least once", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.PackReceiveFailed(8, 1000, at(100), unavailable)
	}, func(r faults.Result) error { return want(r.Lost == 1 && r.InDoubt == 0, r) }, false},
	{"no claims in doubt at least once", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.MayLose(8)
	}, func(r faults.Result) error { return want(r.Lost == 1 && r.InDoubt == 0, r) }, false},
	{"no doubt at least once", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.ReceiveFailed(8, unavailable)
	}, func(r faults.Result) error { return want(r.Lost == 1 && r.InDoubt == 0, r) }, false},
	{"recovery times", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.Delivered(dl(c, 1, 1, 10))
		c.Mark(faults.Fault, "kill", at(1000))
		c.Published([]faults.Key{key(2)}, at(900), nil) // started before the fault
		c.Delivered(dl(c, 2, 1, 1500))
		c.Published([]faults.Key{key(3)}, at(1200), nil)
		c.Delivered(dl(c, 3, 1, 3000))
		c.Mark(faults.Heal, "restart", at(4000))
		c.Published([]faults.Key{key(4)}, at(4100), nil)
		c.Delivered(dl(c, 4, 1, 4500))
	}, func(r faults.Result) error {
		return want(r.RecoverFault == 2*time.Second && r.RecoverHeal == 500*time.Millisecond, r)
	}, true},
	{"no recovery", qbroker.AtLeastOnce, func(c *faults.Checker) {
		c.Published([]faults.Key{key(1)}, at(0), nil)
		c.Delivered(dl(c, 1, 1, 10))
		c.Mark(faults.Fault, "kill", at(1000))
		c.Published([]faults.Key{key(2)}, at(1100), unavailable)
	}, func(r faults.Result) error { return want(r.RecoverFault == -1, r) }, false},
	{"a recorded failure", qbroker.AtMostOnce, func(c *faults.Checker) {
		c.Fail("registrations leaked")
	}, func(r faults.Result) error {
		return want(len(r.Problems) == 1 && r.Problems[0] == "registrations leaked", r)
	}, false},
	{"corrupt payload", qbroker.AtMostOnce, func(c *faults.Checker) {
		c.Corrupt("qn-1", errors.New("bad byte"))
	}, func(r faults.Result) error { return want(r.Phantoms == 1, r) }, false},
}

func TestCheckerVerdicts(t *testing.T) {
	for _, c := range verdictCases {
		t.Run(c.name, func(t *testing.T) {
			ch := faults.NewChecker(c.mode)
			c.build(ch)
			r := ch.Result()
			if err := c.check(r); err != nil {
				t.Error(err)
			}
			if r.OK != c.ok {
				t.Errorf("OK = %v, want %v; problems: %q", r.OK, c.ok, r.Problems)
			}
		})
	}
}

func want(cond bool, r faults.Result) error {
	if cond {
		return nil
	}
	return fmt.Errorf("unexpected result: %+v", r)
}

func TestCheckerProgress(t *testing.T) {
	c := faults.NewChecker(qbroker.AtLeastOnce)
	c.Published([]faults.Key{key(1), key(2), key(3)}, at(0), nil)
	c.Published([]faults.Key{key(4)}, at(0), unavailable)
	c.Delivered(dl(c, 1, 1, 10))
	c.Delivered(dl(c, 4, 1, 10))
	if p, d := c.Progress(); p != 3 || d != 1 {
		t.Fatalf("Progress() = %d, %d; want 3, 1", p, d)
	}
	if m := c.Missing(); m != 2 {
		t.Fatalf("Missing() = %d, want 2", m)
	}
	if !c.DeliveredAfter(at(0)) || c.DeliveredAfter(at(1)) {
		t.Fatal("DeliveredAfter: wrong")
	}
}

func TestWriteTable(t *testing.T) {
	pass := faults.NewChecker(qbroker.AtMostOnce)
	pass.Published([]faults.Key{key(1)}, at(0), nil)
	pass.Delivered(dl(pass, 1, 1, 10))
	fail := faults.NewChecker(qbroker.AtLeastOnce)
	fail.Published([]faults.Key{key(1)}, at(0), nil)
	var b strings.Builder
	if err := faults.WriteTable(&b, []faults.Row{{Scenario: "s1", Result: pass.Result()}, {Scenario: "s2", Result: fail.Result()}}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, s := range []string{
		"| s1 | at-most-once | 1 | 0 | 1 | 0 | 0 | 0 | 0 | - | - | - | pass |",
		"| s2 | at-least-once | 1 | 0 | 0 | 0 | 1 | - | - | 0 | - | - | **FAIL** |",
		"s2, at-least-once:\n- 1 lost\n  - p0#1 never delivered\n",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("table lacks %q:\n%s", s, out)
		}
	}
}
