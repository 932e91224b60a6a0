package broker_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

func publishN(t *testing.T, c pb.QueueClient, queue string, n int) {
	t.Helper()
	for i := 0; i < n; i += 50 {
		req := &pb.PublishRequest{Queue: queue}
		for j := i; j < min(i+50, n); j++ {
			req.Messages = append(req.Messages, &pb.OutMessage{Payload: []byte(fmt.Sprintf("m%05d", j))})
		}
		if _, err := c.Publish(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
}

func receive(t *testing.T, c pb.QueueClient, req *pb.ReceiveRequest) []*pb.Message {
	t.Helper()
	resp, err := c.Receive(context.Background(), req)
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	return resp.GetMessages()
}

func stats(t *testing.T, c pb.QueueClient, queue string) *pb.QueueStats {
	t.Helper()
	st, err := c.Stats(context.Background(), &pb.StatsRequest{Name: queue})
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return st
}

var alo = pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE

// buildQbroker builds the qbroker command once per test binary.
func buildQbroker(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(os.TempDir(), fmt.Sprintf("qbroker-test-%d", os.Getpid()))
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	out, err := exec.Command("go", "build", "-o", bin, "../cmd/qbroker").CombinedOutput()
	if err != nil {
		t.Fatalf("go build qbroker: %v\n%s", err, out)
	}
	t.Cleanup(func() { os.Remove(bin) })
	return bin
}

// startQbrokerProcess starts `qbroker serve` under root on a free
// 127.0.0.1 port, with the further flags args, killed when the test ends,
// and returns it with a connection to it once it is SERVING.
func startQbrokerProcess(t *testing.T, root string, args ...string) (*exec.Cmd, *grpc.ClientConn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	cmd := exec.Command(buildQbroker(t), append([]string{"serve", "--zk", zktest.Addr(t), "--root", root,
		"--listen", addr, "--metrics-listen", "", "--log-level", "warn", "--insecure"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	for {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return cmd, conn
		}
		if ctx.Err() != nil {
			t.Fatal("the qbroker process never became SERVING")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A broker process is killed (SIGKILL) with at-least-once messages in
// flight: another broker redelivers all of them after the visibility
// timeout; none is lost.
func TestKilledBrokerProcessLosesNothing(t *testing.T) {
	root := zktest.Root(t)
	survivor := newBroker(t, root)
	const queue, n, inFlight = "jobs", 200, 60
	createQueue(t, survivor.client, &pb.CreateQueueRequest{Name: queue, VisibilityTimeout: durationpb.New(2 * time.Second)})
	publishN(t, survivor.client, queue, n)

	// The victim: a real qbroker process.
	cmd, conn := startQbrokerProcess(t, root)
	victim := pb.NewQueueClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	held := map[string]bool{}
	for len(held) < inFlight {
		for _, m := range receive(t, victim, &pb.ReceiveRequest{Queue: queue, Mode: alo, MaxMessages: 20}) {
			held[string(m.GetPayload())] = true
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if st := stats(t, survivor.client, queue); st.GetInFlight() != uint64(len(held)) {
		t.Fatalf("after the kill: %d in flight, want %d", st.GetInFlight(), len(held))
	}

	got := map[string]uint32{}
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		for _, m := range receive(t, survivor.client, &pb.ReceiveRequest{Queue: queue, Mode: alo, MaxMessages: 50, Wait: durationpb.New(time.Second)}) {
			p := string(m.GetPayload())
			if _, dup := got[p]; dup {
				t.Fatalf("%s delivered twice by the survivor", p)
			}
			got[p] = m.GetDeliveryCount()
			if _, err := survivor.client.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()}); err != nil {
				t.Fatalf("ack %s: %v", p, err)
			}
		}
	}
	if len(got) != n {
		t.Fatalf("survivor delivered %d messages, want %d", len(got), n)
	}
	for p := range held {
		if got[p] != 2 {
			t.Errorf("%s: delivery count %d after the kill, want 2", p, got[p])
		}
	}
	if st := stats(t, survivor.client, queue); st.GetReady()+st.GetInFlight() != 0 {
		t.Errorf("queue not empty: %v", st)
	}
}

// Nacked past max deliveries, a message lands in the dead letters; Redrive
// brings it back with a fresh delivery count.
func TestDeadLetterAndRedrive(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "dl", MaxDeliveries: 3, DeadLetter: true})
	publishN(t, b.client, "dl", 2)

	var id string
	for i := 1; i <= 3; i++ {
		ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "dl", Mode: alo})
		if len(ms) != 1 || ms[0].GetDeliveryCount() != uint32(i) || string(ms[0].GetPayload()) != "m00000" {
			t.Fatalf("delivery %d: got %v", i, ms)
		}
		id = ms[0].GetId()
		if _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: ms[0].GetAckToken()}); err != nil {
			t.Fatal(err)
		}
	}
	dead, err := b.client.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{Queue: "dl"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead.GetMessages()) != 1 || dead.GetMessages()[0].GetId() != id || dead.GetMessages()[0].GetDeliveryCount() != 3 {
		t.Fatalf("dead letters = %v, want %s with 3 deliveries", dead.GetMessages(), id)
	}
	if st := stats(t, b.client, "dl"); st.GetDead() != 1 || st.GetReady() != 1 || st.GetInFlight() != 0 {
		t.Fatalf("stats = %v, want 1 dead, 1 ready", st)
	}
	// The other message is next now.
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "dl"})
	if len(ms) != 1 || string(ms[0].GetPayload()) != "m00001" {
		t.Fatalf("got %v, want m00001", ms)
	}
	r, err := b.client.Redrive(ctx, &pb.RedriveRequest{Queue: "dl", Ids: []string{id}})
	if err != nil || r.GetRedriven() != 1 {
		t.Fatalf("Redrive = %v, %v; want 1", r, err)
	}
	ms = receive(t, b.client, &pb.ReceiveRequest{Queue: "dl", Mode: alo})
	if len(ms) != 1 || ms[0].GetId() != id || ms[0].GetDeliveryCount() != 1 {
		t.Fatalf("after redrive got %v, want %s with delivery count 1", ms, id)
	}
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: ms[0].GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	// Acking twice is an unknown lease.
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: ms[0].GetAckToken()}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second ack: got %v, want FailedPrecondition", err)
	}
	if st := stats(t, b.client, "dl"); st.GetDead()+st.GetReady()+st.GetInFlight() != 0 {
		t.Fatalf("stats = %v, want empty", st)
	}
}

// Leases expire: an unacked message comes back after the visibility
// timeout with its delivery count raised; a nack with a delay holds it
// back; ExtendLease keeps it; an expired token no longer acks.
func TestLeaseExpiryNackDelayExtend(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "l", VisibilityTimeout: durationpb.New(500 * time.Millisecond)})
	publishN(t, b.client, "l", 1)

	first := receive(t, b.client, &pb.ReceiveRequest{Queue: "l", Mode: alo})[0]
	if got := receive(t, b.client, &pb.ReceiveRequest{Queue: "l", Mode: alo}); len(got) != 0 {
		t.Fatalf("leased message delivered again before expiry: %v", got)
	}
	second := receive(t, b.client, &pb.ReceiveRequest{Queue: "l", Mode: alo, Wait: durationpb.New(5 * time.Second)})
	if len(second) != 1 || second[0].GetDeliveryCount() != 2 || second[0].GetId() != first.GetId() {
		t.Fatalf("after expiry got %v, want %s with delivery count 2", second, first.GetId())
	}
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: first.GetAckToken()}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("ack of an expired lease: got %v, want FailedPrecondition", err)
	}
	// Extend well past the visibility timeout, then nack with a delay.
	if _, err := b.client.ExtendLease(ctx, &pb.ExtendLeaseRequest{AckToken: second[0].GetAckToken(), VisibilityTimeout: durationpb.New(5 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(800 * time.Millisecond)
	if got := receive(t, b.client, &pb.ReceiveRequest{Queue: "l", Mode: alo}); len(got) != 0 {
		t.Fatalf("extended lease expired early: %v", got)
	}
	start := time.Now()
	if _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: second[0].GetAckToken(), Delay: durationpb.New(time.Second)}); err != nil {
		t.Fatal(err)
	}
	third := receive(t, b.client, &pb.ReceiveRequest{Queue: "l", Mode: alo, Wait: durationpb.New(10 * time.Second)})
	if len(third) != 1 || third[0].GetDeliveryCount() != 3 {
		t.Fatalf("after delayed nack got %v, want delivery count 3", third)
	}
	if waited := time.Since(start); waited < time.Second {
		t.Fatalf("delayed nack redelivered after %v, before its 1s delay", waited)
	}
	// A token acks past its original deadline when the lease was extended.
	if _, err := b.client.ExtendLease(ctx, &pb.ExtendLeaseRequest{AckToken: third[0].GetAckToken(), VisibilityTimeout: durationpb.New(5 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: third[0].GetAckToken()}); err != nil {
		t.Fatalf("ack of an extended lease past its first deadline: %v", err)
	}
	if st := stats(t, b.client, "l"); st.GetReady()+st.GetInFlight() != 0 {
		t.Fatalf("after the ack: %v", st)
	}
}

// Graceful shutdown releases a stream's unacknowledged leases at once: they
// do not wait for the visibility timeout.
func TestShutdownReleasesInFlight(t *testing.T) {
	root := zktest.Root(t)
	a := newBroker(t, root)
	other := newBroker(t, root)
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "s", VisibilityTimeout: durationpb.New(10 * time.Minute)})
	publishN(t, a.client, "s", 10)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := a.client.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "s", Mode: alo, Prefetch: 5}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if st := stats(t, other.client, "s"); st.GetInFlight() != 5 || st.GetConsumers() != 1 {
		t.Fatalf("stats = %v, want 5 in flight and 1 consumer", st)
	}
	a.stop()
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("stream after shutdown: got %v, want Unavailable", err)
	}
	st := stats(t, other.client, "s")
	if st.GetInFlight() != 0 || st.GetReady() != 10 || st.GetConsumers() != 0 {
		t.Fatalf("after shutdown stats = %v, want 10 ready, 0 in flight, 0 consumers", st)
	}
	ms := receive(t, other.client, &pb.ReceiveRequest{Queue: "s", MaxMessages: 10})
	if len(ms) != 10 {
		t.Fatalf("got %d messages, want 10", len(ms))
	}
	for i, m := range ms {
		want := fmt.Sprintf("m%05d", i)
		if string(m.GetPayload()) != want {
			t.Errorf("message %d = %s, want %s (released messages keep their place)", i, m.GetPayload(), want)
		}
	}
}

// Consume's credit: with prefetch 2 and no further credit the broker sends
// two deliveries and waits.
func TestConsumeCredit(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "c"})
	publishN(t, b.client, "c", 10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := b.client.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "c", Prefetch: 2}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if st := stats(t, b.client, "c"); st.GetReady() != 8 {
		t.Fatalf("ready = %d without credit, want 8", st.GetReady())
	}
	if err := stream.Send(&pb.ConsumeRequest{Credit: 3}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	if st := stats(t, b.client, "c"); st.GetReady() != 5 {
		t.Fatalf("ready = %d, want 5", st.GetReady())
	}
}

// A stream that asks for max_batch receives several messages per
// Delivery, never more than max_batch nor than its credit, in queue order,
// each with its own ack token: a nack of one message in the middle of a
// batched Delivery redelivers that message alone. Plain and packed
// queues, at least once.
func TestConsumeBatchedDeliveries(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	for _, packed := range []bool{false, true} {
		t.Run(fmt.Sprintf("packed=%v", packed), func(t *testing.T) {
			name := fmt.Sprintf("batched-%v", packed)
			createQueue(t, b.client, &pb.CreateQueueRequest{Name: name, Packed: packed})
			const n, prefetch, maxBatch = 60, 20, 8
			publishN(t, b.client, name, n)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			stream, err := b.client.Consume(ctx)
			if err != nil {
				t.Fatal(err)
			}
			sub := &pb.Subscribe{Queue: name, Mode: alo, Prefetch: prefetch, MaxBatch: maxBatch}
			if err := stream.Send(&pb.ConsumeRequest{Subscribe: sub}); err != nil {
				t.Fatal(err)
			}
			granted, received, batched := prefetch, 0, 0
			var nacked string // payload of the message nacked
			redelivered := false
			var got []string
			for len(got) < n || nacked != "" && !redelivered {
				d, err := stream.Recv()
				if err != nil {
					t.Fatalf("Recv after %d messages: %v", received, err)
				}
				msgs := append([]*pb.Message{d.GetMessage()}, d.GetMore()...)
				if len(msgs) > maxBatch {
					t.Fatalf("a Delivery of %d messages, want at most max_batch %d", len(msgs), maxBatch)
				}
				if len(msgs) > 1 {
					batched++
				}
				received += len(msgs)
				if received > granted {
					t.Fatalf("%d messages received with %d credit granted", received, granted)
				}
				req := &pb.ConsumeRequest{Credit: uint32(len(msgs))}
				for i, m := range msgs {
					if m.GetAckToken() == "" {
						t.Fatalf("message %q has no ack token", m.GetPayload())
					}
					p := string(m.GetPayload())
					nack := nacked == "" && len(msgs) > 2 && i == 1
					if nack {
						nacked = p
					}
					if m.GetDeliveryCount() > 1 {
						if p != nacked || m.GetDeliveryCount() != 2 {
							t.Fatalf("redelivered %q (delivery %d), want only the nacked %q, once", p, m.GetDeliveryCount(), nacked)
						}
						redelivered = true
					} else {
						got = append(got, p)
					}
					req.Settle = append(req.Settle, &pb.Settle{AckToken: m.GetAckToken(), Nack: nack})
				}
				granted += len(msgs)
				if err := stream.Send(req); err != nil {
					t.Fatal(err)
				}
			}
			if batched == 0 || nacked == "" {
				t.Fatalf("no Delivery carried more than one message (%d batched, nacked %q)", batched, nacked)
			}
			if len(got) != n {
				t.Fatalf("%d first deliveries, want %d", len(got), n)
			}
			for i, p := range got {
				if want := fmt.Sprintf("m%05d", i); p != want {
					t.Fatalf("first delivery %d is %q, want %q (queue order)", i, p, want)
				}
			}
			if err := stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			for {
				if _, err := stream.Recv(); err != nil {
					break
				}
			}
			zktest.WaitFor(t, 30*time.Second, "every message acked", func() bool {
				st := stats(t, b.client, name)
				return st.GetReady() == 0 && st.GetInFlight() == 0
			})
		})
	}
}

// A stream that does not ask for max_batch (an older client), or asks
// for 1, receives one message per Delivery even when many are ready.
func TestConsumeUnbatchedByDefault(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "single", Packed: true})
	const n = 40
	publishN(t, b.client, "single", 2*n)
	for _, maxBatch := range []uint32{0, 1} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		stream, err := b.client.Consume(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sub := &pb.Subscribe{Queue: "single", Mode: alo, Prefetch: n, MaxBatch: maxBatch}
		if err := stream.Send(&pb.ConsumeRequest{Subscribe: sub}); err != nil {
			t.Fatal(err)
		}
		req := &pb.ConsumeRequest{}
		for i := 0; i < n; i++ {
			d, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(d.GetMore()) != 0 {
				t.Fatalf("max_batch %d: a Delivery of %d messages, want 1", maxBatch, 1+len(d.GetMore()))
			}
			req.Settle = append(req.Settle, &pb.Settle{AckToken: d.GetMessage().GetAckToken()})
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := stream.Recv(); err != nil {
				break
			}
		}
	}
	zktest.WaitFor(t, 30*time.Second, "every message acked", func() bool {
		st := stats(t, b.client, "single")
		return st.GetReady() == 0 && st.GetInFlight() == 0
	})
}

var _ = bufio.NewReader
var _ = strings.TrimSpace

// A queue deleted while a consumer waits on it ends the stream with
// NotFound; publishing to it is NotFound too.
func TestDeleteQueueUnderConsumer(t *testing.T) {
	root := zktest.Root(t)
	a, other := newBroker(t, root), newBroker(t, root)
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: "doomed"})
	publishN(t, a.client, "doomed", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := a.client.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "doomed", Prefetch: 10}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := other.client.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "doomed"}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.NotFound {
		t.Fatalf("stream of a deleted queue: got %v, want NotFound", err)
	}
	_, err = a.client.Publish(ctx, &pb.PublishRequest{Queue: "doomed", Messages: []*pb.OutMessage{{Payload: []byte("x")}}})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("publish to a deleted queue: got %v, want NotFound", err)
	}
}
