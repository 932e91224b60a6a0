package broker_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// snapshot returns every node under root with a digest of its data.
func snapshot(t *testing.T, conn *zk.Conn, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(p string)
	walk = func(p string) {
		data, _, err := conn.Get(p)
		if err != nil {
			t.Fatalf("get %s: %v", p, err)
		}
		out[p] = fmt.Sprintf("%x", sha256.Sum256(data))
		children, _, err := conn.Children(p)
		if err != nil {
			t.Fatalf("children %s: %v", p, err)
		}
		for _, c := range children {
			walk(p + "/" + c)
		}
	}
	walk(root)
	return out
}

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// badCall is a call with bad input and the status it must get.
type badCall struct {
	name string
	call func() error
	want codes.Code
}

// badCreates create queues with bad names and options.
func badCreates(ctx context.Context, c pb.QueueClient) []badCall {
	long := strings.Repeat("a", 300)
	return []badCall{
		{"create ..", func() error { _, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: ".."}); return err }, codes.InvalidArgument},
		{"create .", func() error { _, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "."}); return err }, codes.InvalidArgument},
		{"create a/b", func() error { _, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "a/b"}); return err }, codes.InvalidArgument},
		{"create empty", func() error { _, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{}); return err }, codes.InvalidArgument},
		{"create 300 chars", func() error { _, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: long}); return err }, codes.InvalidArgument},
		{"create NUL", func() error { _, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "a\x00b"}); return err }, codes.InvalidArgument},
		{"create sync with 1 member", func() error {
			_, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "s1", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 1})
			return err
		}, codes.InvalidArgument},
		{"create fifo with members", func() error {
			_, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "f2", SyncMembers: 3})
			return err
		}, codes.InvalidArgument},
		{"create bad visibility", func() error {
			_, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "v", VisibilityTimeout: durationpb.New(time.Millisecond)})
			return err
		}, codes.InvalidArgument},
		{"create unknown kind", func() error {
			_, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "k", Kind: 42})
			return err
		}, codes.InvalidArgument},
		{"recreate as other kind", func() error {
			_, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "fifo", Kind: pb.QueueKind_QUEUE_KIND_PRIORITY})
			return err
		}, codes.AlreadyExists},
	}
}

// badPublishes publish to bad queues, over the limits of a broker with
// MaxPayload 1024, MaxBatchCount 5 and MaxBatchBytes 4096, and with bad
// priorities.
func badPublishes(ctx context.Context, c pb.QueueClient) []badCall {
	big := make([]byte, 1025)
	return []badCall{
		{"publish to ../x", func() error {
			_, err := c.Publish(ctx, &pb.PublishRequest{Queue: "../x", Messages: []*pb.OutMessage{{Payload: []byte("x")}}})
			return err
		}, codes.InvalidArgument},
		{"publish to missing", func() error {
			_, err := c.Publish(ctx, &pb.PublishRequest{Queue: "missing", Messages: []*pb.OutMessage{{Payload: []byte("x")}}})
			return err
		}, codes.NotFound},
		{"publish nothing", func() error { _, err := c.Publish(ctx, &pb.PublishRequest{Queue: "fifo"}); return err }, codes.InvalidArgument},
		{"payload over limit", func() error {
			_, err := c.Publish(ctx, &pb.PublishRequest{Queue: "fifo", Messages: []*pb.OutMessage{{Payload: big}}})
			return err
		}, codes.InvalidArgument},
		{"batch over count", func() error {
			req := &pb.PublishRequest{Queue: "fifo"}
			for i := 0; i < 6; i++ {
				req.Messages = append(req.Messages, &pb.OutMessage{Payload: []byte("x")})
			}
			_, err := c.Publish(ctx, req)
			return err
		}, codes.InvalidArgument},
		{"batch over bytes", func() error {
			req := &pb.PublishRequest{Queue: "fifo"}
			for i := 0; i < 5; i++ {
				req.Messages = append(req.Messages, &pb.OutMessage{Payload: make([]byte, 1000)})
			}
			_, err := c.Publish(ctx, req)
			return err
		}, codes.InvalidArgument},
		{"batch with one oversized", func() error {
			req := &pb.PublishRequest{Queue: "fifo", Messages: []*pb.OutMessage{{Payload: []byte("ok")}, {Payload: big}}}
			_, err := c.Publish(ctx, req)
			return err
		}, codes.InvalidArgument},
		{"priority on fifo", func() error {
			_, err := c.Publish(ctx, &pb.PublishRequest{Queue: "fifo", Messages: []*pb.OutMessage{{Payload: []byte("x"), Priority: 3}}})
			return err
		}, codes.FailedPrecondition},
		{"priority out of range", func() error {
			_, err := c.Publish(ctx, &pb.PublishRequest{Queue: "prio", Messages: []*pb.OutMessage{{Payload: []byte("x"), Priority: 256}}})
			return err
		}, codes.InvalidArgument},
	}
}

// badReceives ask for too much.
func badReceives(ctx context.Context, c pb.QueueClient) []badCall {
	return []badCall{
		{"receive too many", func() error {
			_, err := c.Receive(ctx, &pb.ReceiveRequest{Queue: "fifo", MaxMessages: 1000})
			return err
		}, codes.InvalidArgument},
		{"receive bad mode", func() error { _, err := c.Receive(ctx, &pb.ReceiveRequest{Queue: "fifo", Mode: 9}); return err }, codes.InvalidArgument},
		{"receive long wait", func() error {
			_, err := c.Receive(ctx, &pb.ReceiveRequest{Queue: "fifo", Wait: durationpb.New(time.Hour)})
			return err
		}, codes.InvalidArgument},
	}
}

// badSettlements settle leases that are unknown, expired (expired is the
// token of one) or malformed, and redrive and list dead letters badly.
func badSettlements(ctx context.Context, c pb.QueueClient, expired string) []badCall {
	unknown := "fifo/qn-0000000000~0123456789abcdef"
	return []badCall{
		{"ack unknown lease", func() error { _, err := c.Ack(ctx, &pb.AckRequest{AckToken: unknown}); return err }, codes.FailedPrecondition},
		{"ack expired lease", func() error { _, err := c.Ack(ctx, &pb.AckRequest{AckToken: expired}); return err }, codes.FailedPrecondition},
		{"nack expired lease", func() error { _, err := c.Nack(ctx, &pb.NackRequest{AckToken: expired}); return err }, codes.FailedPrecondition},
		{"extend expired lease", func() error {
			_, err := c.ExtendLease(ctx, &pb.ExtendLeaseRequest{AckToken: expired})
			return err
		}, codes.FailedPrecondition},
		{"ack garbage token", func() error { _, err := c.Ack(ctx, &pb.AckRequest{AckToken: "\x00/../..~zz"}); return err }, codes.InvalidArgument},
		{"ack empty token", func() error { _, err := c.Ack(ctx, &pb.AckRequest{}); return err }, codes.InvalidArgument},
		{"ack token of missing queue", func() error {
			_, err := c.Ack(ctx, &pb.AckRequest{AckToken: "nope/qn-0000000000~0123456789abcdef"})
			return err
		}, codes.NotFound},
		{"nack negative delay", func() error {
			_, err := c.Nack(ctx, &pb.NackRequest{AckToken: unknown, Delay: durationpb.New(-time.Second)})
			return err
		}, codes.InvalidArgument},
		{"redrive bad id", func() error {
			_, err := c.Redrive(ctx, &pb.RedriveRequest{Queue: "fifo", Ids: []string{"../../x"}})
			return err
		}, codes.InvalidArgument},
		{"dead letters over limit", func() error {
			_, err := c.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{Queue: "fifo", Limit: 5000})
			return err
		}, codes.InvalidArgument},
	}
}

// badLookupsAndStreams ask for missing queues, open bad Consume streams
// and send a request that is not protobuf.
func badLookupsAndStreams(ctx context.Context, tb *testBroker) []badCall {
	c := tb.client
	return []badCall{
		{"stats of missing", func() error { _, err := c.Stats(ctx, &pb.StatsRequest{Name: "missing"}); return err }, codes.NotFound},
		{"delete missing", func() error { _, err := c.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "missing"}); return err }, codes.NotFound},
		{"consume without subscribe", func() error { return firstReply(ctx, c, &pb.ConsumeRequest{Credit: 1}) }, codes.InvalidArgument},
		{"consume missing queue", func() error {
			return firstReply(ctx, c, &pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "missing"}})
		}, codes.NotFound},
		{"consume huge prefetch", func() error {
			return firstReply(ctx, c, &pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "fifo", Prefetch: 1 << 20}})
		}, codes.InvalidArgument},
		{"consume huge max_batch", func() error {
			return firstReply(ctx, c, &pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "fifo", MaxBatch: 1001}})
		}, codes.InvalidArgument},
		{"garbage protobuf", func() error {
			var out []byte
			return tb.grpcConn.Invoke(ctx, "/qbroker.v1.Queue/Publish", []byte{0xff, 0xff, 0xff, 0x0f, 0x01}, &out, grpc.ForceCodec(rawCodec{}))
		}, codes.Internal},
	}
}

// firstReply opens a Consume stream, sends req and returns the error of
// the first reply.
func firstReply(ctx context.Context, c pb.QueueClient, req *pb.ConsumeRequest) error {
	s, err := c.Consume(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(req); err != nil {
		return err
	}
	_, err = s.Recv()
	return err
}

// Bad input over the wire gets the documented status, changes nothing in
// ZooKeeper, and the broker keeps serving.
func TestBadInput(t *testing.T) {
	root := zktest.Root(t)
	b := newBroker(t, root, func(c *broker.Config) { c.MaxPayload = 1024; c.MaxBatchCount = 5; c.MaxBatchBytes = 4096 })
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "fifo"})
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "prio", Kind: pb.QueueKind_QUEUE_KIND_PRIORITY})
	publishN(t, b.client, "fifo", 3)
	// A live lease whose token we then forge variations of, and an expired one.
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "short", VisibilityTimeout: durationpb.New(200 * time.Millisecond)})
	publishN(t, b.client, "short", 1)
	expired := receive(t, b.client, &pb.ReceiveRequest{Queue: "short", Mode: alo})[0].GetAckToken()
	time.Sleep(300 * time.Millisecond) // past the deadline; the sweep may or may not have run

	conn := zktest.Conn(t)
	before := snapshot(t, conn, root+"/queues/fifo")
	beforePrio := snapshot(t, conn, root+"/queues/prio")

	var tests []badCall
	tests = append(tests, badCreates(ctx, b.client)...)
	tests = append(tests, badPublishes(ctx, b.client)...)
	tests = append(tests, badReceives(ctx, b.client)...)
	tests = append(tests, badSettlements(ctx, b.client, expired)...)
	tests = append(tests, badLookupsAndStreams(ctx, b)...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if got := status.Code(err); got != tt.want {
				t.Fatalf("got %v (%v), want %v", got, err, tt.want)
			}
			if msg := status.Convert(err).Message(); strings.Contains(msg, "goroutine") || strings.Contains(msg, "panic") {
				t.Fatalf("status leaks internals: %q", msg)
			}
		})
	}

	// Raw garbage on the gRPC port.
	c, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("GET / HTTP/1.1\r\n\r\n\x00\x01\x02garbage"))
	c.Close()

	if after := snapshot(t, conn, root+"/queues/fifo"); !equalMaps(before, after) {
		t.Errorf("bad input changed the fifo queue in ZooKeeper:\nbefore %v\nafter  %v", before, after)
	}
	if after := snapshot(t, conn, root+"/queues/prio"); !equalMaps(beforePrio, after) {
		t.Errorf("bad input changed the prio queue in ZooKeeper")
	}
	for _, p := range []string{"/..", "/a", "/s1", "/f2", "/v", "/k"} {
		if ok, _, _ := conn.Exists(root + "/queues" + p); ok {
			t.Errorf("bad create left %s behind", p)
		}
	}
	// Still serving, nothing lost.
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "fifo", MaxMessages: 10})
	if len(ms) != 3 {
		t.Fatalf("after bad input: %d messages, want 3", len(ms))
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A queue at MaxDepth refuses more with ResourceExhausted and writes
// nothing; consuming makes room again.
func TestMaxDepth(t *testing.T) {
	b := newBroker(t, zktest.Root(t), func(c *broker.Config) { c.MaxDepth = 4 })
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "d"})
	publishN(t, b.client, "d", 3)
	two := &pb.PublishRequest{Queue: "d", Messages: []*pb.OutMessage{{Payload: []byte("a")}, {Payload: []byte("b")}}}
	if _, err := b.client.Publish(ctx, two); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("batch past the depth limit: got %v, want ResourceExhausted", err)
	}
	if st := stats(t, b.client, "d"); st.GetReady() != 3 {
		t.Fatalf("ready = %d after a refused batch, want 3", st.GetReady())
	}
	publishN(t, b.client, "d", 1)
	if _, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: "d", Messages: []*pb.OutMessage{{Payload: []byte("x")}}}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("publish to a full queue: got %v, want ResourceExhausted", err)
	}
	receive(t, b.client, &pb.ReceiveRequest{Queue: "d", MaxMessages: 2})
	time.Sleep(150 * time.Millisecond) // the broker re-reads the depth at most every 100ms
	if _, err := b.client.Publish(ctx, two); err != nil {
		t.Fatalf("publish after draining: %v", err)
	}
}
