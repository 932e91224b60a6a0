package qbroker

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// RetryBackoff is a queue's redelivery schedule (QueueOptions.RetryBackoff):
// a Nack without a delay, and a lease that ran out, make the message
// deliverable again only after the step for its deliveries so far. Set
// either Steps or Initial (with Multiplier and Max), not both.
type RetryBackoff struct {
	// Steps are the waits after the 1st, 2nd, ... delivery, strictly
	// increasing; the last repeats. Each 1ms..12h, at most 32.
	Steps []time.Duration
	// Initial is the first wait of an exponential schedule; each next
	// one is Multiplier times longer (0 means 2), at most Max (0 means
	// 12h, the longest; not below Initial).
	Initial    time.Duration
	Multiplier float64
	Max        time.Duration
}

func (r *RetryBackoff) toPB() *pb.RetryBackoff {
	if r == nil {
		return nil
	}
	out := &pb.RetryBackoff{Multiplier: r.Multiplier}
	for _, d := range r.Steps {
		out.Steps = append(out.Steps, durationpb.New(d))
	}
	if r.Initial != 0 || len(r.Steps) == 0 {
		out.Initial = durationpb.New(r.Initial)
	}
	if r.Max != 0 {
		out.Max = durationpb.New(r.Max)
	}
	return out
}

func backoffFromPB(r *pb.RetryBackoff) *RetryBackoff {
	if r == nil {
		return nil
	}
	out := &RetryBackoff{Multiplier: r.GetMultiplier()}
	for _, d := range r.GetSteps() {
		out.Steps = append(out.Steps, d.AsDuration())
	}
	if r.GetInitial() != nil {
		out.Initial = r.GetInitial().AsDuration()
	}
	if r.GetMax() != nil {
		out.Max = r.GetMax().AsDuration()
	}
	return out
}
