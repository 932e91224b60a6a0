package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

func durations(ds ...time.Duration) []*durationpb.Duration {
	out := make([]*durationpb.Duration, len(ds))
	for i, d := range ds {
		out[i] = durationpb.New(d)
	}
	return out
}

// A message nacked without a delay comes back at each step of the
// queue's schedule, within 10% of it, and is dead-lettered at its max
// deliveries. The steps are long enough for 10% to cover two ZooKeeper
// writes (the release at the step, the next claim) on a loaded machine.
func TestRetryBackoffSteps(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	steps := []time.Duration{3 * time.Second, 6 * time.Second, 12 * time.Second}
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", MaxDeliveries: 4, DeadLetter: true,
		RetryBackoff: &pb.RetryBackoff{Steps: durations(steps...)}})
	if _, err := b.client.Publish(context.Background(), &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("x")}}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := b.client.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "q", Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE}}); err != nil {
		t.Fatal(err)
	}
	var nacked time.Time
	for i := 0; i < 4; i++ {
		d, err := stream.Recv()
		if err != nil {
			t.Fatalf("delivery %d: %v", i+1, err)
		}
		got := time.Since(nacked)
		if m := d.GetMessage(); m.GetDeliveryCount() != uint32(i+1) {
			t.Fatalf("delivery %d counts %d", i+1, m.GetDeliveryCount())
		}
		if i > 0 {
			step := steps[i-1]
			if got < step || got > step+step/10 {
				t.Errorf("delivery %d came %v after the nack, want the step %v within 10%%", i+1, got, step)
			} else {
				t.Logf("delivery %d came %v after the nack (step %v)", i+1, got, step)
			}
		}
		nacked = time.Now()
		if err := stream.Send(&pb.ConsumeRequest{Credit: 1, Settle: []*pb.Settle{{AckToken: d.GetMessage().GetAckToken(), Nack: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the message dead-lettered", 10*time.Second, func() bool {
		st := stats(t, b.client, "q")
		return st.GetDead() == 1 && st.GetInFlight() == 0 && st.GetReady() == 0
	})
	if got := time.Since(nacked); got > steps[len(steps)-1] {
		t.Errorf("dead-lettered %v after the last nack: a message past max deliveries must not wait a step", got)
	}
}

// A lease that expired on a queue with a schedule waits its step too,
// counted from when the sweep found it expired; the message stays in
// flight meanwhile.
func TestRetryBackoffExpiry(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	const step = time.Second
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", VisibilityTimeout: durationpb.New(300 * time.Millisecond),
		RetryBackoff: &pb.RetryBackoff{Initial: durationpb.New(step), Multiplier: 2, Max: durationpb.New(time.Minute)}})
	if _, err := b.client.Publish(context.Background(), &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("x")}}}); err != nil {
		t.Fatal(err)
	}
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE, Wait: durationpb.New(5 * time.Second)})
	if len(ms) != 1 {
		t.Fatalf("received %d messages", len(ms))
	}
	deadline := ms[0].GetLeaseDeadline().AsTime()
	var again *pb.Message
	waitFor(t, "the redelivery", 20*time.Second, func() bool {
		ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE})
		if len(ms) == 1 {
			again = ms[0]
			return true
		}
		if time.Now().After(deadline.Add(200 * time.Millisecond)) {
			if st := stats(t, b.client, "q"); st.GetReady() != 0 && time.Since(deadline) < step {
				t.Fatalf("ready %v after the lease's deadline, before its step %v", time.Since(deadline), step)
			}
		}
		return false
	})
	got := time.Since(deadline)
	// The sweep (every 100ms here) finds the expiry, then the step runs.
	if got < step || got > step+step/10+500*time.Millisecond {
		t.Fatalf("redelivered %v after the lease's deadline, want its step %v after the sweep found it", got, step)
	}
	if again.GetDeliveryCount() != 2 || again.GetFencingToken() <= ms[0].GetFencingToken() {
		t.Fatalf("redelivery: count %d token %d after token %d", again.GetDeliveryCount(), again.GetFencingToken(), ms[0].GetFencingToken())
	}
}

// Bad schedules are refused with InvalidArgument naming the field, and
// create nothing; a good one is stored and shown by GetQueue (with the
// exponential defaults filled in), and CreateQueue with the same schedule
// is idempotent, with another AlreadyExists.
func TestRetryBackoffConfig(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		r    *pb.RetryBackoff
		says string
	}{
		{"not increasing", &pb.RetryBackoff{Steps: durations(time.Second, 5*time.Second, 5*time.Second)}, "retry_backoff.steps[2]: 5s is not greater than steps[1]"},
		{"decreasing", &pb.RetryBackoff{Steps: durations(time.Second, 500*ms)}, "retry_backoff.steps[1]"},
		{"zero step", &pb.RetryBackoff{Steps: durations(0)}, "retry_backoff.steps[0]: 0s not in [1ms, 12h0m0s]"},
		{"negative step", &pb.RetryBackoff{Steps: durations(time.Second, -time.Second)}, "retry_backoff.steps[1]"},
		{"too many steps", &pb.RetryBackoff{Steps: durations(make([]time.Duration, 33)...)}, "retry_backoff.steps: 33 steps > 32"},
		{"steps and exponential", &pb.RetryBackoff{Steps: durations(time.Second), Initial: durationpb.New(time.Second)}, "retry_backoff.steps: both"},
		{"empty", &pb.RetryBackoff{}, "retry_backoff: set steps, or initial"},
		{"zero initial", &pb.RetryBackoff{Initial: durationpb.New(0)}, "retry_backoff.initial"},
		{"multiplier below 1", &pb.RetryBackoff{Initial: durationpb.New(time.Second), Multiplier: 0.5}, "retry_backoff.multiplier"},
		{"cap below initial", &pb.RetryBackoff{Initial: durationpb.New(time.Minute), Max: durationpb.New(time.Second)}, "retry_backoff.max: 1s is below initial (1m0s)"},
		{"invalid duration", &pb.RetryBackoff{Steps: []*durationpb.Duration{{Seconds: 1, Nanos: -1}}}, "retry_backoff.steps[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "bad-" + strings.ReplaceAll(tc.name, " ", "-")
			_, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: name, RetryBackoff: tc.r})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.says) {
				t.Fatalf("got %v, want InvalidArgument saying %q", err, tc.says)
			}
			if _, err := b.client.GetQueue(ctx, &pb.GetQueueRequest{Name: name}); status.Code(err) != codes.NotFound {
				t.Fatalf("GetQueue after the refused create: %v, want NotFound", err)
			}
		})
	}

	steps := &pb.RetryBackoff{Steps: durations(time.Second, 5*time.Second, 30*time.Second, 5*time.Minute)}
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "steps", RetryBackoff: steps})
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "steps", RetryBackoff: steps})
	info, err := b.client.GetQueue(ctx, &pb.GetQueueRequest{Name: "steps"})
	if err != nil {
		t.Fatal(err)
	}
	if got := info.GetRetryBackoff().GetSteps(); len(got) != 4 || got[3].AsDuration() != 5*time.Minute || info.GetRetryBackoff().GetInitial() != nil {
		t.Fatalf("GetQueue shows %v", info.GetRetryBackoff())
	}
	if _, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "steps", RetryBackoff: &pb.RetryBackoff{Steps: durations(time.Second)}}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("CreateQueue with another schedule: %v, want AlreadyExists", err)
	}
	if _, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "steps"}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("CreateQueue without the schedule: %v, want AlreadyExists", err)
	}

	info, err = b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "exp", RetryBackoff: &pb.RetryBackoff{Initial: durationpb.New(time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	if r := info.GetRetryBackoff(); r.GetInitial().AsDuration() != time.Second || r.GetMultiplier() != 2 || r.GetMax().AsDuration() != 12*time.Hour {
		t.Fatalf("exponential schedule shown as %v, want the defaults filled in", r)
	}
	if info, err := b.client.GetQueue(ctx, &pb.GetQueueRequest{Name: "plain"}); err == nil || info.GetRetryBackoff() != nil {
		t.Fatalf("GetQueue of a missing queue: %v, %v", info, err)
	}
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "plain"})
	if info, err := b.client.GetQueue(ctx, &pb.GetQueueRequest{Name: "plain"}); err != nil || info.GetRetryBackoff() != nil {
		t.Fatalf("GetQueue of a queue without a schedule: %v, %v", info.GetRetryBackoff(), err)
	}
}
