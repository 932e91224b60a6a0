package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// zkGets returns how many ZooKeeper reads of node data (op "get") the
// broker registered on reg has made.
func zkGets(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range fams {
		if f.GetName() != "qbroker_zk_request_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == "get" {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}

// quiet makes a broker that reads nothing by itself during a test: no
// lease sweep, no gauge refresh.
func quiet(reg *prometheus.Registry) func(*broker.Config) {
	return func(c *broker.Config) {
		c.SweepInterval, c.StatsInterval = time.Hour, time.Hour
		c.Registerer = reg
	}
}

// withHint returns tok with its deadline hint replaced by deadline and its
// signature replaced by mac (dropped when empty).
func withHint(t *testing.T, tok string, deadline time.Time, mac string) string {
	t.Helper()
	parts := strings.Split(tok, "/")
	if len(parts) != 3 {
		t.Fatalf("token %q: want <queue>/<lease>/<hint>", tok)
	}
	f := strings.Split(parts[2], ".")
	if len(f) < 3 {
		t.Fatalf("token %q: want a hint <ms>.<deliveries>.<size>[.<mac>]", tok)
	}
	hint := fmt.Sprintf("%d.%s.%s", deadline.UnixMilli(), f[1], f[2])
	if mac != "" {
		hint += "." + mac
	}
	return parts[0] + "/" + parts[1] + "/" + hint
}

// An ack token whose deadline hint was edited cannot ack a lease that
// expired (and that the sweep has not released yet): whatever the hint,
// the broker then reads the lease's real deadline.
func TestEditedAckHintCannotAckExpiredLease(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := newBroker(t, zktest.Root(t), quiet(reg))
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", VisibilityTimeout: durationpb.New(200 * time.Millisecond)})
	publishN(t, b.client, "q", 1)
	m := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", Mode: alo})[0]
	tok := m.GetAckToken()
	// Wait for the lease to expire (no sweep will release it).
	time.Sleep(time.Until(m.GetLeaseDeadline().AsTime().Add(500 * time.Millisecond)))

	later := time.Now().Add(time.Hour)
	mac := "" // the token's own signature
	if f := strings.Split(strings.Split(tok, "/")[2], "."); len(f) == 4 {
		mac = f[3]
	}
	for name, forged := range map[string]string{
		"hint moved, old signature": withHint(t, tok, later, mac),
		"hint moved, no signature":  withHint(t, tok, later, ""),
		"hint moved, bad signature": withHint(t, tok, later, "AAAAAAAAAAAAAAAAAAAAAA"),
	} {
		_, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: forged})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("ack of an expired lease, %s: got %v, want FailedPrecondition", name, err)
		}
	}
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: tok}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ack of an expired lease with its own token: got %v, want FailedPrecondition", err)
	}
	if st := stats(t, b.client, "q"); st.GetInFlight() != 1 {
		t.Fatalf("in flight = %d after the refused acks, want the lease still there", st.GetInFlight())
	}
}

// A genuine token acks without reading the lease, on any broker of the
// root (they share the signing key); a token whose hint does not verify
// acks a live lease the safe way, reading it first.
func TestGenuineTokenAcksWithoutRead(t *testing.T) {
	root := zktest.Root(t)
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := newBroker(t, root, quiet(regA))
	b := newBroker(t, root, quiet(regB))
	ctx := context.Background()
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "q"})
	publishN(t, a.client, "q", 2)
	ms := receive(t, a.client, &pb.ReceiveRequest{Queue: "q", Mode: alo, MaxMessages: 2})
	if len(ms) != 2 {
		t.Fatalf("received %d messages, want 2", len(ms))
	}
	stats(t, b.client, "q") // loads the queue on b

	before := zkGets(t, regB)
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: ms[0].GetAckToken()}); err != nil {
		t.Fatalf("ack on the other broker: %v", err)
	}
	if got := zkGets(t, regB) - before; got != 0 {
		t.Errorf("a genuine token's ack read ZooKeeper %d times, want 0", got)
	}

	tok := ms[1].GetAckToken()
	edited := withHint(t, tok, ms[1].GetLeaseDeadline().AsTime().Add(time.Minute), "")
	before = zkGets(t, regB)
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: edited}); err != nil {
		t.Fatalf("ack of a live lease with an unsigned hint: %v", err)
	}
	if got := zkGets(t, regB) - before; got == 0 {
		t.Errorf("an unsigned hint's ack did not read the lease")
	}
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: tok}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("second ack: got %v, want FailedPrecondition", err)
	}
	if st := stats(t, a.client, "q"); st.GetInFlight() != 0 || st.GetReady() != 0 {
		t.Fatalf("after the acks: %v, want nothing left", st)
	}
}

// A nacked lease is settled: Ack (read-free or not), Nack and Extend of it
// all answer FailedPrecondition, and a delayed nack still redelivers the
// message when its delay ends.
func TestNackedLeaseIsSettled(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	publishN(t, b.client, "q", 2)
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", Mode: alo, MaxMessages: 2})
	if len(ms) != 2 {
		t.Fatalf("received %d messages, want 2", len(ms))
	}
	tok := ms[0].GetAckToken()
	if _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: tok, Delay: durationpb.New(12 * time.Hour)}); err != nil {
		t.Fatalf("nack with a delay: %v", err)
	}
	unsigned := strings.Join(strings.Split(tok, "/")[:2], "/")
	for name, call := range map[string]func() error{
		"ack":                func() error { _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: tok}); return err },
		"ack without a hint": func() error { _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: unsigned}); return err },
		"nack":               func() error { _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: tok}); return err },
		"extend": func() error {
			_, err := b.client.ExtendLease(ctx, &pb.ExtendLeaseRequest{AckToken: tok})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s after a delayed nack: got %v, want FailedPrecondition", name, err)
		}
	}
	if st := stats(t, b.client, "q"); st.GetInFlight() != 2 || st.GetReady() != 0 {
		t.Fatalf("after the refused settlements: in flight %d, ready %d; want 2 and 0", st.GetInFlight(), st.GetReady())
	}

	// A short delay ends in a redelivery, and the old token stays refused.
	tok = ms[1].GetAckToken()
	if _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: tok, Delay: durationpb.New(300 * time.Millisecond)}); err != nil {
		t.Fatalf("nack with a short delay: %v", err)
	}
	again := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", Mode: alo, Wait: durationpb.New(30 * time.Second)})
	if len(again) != 1 || again[0].GetId() != ms[1].GetId() || again[0].GetDeliveryCount() != 2 {
		t.Fatalf("after the delay: got %v, want %s delivered a second time", again, ms[1].GetId())
	}
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: tok}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ack of the nacked delivery after its redelivery: got %v, want FailedPrecondition", err)
	}
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: again[0].GetAckToken()}); err != nil {
		t.Errorf("ack of the redelivery: %v", err)
	}
}

// A duplicate member id is AlreadyExists with its own message, naming the
// member and queue and no ZooKeeper path.
func TestDuplicateSyncMember(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "g", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 3})
	first := join(t, b.client, "g", "m1")
	first.next(t)
	dup := join(t, b.client, "g", "m1")
	_, err := dup.stream.Recv()
	want := "member m1 already joined queue g"
	if status.Code(err) != codes.AlreadyExists || status.Convert(err).Message() != want {
		t.Fatalf("duplicate member: got %v, want AlreadyExists %q", err, want)
	}
}
