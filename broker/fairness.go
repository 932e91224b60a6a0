package broker

import (
	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/zkqueue"
)

// fairnessToSpec checks a CreateQueueRequest's fair dispatch (zkqueue's
// fairness.go): a key of "group" or "header:<name>", weights only with a
// key, at most zkqueue.MaxFairnessWeights of them, each in [1,
// zkqueue.MaxFairnessWeight]; not for SYNC queues. Its errors name the
// field.
func fairnessToSpec(f *pb.Fairness, kind zkqueue.Kind) (zkqueue.Fairness, error) {
	if f == nil || f.GetKey() == "" && len(f.GetWeights()) == 0 {
		return zkqueue.Fairness{}, nil
	}
	key, weights := f.GetKey(), f.GetWeights()
	switch {
	case key == "":
		return zkqueue.Fairness{}, invalidf("fairness.weights without a fairness.key")
	case kind == kindSync:
		return zkqueue.Fairness{}, invalidf("fairness is for FIFO and PRIORITY queues only")
	case len(weights) > zkqueue.MaxFairnessWeights:
		return zkqueue.Fairness{}, invalidf("fairness.weights: %d entries, at most %d", len(weights), zkqueue.MaxFairnessWeights)
	}
	out := zkqueue.Fairness{Key: key}
	if len(weights) > 0 {
		out.Weights = make(map[string]int, len(weights))
	}
	for k, w := range weights {
		if w < 1 || w > zkqueue.MaxFairnessWeight {
			return zkqueue.Fairness{}, invalidf("fairness.weights[%q] = %d out of range [1, %d]", k, w, zkqueue.MaxFairnessWeight)
		}
		out.Weights[k] = int(w)
	}
	if err := (zkqueue.Fairness{Key: key}).Validate(); err != nil {
		return zkqueue.Fairness{}, invalidf("fairness.key %q: want %q or %q followed by a header name (1 to 128 printable bytes)",
			key, zkqueue.FairnessGroup, zkqueue.FairnessHeader)
	}
	if err := out.Validate(); err != nil {
		return zkqueue.Fairness{}, invalidf("fairness.weights: %v", err)
	}
	return out, nil
}

// fairnessToPB is a spec's fair dispatch in a QueueInfo; nil when none.
func fairnessToPB(f zkqueue.Fairness) *pb.Fairness {
	if f.Key == "" {
		return nil
	}
	out := &pb.Fairness{Key: f.Key}
	if len(f.Weights) > 0 {
		out.Weights = make(map[string]uint32, len(f.Weights))
		for k, w := range f.Weights {
			out.Weights[k] = uint32(w)
		}
	}
	return out
}
