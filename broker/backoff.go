package broker

import (
	"errors"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/zkqueue"
)

// A queue's retry backoff (CreateQueueRequest.retry_backoff): checked and
// stored here, applied by the engine (zkqueue/backoff.go) to nacks without
// a delay and to expired leases.

// defaultBackoffMultiplier is an exponential schedule's factor when unset.
const defaultBackoffMultiplier = 2

// backoffToSpec checks a CreateQueueRequest's retry_backoff and returns
// the schedule to store. Durations are kept in whole
// milliseconds, as the queue's spec stores them; an exponential schedule
// without a multiplier or a max gets the defaults (2, 12h), so that
// GetQueue shows what applies.
func backoffToSpec(r *pb.RetryBackoff) (*zkqueue.Backoff, error) {
	dur := func(field string, d *durationpb.Duration) (time.Duration, error) {
		if err := d.CheckValid(); err != nil {
			return 0, invalidf("retry_backoff.%s: %v", field, err)
		}
		return d.AsDuration().Truncate(time.Millisecond), nil
	}
	b := &zkqueue.Backoff{Multiplier: r.GetMultiplier()}
	var err error
	for i, d := range r.GetSteps() {
		s, err := dur(stepField(i), d)
		if err != nil {
			return nil, err
		}
		b.Steps = append(b.Steps, s)
	}
	if r.Initial != nil {
		if b.Initial, err = dur("initial", r.GetInitial()); err != nil {
			return nil, err
		}
	}
	if r.Max != nil {
		if b.Max, err = dur("max", r.GetMax()); err != nil {
			return nil, err
		}
	}
	if len(b.Steps) == 0 {
		if r.Initial == nil {
			return nil, invalidf("retry_backoff: set steps, or initial (with multiplier and max) for an exponential schedule")
		}
		if b.Multiplier == 0 {
			b.Multiplier = defaultBackoffMultiplier
		}
		if r.Max == nil {
			b.Max = zkqueue.MaxBackoffStep
		}
	}
	if err := b.Check(); err != nil {
		var be *zkqueue.BackoffError
		if errors.As(err, &be) {
			return nil, invalidf("retry_backoff.%s: %s", be.Field, be.Reason)
		}
		return nil, invalidf("retry_backoff: %v", err)
	}
	return b, nil
}

func stepField(i int) string { return "steps[" + strconv.Itoa(i) + "]" }

// backoffToPB is a stored schedule as QueueInfo shows it.
func backoffToPB(b *zkqueue.Backoff) *pb.RetryBackoff {
	out := &pb.RetryBackoff{}
	for _, d := range b.Steps {
		out.Steps = append(out.Steps, durationpb.New(d))
	}
	if len(b.Steps) == 0 {
		out.Initial, out.Multiplier, out.Max = durationpb.New(b.Initial), b.Multiplier, durationpb.New(b.Max)
	}
	return out
}
