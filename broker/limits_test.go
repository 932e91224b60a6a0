package broker_test

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// Any publish within the limits is accepted, up to the largest payload a
// broker can be configured with; a payload over the limit gets the
// broker's own InvalidArgument naming the limit, and only a request well
// past every limit is refused by gRPC itself (ResourceExhausted).
func TestLargestPayloadIsAccepted(t *testing.T) {
	b := newBroker(t, zktest.Root(t), func(c *broker.Config) { c.MaxPayload = zkqueue.HardMaxPayload })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "big"})
	publish := func(size int) error {
		_, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: "big", Messages: []*pb.OutMessage{{Payload: bytes.Repeat([]byte{'x'}, size)}}})
		return err
	}
	if err := publish(zkqueue.HardMaxPayload); err != nil {
		t.Fatalf("publish of %d bytes with --max-payload %d: %v", zkqueue.HardMaxPayload, zkqueue.HardMaxPayload, err)
	}
	for _, mode := range []pb.DeliveryMode{pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE, pb.DeliveryMode_DELIVERY_MODE_AT_MOST_ONCE} {
		ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "big", Mode: mode})
		if len(ms) != 1 || len(ms[0].GetPayload()) != zkqueue.HardMaxPayload {
			t.Fatalf("%v: received %d messages, want the one of %d bytes", mode, len(ms), zkqueue.HardMaxPayload)
		}
		if mode == alo {
			if _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: ms[0].GetAckToken()}); err != nil {
				t.Fatalf("nack: %v", err)
			}
		}
	}

	err := publish(zkqueue.HardMaxPayload + 1)
	limit := strconv.Itoa(zkqueue.HardMaxPayload)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), limit) {
		t.Fatalf("payload one byte over: got %v, want InvalidArgument naming %s", err, limit)
	}
	if err := publish(zkqueue.HardMaxPayload + 64<<10); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("payload 64 KiB over: got %v, want ResourceExhausted from gRPC", err)
	}
	if st := stats(t, b.client, "big"); st.GetReady() != 0 || st.GetInFlight() != 0 {
		t.Fatalf("after the refused publishes: %v, want an empty queue", st)
	}
}

// A batch over the byte limit is refused with a message that states the
// per-message overhead the limit counts.
func TestBatchLimitStatesOverhead(t *testing.T) {
	b := newBroker(t, zktest.Root(t), func(c *broker.Config) { c.MaxPayload = 1000; c.MaxBatchBytes = 2000 })
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	req := &pb.PublishRequest{Queue: "q"}
	for range 2 {
		req.Messages = append(req.Messages, &pb.OutMessage{Payload: make([]byte, 900)})
	}
	_, err := b.client.Publish(context.Background(), req)
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, "bytes of per-message overhead > 2000") {
		t.Fatalf("batch of 2 x 900 bytes under a 2000-byte limit: got %v, want InvalidArgument stating the per-message overhead", err)
	}
}

// Bad limit and duration settings fail New with the value named, and the
// setting by its flag.
func TestConfigValidation(t *testing.T) {
	for _, tt := range []struct {
		name string
		mod  func(*broker.Config)
		want string
	}{
		{"negative sweep", func(c *broker.Config) { c.SweepInterval = -time.Second }, "sweep interval (--sweep-interval) -1s"},
		{"negative session timeout", func(c *broker.Config) { c.SessionTimeout = -time.Second }, "session timeout (--session-timeout) -1s"},
		{"negative visibility", func(c *broker.Config) { c.DefaultVisibility = -time.Second }, "default visibility timeout (--visibility-timeout) -1s"},
		{"visibility too long", func(c *broker.Config) { c.DefaultVisibility = 13 * time.Hour }, "default visibility timeout 13h0m0s out of range [100ms, 12h0m0s] (--visibility-timeout)"},
		{"negative stats interval", func(c *broker.Config) { c.StatsInterval = -time.Second }, "stats interval -1s"},
		{"negative payload", func(c *broker.Config) { c.MaxPayload = -1 }, "max payload -1"},
		{"payload too large", func(c *broker.Config) { c.MaxPayload = zkqueue.HardMaxPayload + 1 }, strconv.Itoa(zkqueue.HardMaxPayload + 1)},
		{"batch below payload", func(c *broker.Config) { c.MaxPayload = 4096; c.MaxBatchBytes = 1024 }, "--max-batch-bytes 1024 < --max-payload 4096"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t)}
			tt.mod(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			b, err := broker.New(ctx, cfg)
			if err == nil {
				b.Close()
				t.Fatalf("New accepted the config, want an error naming %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error naming %q", err, tt.want)
			}
		})
	}
	// A payload limit above the default batch limit raises the batch
	// limit when that is left unset.
	b := newBroker(t, zktest.Root(t), func(c *broker.Config) { c.MaxPayload = 1000 << 10 })
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	if _, err := b.client.Publish(context.Background(), &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: make([]byte, 1000<<10)}}}); err != nil {
		t.Fatalf("publish of 1000 KiB with MaxPayload 1000 KiB: %v", err)
	}
}

// The per-message batch overhead the API and docs/operations.md state is the one
// the broker counts for a queue under the default root.
func TestBatchOverheadDocumented(t *testing.T) {
	const name = "q"
	q, err := zkqueue.New(zktest.Conn(t), "/qbroker/queues/"+name+"/items", zkqueue.WithPublisher("broker-1"), zkqueue.WithoutCreate())
	if err != nil {
		t.Fatal(err)
	}
	want := strconv.Itoa(q.MessageOverhead() - len(name))
	for _, doc := range []struct{ file, pattern string }{
		{"../api/queue.proto", `overhead of (\d+) bytes plus the queue name's length`},
		{"../docs/operations.md", `counts its payload plus (\d+) bytes plus its queue name's length`},
		{"../api/queuepb/queue.pb.go", `overhead of (\d+) bytes plus the queue name's length`},
	} {
		text, err := os.ReadFile(doc.file)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(doc.pattern).FindStringSubmatch(strings.Join(strings.Fields(strings.ReplaceAll(string(text), "//", "")), " "))
		if m == nil {
			t.Errorf("%s does not state the per-message overhead (%s)", doc.file, doc.pattern)
		} else if m[1] != want {
			t.Errorf("%s states a per-message overhead of %s bytes, the broker counts %s", doc.file, m[1], want)
		}
	}
}
