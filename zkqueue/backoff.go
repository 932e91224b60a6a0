package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/go-zookeeper/zk"
)

// Retry backoff: a queue's redelivery schedule (Spec.Backoff, carried by
// its Policy).
//
// Without one, a nack without a delay puts the message back at once and a
// lease that expired is released at once, so a message that keeps failing
// can use up its MaxDeliveries in milliseconds. With one, both hold the
// message back for the schedule's step first, through the machinery of a
// delayed Nack: the lease is renamed and marked nacked with the step as
// its deadline (one Multi, conditional on the lease's version), and the
// LeaseSweeper puts it back at its place in the queue when the deadline
// passes. The step is that of the message's deliveries so far: after the
// first delivery the first step, after the n-th the n-th (the last step
// repeats, an exponential schedule grows to its Max). A message past the
// policy's MaxDeliveries is dead-lettered or dropped at once, as without a
// schedule. An explicit delay (Nack's) wins over the schedule; Release (a
// consumer's stream ended) and Unclaim give the message back at once.
//
// A queue without a schedule runs none of this file's code: the checks on
// the plain paths are of a nil pointer.

// Bounds of a Backoff.
const (
	MaxBackoffSteps      = 32
	MinBackoffStep       = time.Millisecond
	MaxBackoffStep       = 12 * time.Hour
	MaxBackoffMultiplier = 100
)

// Backoff is a redelivery schedule: either Steps, an increasing list of
// waits, or an exponential one (Initial, Multiplier, Max). It is not to be
// changed once in a Spec or a Policy.
type Backoff struct {
	// Steps: the wait before the n-th redelivery is Steps[n-1]; the last
	// step repeats. Strictly increasing, each within [MinBackoffStep,
	// MaxBackoffStep], at most MaxBackoffSteps of them.
	Steps []time.Duration
	// Exponential, when Steps is empty: the n-th wait is Initial *
	// Multiplier^(n-1), at most Max. Initial within [MinBackoffStep,
	// MaxBackoffStep], Multiplier within [1, MaxBackoffMultiplier], Max
	// not below Initial nor above MaxBackoffStep.
	Initial    time.Duration
	Multiplier float64
	Max        time.Duration
}

// BackoffError says which field of a Backoff is out of bounds and why.
// It wraps ErrBadSpec.
type BackoffError struct {
	// Field is the field's name as the broker's API spells it: "steps[2]",
	// "initial", "multiplier", "max".
	Field  string
	Reason string
}

func (e *BackoffError) Error() string {
	return fmt.Sprintf("zkqueue: bad queue spec: retry backoff %s: %s", e.Field, e.Reason)
}

// Unwrap returns ErrBadSpec.
func (e *BackoffError) Unwrap() error { return ErrBadSpec }

// Check reports the first field of b out of bounds, as a *BackoffError.
func (b *Backoff) Check() error {
	bad := func(field, format string, a ...any) error {
		return &BackoffError{Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	step := func(field string, d time.Duration) error {
		if d < MinBackoffStep || d > MaxBackoffStep {
			return bad(field, "%v not in [%v, %v]", d, MinBackoffStep, MaxBackoffStep)
		}
		return nil
	}
	if len(b.Steps) > 0 {
		switch {
		case b.Initial != 0 || b.Multiplier != 0 || b.Max != 0:
			return bad("steps", "both steps and an exponential schedule (initial, multiplier, max) are set")
		case len(b.Steps) > MaxBackoffSteps:
			return bad("steps", "%d steps > %d", len(b.Steps), MaxBackoffSteps)
		}
		for i, d := range b.Steps {
			if err := step(fmt.Sprintf("steps[%d]", i), d); err != nil {
				return err
			}
			if i > 0 && d <= b.Steps[i-1] {
				return bad(fmt.Sprintf("steps[%d]", i), "%v is not greater than steps[%d] (%v): steps must increase", d, i-1, b.Steps[i-1])
			}
		}
		return nil
	}
	if err := step("initial", b.Initial); err != nil {
		return err
	}
	switch {
	case math.IsNaN(b.Multiplier) || b.Multiplier < 1 || b.Multiplier > MaxBackoffMultiplier:
		return bad("multiplier", "%v not in [1, %d]", b.Multiplier, MaxBackoffMultiplier)
	case b.Max < b.Initial:
		return bad("max", "%v is below initial (%v)", b.Max, b.Initial)
	case b.Max > MaxBackoffStep:
		return bad("max", "%v > %v", b.Max, MaxBackoffStep)
	}
	return nil
}

// Delay returns the wait before a message delivered deliveries times
// (at least once) is delivered again.
func (b *Backoff) Delay(deliveries int) time.Duration {
	n := max(deliveries, 1)
	if len(b.Steps) > 0 {
		return b.Steps[min(n, len(b.Steps))-1]
	}
	d := float64(b.Initial) * math.Pow(b.Multiplier, float64(n-1))
	if math.IsInf(d, 0) || math.IsNaN(d) || d >= float64(b.Max) {
		return b.Max
	}
	return time.Duration(d)
}

// equalBackoff reports whether two schedules (nil: none) are the same.
func equalBackoff(a, b *Backoff) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.Steps, b.Steps) && a.Initial == b.Initial && a.Multiplier == b.Multiplier && a.Max == b.Max
}

// backoffJSON is the stored form of a Backoff, in milliseconds.
type backoffJSON struct {
	StepsMS    []int64 `json:"steps_ms,omitempty"`
	InitialMS  int64   `json:"initial_ms,omitempty"`
	Multiplier float64 `json:"multiplier,omitempty"`
	MaxMS      int64   `json:"max_ms,omitempty"`
}

func (b *Backoff) toJSON() *backoffJSON {
	j := &backoffJSON{InitialMS: b.Initial.Milliseconds(), Multiplier: b.Multiplier, MaxMS: b.Max.Milliseconds()}
	for _, d := range b.Steps {
		j.StepsMS = append(j.StepsMS, d.Milliseconds())
	}
	return j
}

func (j *backoffJSON) backoff() *Backoff {
	b := &Backoff{Initial: time.Duration(j.InitialMS) * time.Millisecond, Multiplier: j.Multiplier,
		Max: time.Duration(j.MaxMS) * time.Millisecond}
	for _, ms := range j.StepsMS {
		b.Steps = append(b.Steps, time.Duration(ms)*time.Millisecond)
	}
	return b
}

// holdBack is the sweep's release of an expired live lease of a queue
// with a backoff: the lease becomes a nacked one due at now plus the
// message's step, under a new name the sweeper knows at once (so that it
// wakes for it, see LeaseSweeper.NextDue). done: the old lease is gone.
func (s *LeaseSweeper) holdBack(ctx context.Context, h heldLease, b *Backoff, now time.Time) (e *Expired, done bool, err error) {
	due := now.Add(b.Delay(h.m.Deliveries))
	next, ops := delayOps(s.leases, h, due, s.acl)
	if _, err := s.write(ctx, ops...); err != nil {
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return nil, false, nil // settled or extended meanwhile: read again
		}
		return nil, false, fmt.Errorf("hold back %s/%s: %w", s.leases, h.token, err)
	}
	s.known[next] = &sweptLease{item: h.item, deadline: due, nacked: true}
	return &Expired{Message: h.m, Outcome: Delayed}, true, nil
}
