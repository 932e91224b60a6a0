package broker_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// publishOptions are the options of a publish whose every pair
// TestPublishOptionPairs covers: ttl is the queue's message_ttl (a message
// has no TTL of its own), headers stand for headers and content_type.
var publishOptions = []string{"delay", "deliver_at", "dedup", "group", "priority", "headers", "ttl"}

// optionPair is one pair of publish options: published together on a
// queue created as queue says (named by the test), either refused with
// code (naming both options) and nothing published, or published and
// its composed behaviour checked by run.
type optionPair struct {
	a, b  string
	queue *pb.CreateQueueRequest
	// refused: the message refused, with code.
	refused *pb.OutMessage
	code    codes.Code
	run     func(t *testing.T, e pairEnv)
}

// pairEnv is a pair's queue on two brokers of one root.
type pairEnv struct {
	a, b  pb.QueueClient
	queue string
}

func (e pairEnv) publish(t *testing.T, c pb.QueueClient, m *pb.OutMessage) *pb.PublishResponse {
	t.Helper()
	return publishMsg(t, c, e.queue, m)
}

// receive receives what is ready now (up to 10), at least once with a
// long lease when ack.
func (e pairEnv) receive(t *testing.T, ack bool) []*pb.Message {
	t.Helper()
	req := &pb.ReceiveRequest{Queue: e.queue, MaxMessages: 10}
	if ack {
		req.Mode, req.VisibilityTimeout = alo, durationpb.New(time.Minute)
	}
	return receive(t, e.a, req)
}

func (e pairEnv) ack(t *testing.T, m *pb.Message) {
	t.Helper()
	if _, err := e.a.Ack(context.Background(), &pb.AckRequest{AckToken: m.GetAckToken()}); err != nil {
		t.Fatalf("Ack %s: %v", m.GetId(), err)
	}
}

// empty checks that the queue holds nothing (ready, delayed, in flight).
func (e pairEnv) empty(t *testing.T) {
	t.Helper()
	if st := stats(t, e.a, e.queue); st.GetReady()+st.GetDelayed()+st.GetInFlight() != 0 {
		t.Fatalf("queue holds %d ready, %d delayed, %d in flight; want nothing", st.GetReady(), st.GetDelayed(), st.GetInFlight())
	}
}

// delayBy sets m's due time d ahead through option opt, delay or
// deliver_at.
func delayBy(m *pb.OutMessage, opt string, d time.Duration) *pb.OutMessage {
	if opt == "delay" {
		m.Delay = durationpb.New(d)
	} else {
		m.DeliverAt = timestamppb.New(time.Now().Add(d))
	}
	return m
}

// payloadsOf returns the payloads of ms, in order.
func payloadsOf(ms []*pb.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, string(m.GetPayload()))
	}
	return out
}

// waitDelivered waits for a delayed message published at published and
// due after d, checks it was not delivered before, and returns it.
func waitDelivered(t *testing.T, e pairEnv, published time.Time, d time.Duration) *pb.Message {
	t.Helper()
	m := receiveWait(t, e.a, e.queue)
	if got := time.Since(published); got < d {
		t.Fatalf("%q delivered %v after publish, before its due time %v", m.GetPayload(), got, d)
	}
	return m
}

// checkDelayed checks that a publish answered with id, published at
// published and due d later, is held back (unless already due).
func checkDelayed(t *testing.T, e pairEnv, id string, published time.Time, d time.Duration) {
	t.Helper()
	if !zkqueue.IsDelayedID(id) {
		t.Fatalf("publish answered %q, want a delayed message's id", id)
	}
	st := stats(t, e.a, e.queue)
	if time.Since(published) < d && st.GetDelayed() != 1 {
		t.Fatalf("before due: %d delayed, want 1", st.GetDelayed())
	}
}

// optionPairs returns the table of TestPublishOptionPairs.
func optionPairs() []optionPair {
	const delay = 1500 * time.Millisecond
	headers := map[string]string{"trace": "t-1", "tenant": "acme"}
	ttlQueue := func(ttl time.Duration, toDead bool) *pb.CreateQueueRequest {
		return &pb.CreateQueueRequest{MessageTtl: durationpb.New(ttl), ExpireToDeadLetter: toDead}
	}
	prioQueue := &pb.CreateQueueRequest{Kind: pb.QueueKind_QUEUE_KIND_PRIORITY}
	pairs := []optionPair{
		{a: "delay", b: "deliver_at", code: codes.InvalidArgument, refused: &pb.OutMessage{Payload: []byte("x"),
			Delay: durationpb.New(time.Second), DeliverAt: timestamppb.New(time.Now().Add(time.Second))}},
	}
	for _, when := range []string{"delay", "deliver_at"} {
		pairs = append(pairs,
			optionPair{a: when, b: "dedup", run: func(t *testing.T, e pairEnv) {
				// Held back, then delivered once; repeats on both
				// brokers, before and after, get the delayed id.
				published := time.Now()
				id := e.publish(t, e.a, delayBy(&pb.OutMessage{Payload: []byte("x"), DedupId: "k"}, when, delay)).GetIds()[0]
				checkDelayed(t, e, id, published, delay)
				repeat := func(c pb.QueueClient) {
					t.Helper()
					r := e.publish(t, c, delayBy(&pb.OutMessage{Payload: []byte("again"), DedupId: "k"}, when, delay))
					if r.GetIds()[0] != id || !r.GetDuplicates()[0] {
						t.Fatalf("repeat: %v %v, want %s [true]", r.GetIds(), r.GetDuplicates(), id)
					}
				}
				repeat(e.b)
				if m := waitDelivered(t, e, published, delay); string(m.GetPayload()) != "x" {
					t.Fatalf("delivered %q, want x", m.GetPayload())
				}
				repeat(e.a)
				repeat(e.b)
				e.empty(t)
			}},
			optionPair{a: when, b: "group", code: codes.InvalidArgument,
				refused: delayBy(&pb.OutMessage{Payload: []byte("x"), Group: "g"}, when, delay),
				run: func(t *testing.T, e pairEnv) {
					// Refused in one message, but a grouped message in
					// a batch with a delayed one keeps its group's order.
					e.publish(t, e.a, &pb.OutMessage{Payload: []byte("g1"), Group: "g"})
					if _, err := e.a.Publish(context.Background(), &pb.PublishRequest{Queue: e.queue, Messages: []*pb.OutMessage{
						{Payload: []byte("g2"), Group: "g"}, delayBy(&pb.OutMessage{Payload: []byte("later")}, when, time.Minute)}}); err != nil {
						t.Fatal(err)
					}
					ms := e.receive(t, true)
					if got := payloadsOf(ms); !slices.Equal(got, []string{"g1"}) {
						t.Fatalf("received %v while g1 is in flight, want [g1]", got)
					}
					e.ack(t, ms[0])
					if got := payloadsOf(e.receive(t, true)); !slices.Equal(got, []string{"g2"}) {
						t.Fatalf("received %v after g1's ack, want [g2]", got)
					}
				}},
			optionPair{a: when, b: "priority", queue: prioQueue, run: func(t *testing.T, e pairEnv) {
				// Held back, then served at its own priority: ahead of
				// a less urgent message published before it.
				e.publish(t, e.a, &pb.OutMessage{Payload: []byte("lazy"), Priority: 9})
				published := time.Now()
				id := e.publish(t, e.a, delayBy(&pb.OutMessage{Payload: []byte("urgent"), Priority: 2}, when, delay)).GetIds()[0]
				checkDelayed(t, e, id, published, delay)
				waitFor(t, "the delayed message moved", 30*time.Second, func() bool {
					st := stats(t, e.a, e.queue)
					return st.GetDelayed() == 0 && st.GetReady() == 2
				})
				if got := time.Since(published); got < delay {
					t.Fatalf("moved %v after publish, before due", got)
				}
				ms := e.receive(t, false)
				if got := payloadsOf(ms); !slices.Equal(got, []string{"urgent", "lazy"}) || ms[0].GetPriority() != 2 {
					t.Fatalf("received %v (first at priority %d), want [urgent lazy], urgent at 2", got, ms[0].GetPriority())
				}
			}},
			optionPair{a: when, b: "headers", run: func(t *testing.T, e pairEnv) {
				published := time.Now()
				id := e.publish(t, e.a, delayBy(&pb.OutMessage{Payload: []byte("x"), Headers: headers, ContentType: "text/plain"}, when, delay)).GetIds()[0]
				checkDelayed(t, e, id, published, delay)
				m := waitDelivered(t, e, published, delay)
				if !maps.Equal(m.GetHeaders(), headers) || m.GetContentType() != "text/plain" {
					t.Fatalf("delivered headers %v, content type %q; want %v, text/plain", m.GetHeaders(), m.GetContentType(), headers)
				}
			}},
			optionPair{a: when, b: "ttl", queue: ttlQueue(time.Second, false), run: func(t *testing.T, e pairEnv) {
				// A delay longer than the TTL: the message does not
				// expire while delayed, its TTL counts from its due time.
				const ttl, delay = time.Second, 2 * time.Second
				published := time.Now()
				id := e.publish(t, e.a, delayBy(&pb.OutMessage{Payload: []byte("x")}, when, delay)).GetIds()[0]
				checkDelayed(t, e, id, published, delay)
				waitFor(t, "the message to expire", 30*time.Second, func() bool { return stats(t, e.a, e.queue).GetExpired() == 1 })
				if got := time.Since(published); got < delay+ttl {
					t.Fatalf("expired %v after publish, before its due time plus its TTL (%v)", got, delay+ttl)
				}
				e.empty(t)
			}},
		)
	}
	pairs = append(pairs,
		optionPair{a: "dedup", b: "group", run: func(t *testing.T, e pairEnv) {
			// The repeat adds no message and no group entry: the group
			// goes on after the first message's ack.
			first := e.publish(t, e.a, &pb.OutMessage{Payload: []byte("first"), Group: "g", DedupId: "k"}).GetIds()[0]
			if r := e.publish(t, e.b, &pb.OutMessage{Payload: []byte("repeat"), Group: "g", DedupId: "k"}); r.GetIds()[0] != first || !r.GetDuplicates()[0] {
				t.Fatalf("repeat: %v %v, want %s [true]", r.GetIds(), r.GetDuplicates(), first)
			}
			e.publish(t, e.b, &pb.OutMessage{Payload: []byte("second"), Group: "g", DedupId: "k2"})
			ms := e.receive(t, true)
			if got := payloadsOf(ms); !slices.Equal(got, []string{"first"}) || ms[0].GetGroup() != "g" {
				t.Fatalf("received %v, want [first] in group g", got)
			}
			e.ack(t, ms[0])
			ms = e.receive(t, true)
			if got := payloadsOf(ms); !slices.Equal(got, []string{"second"}) {
				t.Fatalf("received %v after the ack, want [second]", got)
			}
			e.ack(t, ms[0])
			e.empty(t)
		}},
		optionPair{a: "dedup", b: "priority", queue: prioQueue, run: func(t *testing.T, e pairEnv) {
			first := e.publish(t, e.a, &pb.OutMessage{Payload: []byte("first"), Priority: 7, DedupId: "k"}).GetIds()[0]
			if r := e.publish(t, e.b, &pb.OutMessage{Payload: []byte("repeat"), Priority: 1, DedupId: "k"}); r.GetIds()[0] != first || !r.GetDuplicates()[0] {
				t.Fatalf("repeat at another priority: %v %v, want %s [true]", r.GetIds(), r.GetDuplicates(), first)
			}
			e.publish(t, e.a, &pb.OutMessage{Payload: []byte("other"), Priority: 3})
			ms := e.receive(t, false)
			if got := payloadsOf(ms); !slices.Equal(got, []string{"other", "first"}) || ms[1].GetPriority() != 7 {
				t.Fatalf("received %v, want [other first], first at priority 7", got)
			}
		}},
		optionPair{a: "dedup", b: "headers", run: func(t *testing.T, e pairEnv) {
			first := e.publish(t, e.a, &pb.OutMessage{Payload: []byte("x"), DedupId: "k", Headers: headers, ContentType: "text/plain"}).GetIds()[0]
			if r := e.publish(t, e.b, &pb.OutMessage{Payload: []byte("x"), DedupId: "k", Headers: map[string]string{"trace": "t-2"}}); r.GetIds()[0] != first || !r.GetDuplicates()[0] {
				t.Fatalf("repeat: %v %v, want %s [true]", r.GetIds(), r.GetDuplicates(), first)
			}
			ms := e.receive(t, false)
			if len(ms) != 1 || !maps.Equal(ms[0].GetHeaders(), headers) || ms[0].GetContentType() != "text/plain" {
				t.Fatalf("received %v, want the first copy with its headers %v", ms, headers)
			}
		}},
		optionPair{a: "dedup", b: "ttl", queue: ttlQueue(time.Second, false), run: func(t *testing.T, e pairEnv) {
			// Expired, the message is still remembered for the window.
			first := e.publish(t, e.a, &pb.OutMessage{Payload: []byte("x"), DedupId: "k"}).GetIds()[0]
			waitFor(t, "the message to expire", 30*time.Second, func() bool { return stats(t, e.a, e.queue).GetExpired() == 1 })
			if r := e.publish(t, e.b, &pb.OutMessage{Payload: []byte("x"), DedupId: "k"}); r.GetIds()[0] != first || !r.GetDuplicates()[0] {
				t.Fatalf("repeat after expiry: %v %v, want %s [true]", r.GetIds(), r.GetDuplicates(), first)
			}
			e.empty(t)
		}},
		optionPair{a: "group", b: "priority", queue: prioQueue, run: func(t *testing.T, e pairEnv) {
			// A more urgent message of a group waits for its group's
			// earlier one; other messages go on by priority.
			e.publish(t, e.a, &pb.OutMessage{Payload: []byte("a"), Group: "g", Priority: 5})
			e.publish(t, e.a, &pb.OutMessage{Payload: []byte("b"), Group: "g", Priority: 1})
			e.publish(t, e.a, &pb.OutMessage{Payload: []byte("c"), Priority: 9})
			ms := e.receive(t, true)
			if got := payloadsOf(ms); !slices.Equal(got, []string{"a", "c"}) {
				t.Fatalf("received %v, want [a c] (b waits for a)", got)
			}
			e.ack(t, ms[0])
			ms = e.receive(t, true)
			if got := payloadsOf(ms); !slices.Equal(got, []string{"b"}) || ms[0].GetPriority() != 1 {
				t.Fatalf("received %v after a's ack, want [b] at priority 1", got)
			}
		}},
		optionPair{a: "group", b: "headers", run: func(t *testing.T, e pairEnv) {
			e.publish(t, e.a, &pb.OutMessage{Payload: []byte("x"), Group: "g", Headers: headers, ContentType: "text/plain"})
			ms := e.receive(t, true)
			if len(ms) != 1 || ms[0].GetGroup() != "g" || !maps.Equal(ms[0].GetHeaders(), headers) || ms[0].GetContentType() != "text/plain" {
				t.Fatalf("received %v, want one message of group g with headers %v", ms, headers)
			}
		}},
		// The queue's TTL is its configuration, not the message's:
		// FailedPrecondition, as for the other options a queue's kind or
		// configuration refuses.
		optionPair{a: "group", b: "ttl", queue: ttlQueue(time.Minute, false), code: codes.FailedPrecondition,
			refused: &pb.OutMessage{Payload: []byte("x"), Group: "g"}},
		optionPair{a: "priority", b: "headers", queue: prioQueue, run: func(t *testing.T, e pairEnv) {
			e.publish(t, e.a, &pb.OutMessage{Payload: []byte("lazy"), Priority: 8})
			e.publish(t, e.a, &pb.OutMessage{Payload: []byte("urgent"), Priority: 4, Headers: headers})
			ms := e.receive(t, false)
			if got := payloadsOf(ms); !slices.Equal(got, []string{"urgent", "lazy"}) || !maps.Equal(ms[0].GetHeaders(), headers) {
				t.Fatalf("received %v, want [urgent lazy], urgent with headers %v", got, headers)
			}
		}},
		optionPair{a: "priority", b: "ttl", queue: &pb.CreateQueueRequest{Kind: pb.QueueKind_QUEUE_KIND_PRIORITY, MessageTtl: durationpb.New(time.Second)},
			run: func(t *testing.T, e pairEnv) {
				// Served by priority while alive; the rest expires,
				// whatever its level.
				published := time.Now()
				e.publish(t, e.a, &pb.OutMessage{Payload: []byte("lazy"), Priority: 200})
				e.publish(t, e.a, &pb.OutMessage{Payload: []byte("urgent"), Priority: 0})
				ms := receive(t, e.a, &pb.ReceiveRequest{Queue: e.queue})
				if time.Since(published) >= time.Second {
					t.Skip("the machine is too slow to receive within the TTL")
				}
				if got := payloadsOf(ms); !slices.Equal(got, []string{"urgent"}) {
					t.Fatalf("received %v, want [urgent]", got)
				}
				waitFor(t, "the less urgent message to expire", 30*time.Second, func() bool { return stats(t, e.a, e.queue).GetExpired() == 1 })
				if got := time.Since(published); got < time.Second {
					t.Fatalf("expired %v after publish, within its TTL", got)
				}
				e.empty(t)
			}},
		optionPair{a: "headers", b: "ttl", queue: ttlQueue(time.Second, true), run: func(t *testing.T, e pairEnv) {
			// An expired message keeps its headers in the dead letters.
			e.publish(t, e.a, &pb.OutMessage{Payload: []byte("x"), Headers: headers, ContentType: "text/plain"})
			waitFor(t, "the message to expire", 30*time.Second, func() bool { return stats(t, e.a, e.queue).GetDead() == 1 })
			resp, err := e.a.ListDeadLetters(context.Background(), &pb.ListDeadLettersRequest{Queue: e.queue})
			if err != nil {
				t.Fatal(err)
			}
			if ms := resp.GetMessages(); len(ms) != 1 || !maps.Equal(ms[0].GetHeaders(), headers) || ms[0].GetContentType() != "text/plain" {
				t.Fatalf("dead letters %v, want the message with its headers %v", ms, headers)
			}
		}},
	)
	return pairs
}

// Every pair of publish options either works together, and the test
// checks that the composed behaviour happens, or is refused with a status
// naming both options, publishing nothing.
func TestPublishOptionPairs(t *testing.T) {
	root := zktest.Root(t)
	a, b := newBroker(t, root), newBroker(t, root)
	pairs := optionPairs()
	covered := map[string]bool{}
	for _, p := range pairs {
		covered[p.a+"+"+p.b], covered[p.b+"+"+p.a] = true, true
	}
	for i, x := range publishOptions {
		for _, y := range publishOptions[i+1:] {
			if !covered[x+"+"+y] {
				t.Errorf("no case for %s with %s", x, y)
			}
		}
	}
	for _, p := range pairs {
		t.Run(p.a+"+"+p.b, func(t *testing.T) {
			q := &pb.CreateQueueRequest{}
			if p.queue != nil {
				q = &pb.CreateQueueRequest{Kind: p.queue.GetKind(), MessageTtl: p.queue.GetMessageTtl(), ExpireToDeadLetter: p.queue.GetExpireToDeadLetter()}
			}
			q.Name = strings.ReplaceAll(p.a+"-"+p.b, "_", "-")
			createQueue(t, a.client, q)
			e := pairEnv{a: a.client, b: b.client, queue: q.Name}
			if p.refused != nil {
				// Alone and in a batch after a good message: refused,
				// naming both options, nothing published.
				for _, msgs := range [][]*pb.OutMessage{{p.refused}, {{Payload: []byte("ok")}, p.refused}} {
					_, err := a.client.Publish(context.Background(), &pb.PublishRequest{Queue: q.Name, Messages: msgs})
					msg := status.Convert(err).Message()
					if status.Code(err) != p.code || !mentions(msg, p.a) || !mentions(msg, p.b) {
						t.Fatalf("got %v, want %v naming %s and %s", err, p.code, p.a, p.b)
					}
				}
				e.empty(t)
			}
			if p.run != nil {
				p.run(t, e)
			}
		})
	}
}

// mentions reports whether a refusal names option opt (ttl by its field,
// message_ttl).
func mentions(msg, opt string) bool {
	switch opt {
	case "ttl":
		opt = "message_ttl"
	case "dedup":
		opt = "dedup_id"
	case "delay":
		// Not "delayed": the option's own name.
		return strings.Contains(strings.ReplaceAll(msg, "delayed", ""), "delay")
	}
	return strings.Contains(msg, opt)
}
