package main

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

func id(seq int) string { return fmt.Sprintf("qn-%010d", seq) }

// publishAll records n successful publishes of producer p, ids by seq.
func publishAll(c *Checker, p, n int) {
	for s := 1; s <= n; s++ {
		c.Published(msgKey{p, uint64(s)}, id(p*1000+s), true)
	}
}

func deliver(c *Checker, consumer, p, seq int) {
	c.Delivered(consumer, msgKey{p, uint64(seq)}, 0, id(p*1000+seq), 1)
}

// checkerCase is a case of TestCheckerVerdicts: what run records on a
// checker (at least once if ackMode), and the verdict it must give.
type checkerCase struct {
	name    string
	ackMode bool
	strict  bool
	run     func(c *Checker)
	want    Verdict // only the counted fields and OK are compared
	problem string  // a substring of the problems, when failing
	warning string  // a substring of the warnings
}

var checkerCases = []checkerCase{
	{
		name: "all delivered once", strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 3)
			for s := 1; s <= 3; s++ {
				deliver(c, 0, 0, s)
			}
		},
		want: Verdict{Published: 3, Delivered: 3, Deliveries: 3, OK: true},
	},
	{
		name: "loss", strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 3)
			deliver(c, 0, 0, 1)
			deliver(c, 0, 0, 3)
		},
		want:    Verdict{Published: 3, Delivered: 2, Deliveries: 2, Lost: 1},
		problem: "p0#2 (qn-0000000002) never delivered",
	},
	{
		name: "duplicate at most once", strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 2)
			deliver(c, 0, 0, 1)
			deliver(c, 1, 0, 1)
			deliver(c, 0, 0, 2)
		},
		want:    Verdict{Published: 2, Delivered: 2, Deliveries: 3, Redeliveries: 1, Duplicates: 1},
		problem: "p0#1 (qn-0000000001) delivered 2 times",
	},
	{
		name: "order violation", strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 3)
			deliver(c, 0, 0, 2)
			deliver(c, 0, 0, 1)
			deliver(c, 0, 0, 3)
		},
		want:    Verdict{Published: 3, Delivered: 3, Deliveries: 3, OrderViolations: 1},
		problem: "consumer 0 got p0#1 after p0#2",
	},
	{
		name: "order violation only reported", strict: false,
		run: func(c *Checker) {
			publishAll(c, 0, 2)
			deliver(c, 0, 0, 2)
			deliver(c, 0, 0, 1)
		},
		want:    Verdict{Published: 2, Delivered: 2, Deliveries: 2, OrderViolations: 1, OK: true},
		warning: "consumer 0 got p0#1 after p0#2",
	},
	{
		name: "different consumers, producers and priorities are independent", strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 2)
			publishAll(c, 1, 2)
			deliver(c, 1, 0, 2)
			deliver(c, 0, 0, 1) // another consumer
			deliver(c, 1, 1, 1) // another producer
			c.Delivered(1, msgKey{1, 2}, 9, id(1002), 1)
			c.Delivered(0, msgKey{0, 1}, 0, id(1), 1) // a duplicate, not an order violation
		},
		want:    Verdict{Published: 4, Delivered: 4, Deliveries: 5, Redeliveries: 1, Duplicates: 1},
		problem: "1 duplicate",
	},
	{
		name: "priorities are ordered separately", strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 3)
			c.Delivered(0, msgKey{0, 2}, 0, id(2), 1)
			c.Delivered(0, msgKey{0, 1}, 5, id(1), 1)
			c.Delivered(0, msgKey{0, 3}, 5, id(3), 1)
		},
		want: Verdict{Published: 3, Delivered: 3, Deliveries: 3, OK: true},
	},
	{
		name: "uncertain publish is neither lost nor unknown", strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 1)
			c.Published(msgKey{0, 2}, "", false)
			c.Published(msgKey{0, 3}, "", false)
			deliver(c, 0, 0, 1)
			deliver(c, 0, 0, 3)
		},
		want: Verdict{Published: 1, Uncertain: 2, Delivered: 2, Deliveries: 2, OK: true},
	},
	{
		name: "refused publish is neither published nor uncertain", strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 1)
			c.Refused(msgKey{0, 2})
			c.Refused(msgKey{0, 3})
			c.Published(msgKey{0, 4}, "", false)
			deliver(c, 0, 0, 1)
		},
		want: Verdict{Published: 1, Uncertain: 1, Refused: 2, Delivered: 1, Deliveries: 1, OK: true},
	},
	{
		name: "delivery of a refused publish is unknown", strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 1)
			c.Refused(msgKey{0, 2})
			deliver(c, 0, 0, 1)
			deliver(c, 0, 0, 2)
		},
		want:    Verdict{Published: 1, Refused: 1, Delivered: 2, Deliveries: 2, Unknown: 1},
		problem: "p0#2 (qn-0000000002) delivered but its publish was refused",
	},
	{
		name: "delivery before the publish is recorded", strict: true,
		run: func(c *Checker) {
			deliver(c, 0, 0, 1)
			publishAll(c, 0, 1)
		},
		want: Verdict{Published: 1, Delivered: 1, Deliveries: 1, OK: true},
	},
	{
		name: "id mismatch", strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 1)
			c.Delivered(0, msgKey{0, 1}, 0, "qn-0000000999", 1)
		},
		want:    Verdict{Published: 1, Delivered: 1, Deliveries: 1, IDMismatches: 1},
		problem: "published as qn-0000000001, delivered as qn-0000000999",
	},
	{
		name: "never published and unknown producer", strict: true,
		run: func(c *Checker) {
			deliver(c, 0, 0, 1)
			deliver(c, 0, 7, 1)
		},
		want:    Verdict{Delivered: 1, Deliveries: 1, Unknown: 2},
		problem: "2 unknown messages",
	},
	{
		name: "corrupt payload", strict: true,
		run: func(c *Checker) {
			c.Corrupt("qn-0000000001", errors.New("filler differs"))
		},
		want:    Verdict{Corrupt: 1},
		problem: "qn-0000000001: filler differs",
	},
	{
		name: "at least once: nack, redelivery, ack", ackMode: true, strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 2)
			deliver(c, 0, 0, 1) // nacked
			deliver(c, 0, 0, 2)
			c.Acked(msgKey{0, 2}, 0)
			c.Delivered(1, msgKey{0, 1}, 0, id(1), 2) // redelivery: behind p0#2, not an order violation
			c.Acked(msgKey{0, 1}, 0)
		},
		want: Verdict{Published: 2, Delivered: 2, Deliveries: 3, Redeliveries: 1, Acked: 2, OK: true},
	},
	{
		name: "at least once: delivered but never acked is lost", ackMode: true, strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 1)
			deliver(c, 0, 0, 1)
		},
		want:    Verdict{Published: 1, Delivered: 1, Deliveries: 1, Lost: 1},
		problem: "never acked",
	},
	{
		name: "at least once: acked twice", ackMode: true, strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 1)
			deliver(c, 0, 0, 1)
			c.Acked(msgKey{0, 1}, 0)
			c.Delivered(0, msgKey{0, 1}, 0, id(1), 2)
			c.Acked(msgKey{0, 1}, 0)
		},
		want:    Verdict{Published: 1, Delivered: 1, Deliveries: 2, Redeliveries: 1, Acked: 1, Duplicates: 1},
		problem: "acked 2 times",
	},
	{
		name: "at least once: delivered again after the ack", ackMode: true, strict: true,
		run: func(c *Checker) {
			publishAll(c, 0, 1)
			deliver(c, 0, 0, 1)
			c.Acked(msgKey{0, 1}, 0)
			c.Delivered(0, msgKey{0, 1}, 0, id(1), 2)
		},
		want:    Verdict{Published: 1, Delivered: 1, Deliveries: 2, Redeliveries: 1, Acked: 1, Duplicates: 1},
		problem: "deliveries after an ack",
	},
	{
		// Consumer 1's broker was killed (--kill-active-after): its
		// stream ack may have died unapplied, so the message delivered
		// and acked again is not a duplicate; consumer 0's was not.
		name: "at least once: acked again after the first ack's broker died", ackMode: true, strict: true,
		run: func(c *Checker) {
			c.ackLost = func(consumer int) bool { return consumer == 1 }
			publishAll(c, 0, 2)
			deliver(c, 1, 0, 1)
			c.Acked(msgKey{0, 1}, 1)
			c.Delivered(0, msgKey{0, 1}, 0, id(1), 2)
			c.Acked(msgKey{0, 1}, 0)
			c.Delivered(0, msgKey{0, 2}, 0, id(2), 1)
			c.Acked(msgKey{0, 2}, 0)
			c.Delivered(1, msgKey{0, 2}, 0, id(2), 2)
			c.Acked(msgKey{0, 2}, 1)
		},
		want:    Verdict{Published: 2, Delivered: 2, Deliveries: 4, Redeliveries: 2, Acked: 2, AckedAgain: 1, Duplicates: 1},
		problem: "p0#2",
	},
}

func TestCheckerVerdicts(t *testing.T) {
	for _, tt := range checkerCases {
		t.Run(tt.name, func(t *testing.T) {
			c := NewChecker(2, tt.ackMode)
			tt.run(c)
			got := c.Verdict(tt.strict)
			problems, warnings := strings.Join(got.Problems, "\n"), strings.Join(got.Warnings, "\n")
			got.Problems, got.Warnings = nil, nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v\nproblems:\n%s", got, tt.want, problems)
			}
			if tt.problem != "" && !strings.Contains(problems, tt.problem) {
				t.Errorf("problems %q do not mention %q", problems, tt.problem)
			}
			if (tt.problem == "") != (problems == "") || (tt.warning == "") != (warnings == "") ||
				!strings.Contains(warnings, tt.warning) {
				t.Errorf("got problems %q, warnings %q, want problem %q, warning %q", problems, warnings, tt.problem, tt.warning)
			}
			if again := c.Verdict(tt.strict); again.OK != got.OK || again.Unknown != got.Unknown {
				t.Errorf("second verdict differs: got %+v, want %+v", again, got)
			}
		})
	}
}

func TestCheckerProgress(t *testing.T) {
	for _, ackMode := range []bool{false, true} {
		c := NewChecker(1, ackMode)
		publishAll(c, 0, 2)
		deliver(c, 0, 0, 1)
		c.Acked(msgKey{0, 1}, 0)
		deliver(c, 0, 0, 2) // at least once, not complete until acked
		deliver(c, 0, 0, 2)
		want := int64(2)
		if ackMode {
			want = 1
		}
		if pub, done := c.Progress(); pub != 2 || done != want {
			t.Errorf("ackMode %v: got %d published, %d complete, want 2, %d", ackMode, pub, done, want)
		}
	}
}

// A publish the broker refused is certainly not applied; one that failed
// any other way may have been.
func TestRefusedByBroker(t *testing.T) {
	for _, tt := range []struct {
		err     error
		refused bool
	}{
		{&qbroker.Error{Code: codes.ResourceExhausted, Message: "queue q holds 100000 messages"}, true},
		{fmt.Errorf("qbroker: publish to q: %w", &qbroker.Error{Code: codes.ResourceExhausted}), true},
		{&qbroker.Error{Code: codes.InvalidArgument}, true},
		{&qbroker.Error{Code: codes.NotFound}, true},
		{&qbroker.Error{Code: codes.FailedPrecondition}, true},
		{&qbroker.Error{Code: codes.AlreadyExists}, true},
		{&qbroker.Error{Code: codes.Unavailable}, false},
		{fmt.Errorf("qbroker: publish to q: %w", &qbroker.Error{Code: codes.DeadlineExceeded}), false},
		{&qbroker.Error{Code: codes.Canceled}, false},
		{&qbroker.Error{Code: codes.Internal}, false},
		{&qbroker.Error{Code: codes.Unknown}, false},
		{&qbroker.Error{Code: codes.Aborted}, false},
		{context.DeadlineExceeded, false},
		{errors.New("connection reset"), false},
	} {
		if got := refusedByBroker(tt.err); got != tt.refused {
			t.Errorf("refusedByBroker(%v) = %v, want %v", tt.err, got, tt.refused)
		}
	}
}
