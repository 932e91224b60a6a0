package qbroker

import (
	pb "github.com/qbroker/qbroker/api/queuepb"
)

// Fairness is a queue's fair dispatch by key (QueueOptions.Fairness): the
// brokers serve the keys of its messages in weighted round robin, so that
// one key's backlog does not delay the others' messages beyond their
// share. Order within a key is not kept unless the key is the message
// group (WithGroup).
type Fairness struct {
	// Key is what a message's key is: FairByGroup, or FairByHeader(name)
	// for the value of a header (WithHeader). Empty: no fair dispatch.
	Key string
	// Weights gives keys a weight, 1..100: a key of weight w is served w
	// messages a turn. Keys not listed weigh 1; at most 1000 entries.
	Weights map[string]int
}

// FairByGroup keys fair dispatch by the message group.
const FairByGroup = "group"

// FairByHeader keys fair dispatch by the value of header name.
func FairByHeader(name string) string { return "header:" + name }

// toPB is f in a CreateQueueRequest; nil when f is unset. ok is false for
// a negative weight.
func (f Fairness) toPB() (out *pb.Fairness, ok bool) {
	if f.Key == "" && len(f.Weights) == 0 {
		return nil, true
	}
	out = &pb.Fairness{Key: f.Key}
	if len(f.Weights) > 0 {
		out.Weights = make(map[string]uint32, len(f.Weights))
		for k, w := range f.Weights {
			if w < 0 {
				return nil, false
			}
			out.Weights[k] = uint32(w)
		}
	}
	return out, true
}

func fairnessFromPB(f *pb.Fairness) Fairness {
	if f == nil {
		return Fairness{}
	}
	out := Fairness{Key: f.GetKey()}
	if len(f.GetWeights()) > 0 {
		out.Weights = make(map[string]int, len(f.GetWeights()))
		for k, w := range f.GetWeights() {
			out.Weights[k] = int(w)
		}
	}
	return out
}
