package broker_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

var testHeaders = map[string]string{"trace-id": "abc123", "tenant": "ünïcode", "empty": ""}

const testContentType = "application/json"

// checkAttrs fails unless m carries testHeaders and testContentType.
func checkAttrs(t *testing.T, what string, m *pb.Message) {
	t.Helper()
	if m == nil {
		t.Fatalf("%s: no message", what)
	}
	if !maps.Equal(m.GetHeaders(), testHeaders) || m.GetContentType() != testContentType {
		t.Fatalf("%s: got headers %v, content type %q; want %v, %q", what, m.GetHeaders(), m.GetContentType(), testHeaders, testContentType)
	}
}

func publishAttrs(t *testing.T, c pb.QueueClient, queue string, payloads ...string) []string {
	t.Helper()
	req := &pb.PublishRequest{Queue: queue}
	for _, p := range payloads {
		req.Messages = append(req.Messages, &pb.OutMessage{Payload: []byte(p), Headers: testHeaders, ContentType: testContentType})
	}
	resp, err := c.Publish(context.Background(), req)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	return resp.GetIds()
}

// consumeAttrs opens a Consume stream, takes one delivery, settles it as
// settle says (nil: no settlement) and ends the stream.
func consumeAttrs(t *testing.T, c pb.QueueClient, sub *pb.Subscribe, settle func(*pb.Message) *pb.Settle) *pb.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&pb.ConsumeRequest{Subscribe: sub}); err != nil {
		t.Fatal(err)
	}
	d, err := s.Recv()
	if err != nil {
		t.Fatalf("Consume: %v", err)
	}
	if st := settle(d.GetMessage()); st != nil {
		if err := s.Send(&pb.ConsumeRequest{Settle: []*pb.Settle{st}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := s.Recv(); err != nil {
			break // the broker has processed the settlement once the stream ends
		}
	}
	return d.GetMessage()
}

// Headers and content type travel with a message through every delivery
// path: both modes of Consume and Receive, a nack, a lease expiry,
// dead-lettering and redrive.
func TestAttributesDelivered(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "a", MaxDeliveries: 3, DeadLetter: true,
		VisibilityTimeout: durationpb.New(500 * time.Millisecond)})

	// One alone, then a batch.
	publishAttrs(t, b.client, "a", "one")
	publishAttrs(t, b.client, "a", "two", "three", "four")

	m := consumeAttrs(t, b.client, &pb.Subscribe{Queue: "a"}, func(*pb.Message) *pb.Settle { return nil })
	checkAttrs(t, "consume at most once", m)
	m = consumeAttrs(t, b.client, &pb.Subscribe{Queue: "a", Mode: alo}, func(m *pb.Message) *pb.Settle {
		return &pb.Settle{AckToken: m.GetAckToken()}
	})
	checkAttrs(t, "consume at least once", m)
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "a"})
	if len(ms) != 1 || string(ms[0].GetPayload()) != "three" {
		t.Fatalf("receive at most once: got %v, want three", ms)
	}
	checkAttrs(t, "receive at most once", ms[0])

	// "four": nacked, then left to expire, then nacked into the dead
	// letters.
	ms = receive(t, b.client, &pb.ReceiveRequest{Queue: "a", Mode: alo})
	checkAttrs(t, "receive at least once", ms[0])
	if _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: ms[0].GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	ms = receive(t, b.client, &pb.ReceiveRequest{Queue: "a", Mode: alo})
	if len(ms) != 1 || ms[0].GetDeliveryCount() != 2 {
		t.Fatalf("after nack: got %v, want delivery 2", ms)
	}
	checkAttrs(t, "redelivery after nack", ms[0])
	ms = receive(t, b.client, &pb.ReceiveRequest{Queue: "a", Mode: alo, Wait: durationpb.New(20 * time.Second)})
	if len(ms) != 1 || ms[0].GetDeliveryCount() != 3 {
		t.Fatalf("after lease expiry: got %v, want delivery 3", ms)
	}
	checkAttrs(t, "redelivery after lease expiry", ms[0])
	id := ms[0].GetId()
	if _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: ms[0].GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	dead, err := b.client.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{Queue: "a"})
	if err != nil || len(dead.GetMessages()) != 1 || dead.GetMessages()[0].GetId() != id {
		t.Fatalf("dead letters: %v, %v; want %s", dead, err, id)
	}
	checkAttrs(t, "dead letter", dead.GetMessages()[0])
	// A plain message after it; the redriven one goes back before it.
	plain, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: "a", Messages: []*pb.OutMessage{{Payload: []byte("plain")}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.Redrive(ctx, &pb.RedriveRequest{Queue: "a"}); err != nil {
		t.Fatal(err)
	}
	ms = receive(t, b.client, &pb.ReceiveRequest{Queue: "a", MaxMessages: 2})
	if len(ms) != 2 || ms[0].GetId() != id || ms[1].GetId() != plain.GetIds()[0] {
		t.Fatalf("after redrive: got %v, want %s then %s", ms, id, plain.GetIds()[0])
	}
	checkAttrs(t, "redriven", ms[0])
	if len(ms[1].GetHeaders()) != 0 || ms[1].GetContentType() != "" {
		t.Fatalf("plain message got attributes %v %q", ms[1].GetHeaders(), ms[1].GetContentType())
	}
}

// Attributes out of bounds are refused with InvalidArgument naming the
// bound, and nothing is written; attribute bytes count against the
// payload and batch byte limits.
func TestAttributesBounded(t *testing.T) {
	root := zktest.Root(t)
	b := newBroker(t, root)
	// Small limits, on a second broker: a request over the gRPC receive
	// limit (the larger of the two, plus 1 KiB) would not reach the check.
	small := newBroker(t, root, func(c *broker.Config) { c.MaxPayload = 8 << 10; c.MaxBatchBytes = 8 << 10 })
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "b"})
	publishN(t, b.client, "b", 1)
	conn := zktest.Conn(t)
	before := snapshot(t, conn, root+"/queues/b")

	tooMany := map[string]string{}
	for i := range zkqueue.MaxHeaders + 1 {
		tooMany[strings.Repeat("k", i+1)] = "v"
	}
	out := func(h map[string]string, ct string, payload int) *pb.OutMessage {
		return &pb.OutMessage{Payload: make([]byte, payload), Headers: h, ContentType: ct}
	}
	tests := []struct {
		name  string
		small bool // on the broker with small limits
		msgs  []*pb.OutMessage
		want  string // in the status message
	}{
		{"too many headers", false, []*pb.OutMessage{out(tooMany, "", 1)}, "65 headers > 64"},
		{"long key", false, []*pb.OutMessage{out(map[string]string{strings.Repeat("k", 300): "v"}, "", 1)}, "> 256"},
		{"empty key", false, []*pb.OutMessage{out(map[string]string{"": "v"}, "", 1)}, "empty header key"},
		{"too many bytes", false, []*pb.OutMessage{out(map[string]string{"big": strings.Repeat("x", 17<<10)}, "", 1)}, "> 16384"},
		{"content type too long", false, []*pb.OutMessage{out(nil, strings.Repeat("c", 17<<10), 1)}, "> 16384"},
		// 5 KiB of headers and 3.5 KiB of payload: each under 8 KiB, not together.
		{"over the payload limit", true, []*pb.OutMessage{out(map[string]string{"h": strings.Repeat("x", 5<<10)}, "", 3584)}, "> 8192"},
		// A batch whose payloads alone would fit 8 KiB.
		{"over the batch bytes", true, []*pb.OutMessage{out(map[string]string{"h": strings.Repeat("x", 3<<10)}, "", 1<<10),
			out(map[string]string{"h": strings.Repeat("x", 3<<10)}, "", 1<<10)}, "per-message overhead > 8192"},
		{"bad second of a batch", false, []*pb.OutMessage{out(nil, "", 1), out(tooMany, "", 1)}, "message 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := b.client
			if tt.small {
				c = small.client
			}
			_, err := c.Publish(ctx, &pb.PublishRequest{Queue: "b", Messages: tt.msgs})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Fatalf("got %v, want InvalidArgument naming %q", err, tt.want)
			}
		})
	}
	// Proto3 strings cannot carry invalid UTF-8 over the wire (the client
	// refuses to encode them); a caller in the broker's process can.
	for _, m := range []*pb.OutMessage{out(map[string]string{"k": "\xff"}, "", 1), out(nil, "text/\xfe", 1),
		out(map[string]string{"\xff": "v"}, "", 1)} {
		_, err := b.b.Publish(ctx, &pb.PublishRequest{Queue: "b", Messages: []*pb.OutMessage{m}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "UTF-8") {
			t.Fatalf("non-UTF-8 %v: got %v, want InvalidArgument naming UTF-8", m, err)
		}
	}
	// Over the wire, gRPC's decoding refuses it before the broker sees it.
	entry := protowire.AppendTag(nil, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "k")
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, "\xff")
	msg := protowire.AppendTag(nil, 1, protowire.BytesType)
	msg = protowire.AppendBytes(msg, []byte("x"))
	msg = protowire.AppendTag(msg, 3, protowire.BytesType)
	msg = protowire.AppendBytes(msg, entry)
	raw := protowire.AppendTag(nil, 1, protowire.BytesType)
	raw = protowire.AppendString(raw, "b")
	raw = protowire.AppendTag(raw, 2, protowire.BytesType)
	raw = protowire.AppendBytes(raw, msg)
	var resp []byte
	err := b.grpcConn.Invoke(ctx, pb.Queue_Publish_FullMethodName, raw, &resp, grpc.ForceCodec(rawCodec{}))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("raw non-UTF-8 header: got %v, want gRPC's Internal decoding error", err)
	}
	if after := snapshot(t, conn, root+"/queues/b"); !equalMaps(before, after) {
		t.Fatalf("refused publishes changed the queue in ZooKeeper:\nbefore %v\nafter  %v", before, after)
	}
	// At the bounds: accepted.
	atBound := map[string]string{}
	for i := range zkqueue.MaxHeaders {
		atBound[strings.Repeat("k", i+1)] = "v"
	}
	ids := publishAttrsMap(t, b.client, "b", atBound)
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "b", MaxMessages: 2})
	if len(ms) != 2 || ms[1].GetId() != ids[0] || !maps.Equal(ms[1].GetHeaders(), atBound) {
		t.Fatalf("64 headers: got %v", ms)
	}
}

func publishAttrsMap(t *testing.T, c pb.QueueClient, queue string, h map[string]string) []string {
	t.Helper()
	resp, err := c.Publish(context.Background(), &pb.PublishRequest{Queue: queue, Messages: []*pb.OutMessage{{Payload: []byte("x"), Headers: h}}})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	return resp.GetIds()
}

// Attribute bytes count against a queue's max_bytes quota like payload
// bytes.
func TestAttributesCountInQuota(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", MaxBytes: 4 << 10})
	big := map[string]string{"h": strings.Repeat("x", 6<<10)}
	_, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: []byte("x"), Headers: big}}})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "max_bytes") {
		t.Fatalf("headers over max_bytes: got %v, want ResourceExhausted naming max_bytes", err)
	}
	if st := stats(t, b.client, "q"); st.GetReady() != 0 {
		t.Fatalf("ready = %d after a refused publish", st.GetReady())
	}
}
