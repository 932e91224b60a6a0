package broker_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

// payloadOf is message i of a test: size bytes, recognisable by i.
func payloadOf(i, size int) []byte {
	p := bytes.Repeat([]byte{'.'}, size)
	copy(p, fmt.Sprintf("m%04d", i))
	return p
}

func indexOf(p []byte) (i int) {
	_, _ = fmt.Sscanf(string(p[:5]), "m%04d", &i)
	return i
}

// publishBig publishes n messages of size bytes, one per call.
func publishBig(t *testing.T, c pb.QueueClient, queue string, n, size int) {
	t.Helper()
	for i := range n {
		req := &pb.PublishRequest{Queue: queue, Messages: []*pb.OutMessage{{Payload: payloadOf(i, size)}}}
		if _, err := c.Publish(context.Background(), req); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
}

// A long queue name makes every message's overhead the largest it can be.
var longQueue = "q" + string(bytes.Repeat([]byte{'x'}, broker.MaxNameLen-1))

// boundedReceive is a case of TestReceiveBoundedInBytes: n messages
// received at least once (ack) or at most once.
type boundedReceive struct {
	name  string
	n     int
	ack   bool
	plain bool // a plain grpc.NewClient with default options, else clients/go
}

// receiveBounded makes the call-th Receive call of up to tc.n messages
// from queue, with c if tc.plain, else with cl (which acks what it
// received at least once). It returns the payloads received and the ack
// tokens left to ack.
func receiveBounded(t *testing.T, c pb.QueueClient, cl *qbroker.Client, tc boundedReceive, queue string, call int) (payloads [][]byte, tokens []string) {
	t.Helper()
	if tc.plain {
		req := &pb.ReceiveRequest{Queue: queue, MaxMessages: uint32(tc.n)}
		if tc.ack {
			req.Mode = alo
		}
		resp, err := c.Receive(context.Background(), req)
		if err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		if s := proto.Size(resp); s > broker.MaxResponseBytes {
			t.Errorf("call %d: response of %d bytes > MaxResponseBytes %d", call, s, broker.MaxResponseBytes)
		}
		for _, m := range resp.GetMessages() {
			payloads, tokens = append(payloads, m.GetPayload()), append(tokens, m.GetAckToken())
		}
		return payloads, tokens
	}
	o := qbroker.ReceiveOptions{Max: tc.n}
	if tc.ack {
		o.Mode = qbroker.AtLeastOnce
	}
	ms, err := cl.Receive(context.Background(), queue, o)
	if err != nil {
		t.Fatalf("call %d: %v", call, err)
	}
	for _, m := range ms {
		if tc.ack {
			if err := m.Ack(context.Background()); err != nil {
				t.Fatalf("ack: %v", err)
			}
		}
		payloads = append(payloads, m.Payload)
	}
	return payloads, nil
}

// Receive of 20 messages of 512 KiB (10 MiB) from clients with gRPC's
// default 4 MiB receive limit: every call succeeds with as many messages
// as fit, the others stay ready, and after a few calls every message has
// been received exactly once. At most once, a message that did not fit
// was not deleted; at least once, none was leased.
func TestReceiveBoundedInBytes(t *testing.T) {
	tb := newBroker(t, zktest.Root(t))
	cl, err := qbroker.Dial(context.Background(), tb.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const size = 512 << 10
	// The package's ZooKeeper (256 MiB of heap) keeps its last 500
	// transactions in memory: 10 MiB of messages where the point is made,
	// 4.5 MiB (still more than a response holds) elsewhere.
	for _, tc := range []boundedReceive{
		{"at-most-once/grpc", 20, false, true},
		{"at-least-once/grpc", 20, true, true},
		{"at-most-once/clients-go", 9, false, false},
		{"at-least-once/clients-go", 9, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.n
			queue := fmt.Sprintf("%s-%d", longQueue[:190], len(tc.name))
			createQueue(t, tb.client, &pb.CreateQueueRequest{Name: queue})
			publishBig(t, tb.client, queue, n, size)
			got := map[int]bool{}
			for calls := 1; len(got) < n; calls++ {
				if calls > n {
					t.Fatalf("%d calls and still %d of %d messages", calls, len(got), n)
				}
				payloads, tokens := receiveBounded(t, tb.client, cl, tc, queue, calls)
				if len(payloads) == 0 || len(payloads) == n {
					t.Fatalf("call %d: %d messages, want some but not all", calls, len(payloads))
				}
				for _, p := range payloads {
					i := indexOf(p)
					if got[i] || !bytes.Equal(p, payloadOf(i, size)) {
						t.Fatalf("call %d: message %d received twice or garbled", calls, i)
					}
					got[i] = true
				}
				for _, tok := range tokens {
					if tok == "" {
						continue
					}
					if _, err := tb.client.Ack(context.Background(), &pb.AckRequest{AckToken: tok}); err != nil {
						t.Fatalf("ack: %v", err)
					}
				}
				st := stats(t, tb.client, queue)
				if int(st.GetReady()) != n-len(got) || st.GetInFlight() != 0 {
					t.Fatalf("after call %d: ready %d, in flight %d; want %d and 0", calls, st.GetReady(), st.GetInFlight(), n-len(got))
				}
			}
		})
	}
}

// Dead letters of more than 4 MiB are listed in pages that each fit a
// default client's receive limit, and together hold every dead letter
// once, in order: from a plain gRPC client and from clients/go.
func TestDeadLettersPaged(t *testing.T) {
	tb := newBroker(t, zktest.Root(t))
	const queue, n, size = "dlq", 9, 512 << 10
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: queue, MaxDeliveries: 1, DeadLetter: true})
	publishBig(t, tb.client, queue, n, size)
	for dead := 0; dead < n; {
		ms := receive(t, tb.client, &pb.ReceiveRequest{Queue: queue, MaxMessages: 1, Mode: alo})
		for _, m := range ms {
			if _, err := tb.client.Nack(context.Background(), &pb.NackRequest{AckToken: m.GetAckToken()}); err != nil {
				t.Fatal(err)
			}
		}
		dead += len(ms)
	}
	if st := stats(t, tb.client, queue); st.GetDead() != n {
		t.Fatalf("%d dead letters, want %d", st.GetDead(), n)
	}

	var got [][]byte
	token := ""
	for pages := 1; ; pages++ {
		if pages > n {
			t.Fatalf("more than %d pages", n)
		}
		resp, err := tb.client.ListDeadLetters(context.Background(), &pb.ListDeadLettersRequest{Queue: queue, Limit: 1000, PageToken: token})
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if s := proto.Size(resp); s > broker.MaxResponseBytes {
			t.Errorf("page %d: %d bytes > MaxResponseBytes", pages, s)
		}
		for _, m := range resp.GetMessages() {
			got = append(got, m.GetPayload())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	cl, err := qbroker.Dial(context.Background(), tb.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ms, err := cl.DeadLetters(context.Background(), queue, 0)
	if err != nil {
		t.Fatal(err)
	}
	for name, list := range map[string]int{"grpc": len(got), "clients/go": len(ms)} {
		if list != n {
			t.Errorf("%s: listed %d dead letters, want %d", name, list, n)
		}
	}
	for i := range min(len(got), len(ms)) {
		if !bytes.Equal(got[i], payloadOf(i, size)) || !bytes.Equal(ms[i].Payload, payloadOf(i, size)) {
			t.Errorf("dead letter %d out of order or garbled", i)
		}
	}
	if _, err := tb.client.ListDeadLetters(context.Background(), &pb.ListDeadLettersRequest{Queue: queue, PageToken: "../x"}); err == nil {
		t.Error("a malformed page token was accepted")
	}
}

// ListQueues pages: every queue once, in order, whatever the page size.
func TestListQueuesPaged(t *testing.T) {
	tb := newBroker(t, zktest.Root(t))
	const n = 25
	for i := range n {
		createQueue(t, tb.client, &pb.CreateQueueRequest{Name: fmt.Sprintf("p.%03d", i)})
	}
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: "other"})
	for _, size := range []uint32{1, 7, 25, 0} {
		var names []string
		token := ""
		for pages := 1; ; pages++ {
			if pages > n+1 {
				t.Fatalf("page size %d: more than %d pages", size, n+1)
			}
			resp, err := tb.client.ListQueues(context.Background(), &pb.ListQueuesRequest{Prefix: "p.", PageSize: size, PageToken: token})
			if err != nil {
				t.Fatal(err)
			}
			if size > 0 && len(resp.GetQueues()) > int(size) {
				t.Fatalf("page size %d: page of %d", size, len(resp.GetQueues()))
			}
			for _, q := range resp.GetQueues() {
				names = append(names, q.GetName())
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		if len(names) != n {
			t.Fatalf("page size %d: %d queues, want %d: %v", size, len(names), n, names)
		}
		for i, name := range names {
			if want := fmt.Sprintf("p.%03d", i); name != want {
				t.Fatalf("page size %d: queue %d is %s, want %s", size, i, name, want)
			}
		}
	}
	if _, err := tb.client.ListQueues(context.Background(), &pb.ListQueuesRequest{PageSize: 1001}); err == nil {
		t.Error("page size 1001 was accepted")
	}
}

// sendRecord is one Delivery the broker handed to a stream's SendMsg.
type sendRecord struct {
	id       string
	deadline time.Time
	returned time.Time
	err      error
}

// sendRecorder is a stream interceptor that records, per stream, when each
// Delivery's SendMsg returned (from then on the message is in the
// transport) and whether a SendMsg is under way.
type sendRecorder struct {
	mu      sync.Mutex
	streams []*streamRecord // in the order they opened
}

type streamRecord struct {
	mu      sync.Mutex
	sending int
	sent    []sendRecord
}

// stream returns the record of the i-th stream opened, or nil.
func (r *sendRecorder) stream(i int) *streamRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < len(r.streams) {
		return r.streams[i]
	}
	return nil
}

// all returns every stream's records.
func (r *sendRecorder) all() []sendRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []sendRecord
	for _, sr := range r.streams {
		sr.mu.Lock()
		out = append(out, sr.sent...)
		sr.mu.Unlock()
	}
	return out
}

// settled reports whether no send is under way on the stream and it sent
// (successfully) n deliveries.
func (sr *streamRecord) settled(n int) bool {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	ok := 0
	for _, s := range sr.sent {
		if s.err == nil {
			ok++
		}
	}
	return sr.sending == 0 && ok == n
}

type recordingStream struct {
	grpc.ServerStream
	r *streamRecord
}

func (s recordingStream) SendMsg(m any) error {
	d, ok := m.(*pb.Delivery)
	if !ok || d.GetMessage().GetLeaseDeadline() == nil {
		return s.ServerStream.SendMsg(m)
	}
	s.r.mu.Lock()
	s.r.sending++
	s.r.mu.Unlock()
	err := s.ServerStream.SendMsg(m)
	s.r.mu.Lock()
	s.r.sending--
	s.r.sent = append(s.r.sent, sendRecord{id: d.GetMessage().GetId(), deadline: d.GetMessage().GetLeaseDeadline().AsTime(), returned: time.Now(), err: err})
	s.r.mu.Unlock()
	return err
}

func (r *sendRecorder) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	sr := &streamRecord{}
	r.mu.Lock()
	r.streams = append(r.streams, sr)
	r.mu.Unlock()
	return h(srv, recordingStream{ss, sr})
}

// startRecordedBroker is newBroker with a sendRecorder and a metrics
// registry.
func startRecordedBroker(t *testing.T, root string, mods ...func(*broker.Config)) (*testBroker, *sendRecorder, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec := &sendRecorder{}
	o := brokertest.Options{ServerOptions: []grpc.ServerOption{grpc.ChainStreamInterceptor(rec.intercept)}}
	tb := launchBroker(t, []string{zktest.Addr(t)}, root, o, append(mods, func(c *broker.Config) { c.Registerer = reg })...)
	return tb, rec, reg
}

// The reproduction of a paused reader: a queue with a 1s visibility
// timeout, 60 KiB messages, a Consume stream with prefetch 10 whose reader
// stops reading for 4s while flow control holds the broker's sends, and
// another consumer acking what the sweep redelivers. The broker never
// hands a delivery to the transport after its lease ran out (it ends the
// stalled stream instead; the stalled delivery counts as expired unsent);
// every message is acked exactly once. Deliveries the paused reader finds
// expired when it reads again all went into the transport in time (flow
// control buffers them): the broker cannot take those back, so a consumer
// must check lease_deadline (clients/go does).
func TestPausedReaderGetsNoLateSends(t *testing.T) { pausedReaderGetsNoLateSends(t) }

// The same with both streams taking messages claimed ahead: the paused
// stream's deliveries it could not send go back through the buffer.
func TestPausedReaderGetsNoLateSendsClaimAhead(t *testing.T) {
	pausedReaderGetsNoLateSends(t, claimAhead)
}

func pausedReaderGetsNoLateSends(t *testing.T, mods ...func(*broker.Config)) {
	tb, rec, reg := startRecordedBroker(t, zktest.Root(t), mods...)
	const queue, n, size = "paused", 20, 60 << 10
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: queue, VisibilityTimeout: durationpb.New(time.Second)})
	publishBig(t, tb.client, queue, n, size)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tally := &ackTally{c: tb.client, acked: map[string]int{}}
	ackedAll := func() bool { return tally.count() == n }

	// The paused reader, on a raw stream so that nothing filters what
	// the broker sent.
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	paused, err := tb.client.Consume(pctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := paused.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue, Mode: alo, Prefetch: 10}}); err != nil {
		t.Fatal(err)
	}
	first, err := paused.Recv()
	if err != nil {
		t.Fatal(err)
	}
	tally.ack(ctx, first.GetMessage())

	// The other consumer, from the start of the pause.
	otherDone := make(chan error, 1)
	go func() { otherDone <- ackUntil(ctx, pctx, tally, queue, ackedAll) }()

	time.Sleep(4 * time.Second) // the pause under test (not waiting for a condition)
	var late []receipt
	var got atomic.Int64 // deliveries the paused reader read
	got.Store(1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		late = readAfterPause(ctx, paused, tally, &got)
	}()
	// Done once every message is acked and the paused reader has read
	// all that the broker sent it, with no send left under way.
	pausedRec := rec.stream(0)
	for !ackedAll() || !(pausedRec.settled(int(got.Load())) || isClosed(readDone)) {
		if ctx.Err() != nil {
			st := stats(t, tb.client, queue)
			select {
			case err := <-otherDone:
				t.Errorf("the other consumer ended: %v", err)
			default:
			}
			tally.mu.Lock()
			t.Fatalf("only %d of %d messages acked; ready %d, in flight %d; ack errors: %v", len(tally.acked), n, st.GetReady(), st.GetInFlight(), tally.errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	pcancel()
	<-readDone
	if err := <-otherDone; err != nil && pctx.Err() == nil {
		t.Fatalf("other consumer: %v", err)
	}

	tally.checkOnce(t)
	sends := rec.all()
	checkSentInTime(t, sends, late)
	unsent := counterSum(t, reg, "qbroker_deliveries_expired_unsent_total")
	t.Logf("paused reader: %d deliveries, %d read after their lease ran out (in transit before the pause); broker: %d sends, %v given back unsent",
		got.Load(), len(late), len(sends), unsent)
	if unsent < 1 {
		t.Errorf("qbroker_deliveries_expired_unsent_total = %v, want at least the stalled delivery", unsent)
	}
	if st := stats(t, tb.client, queue); st.GetReady() != 0 || st.GetInFlight() != 0 {
		t.Errorf("ready %d, in flight %d; want 0 and 0", st.GetReady(), st.GetInFlight())
	}
}

// ackTally acks deliveries and counts the acks of each message. It is
// safe for concurrent use.
type ackTally struct {
	c     pb.QueueClient
	mu    sync.Mutex
	acked map[string]int
	errs  []error // other than an expired lease's
}

// ack acks m; an expired lease's FailedPrecondition is not an error.
func (a *ackTally) ack(ctx context.Context, m *pb.Message) {
	_, err := a.c.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()})
	a.mu.Lock()
	defer a.mu.Unlock()
	switch status.Code(err) {
	case codes.OK:
		a.acked[m.GetId()]++
	case codes.FailedPrecondition:
	default:
		a.errs = append(a.errs, err)
	}
}

// count returns how many messages were acked.
func (a *ackTally) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.acked)
}

// checkOnce fails the test for every message acked more than once.
func (a *ackTally) checkOnce(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, k := range a.acked {
		if k != 1 {
			t.Errorf("message %s acked %d times", id, k)
		}
	}
}

// ackUntil consumes queue at least once on a stream of sctx with
// prefetch 1, acking (with ctx) every delivery, until done.
func ackUntil(ctx, sctx context.Context, tally *ackTally, queue string, done func() bool) error {
	s, err := tally.c.Consume(sctx)
	if err != nil {
		return err
	}
	if err := s.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue, Mode: alo, Prefetch: 1}}); err != nil {
		return err
	}
	for !done() {
		d, err := s.Recv()
		if err != nil {
			return err
		}
		tally.ack(ctx, d.GetMessage())
		if err := s.Send(&pb.ConsumeRequest{Credit: 1}); err != nil {
			return err
		}
	}
	return s.CloseSend()
}

// receipt is a delivery and when its reader got it.
type receipt struct {
	m  *pb.Message
	at time.Time
}

// readAfterPause reads s until it ends (the broker ended the stalled
// stream, or the test is over), counting deliveries in got and acking
// those whose lease is live. It returns those read after their lease ran
// out.
func readAfterPause(ctx context.Context, s pb.Queue_ConsumeClient, tally *ackTally, got *atomic.Int64) []receipt {
	var late []receipt
	for {
		d, err := s.Recv()
		if err != nil {
			return late
		}
		now := time.Now()
		got.Add(1)
		if now.After(d.GetMessage().GetLeaseDeadline().AsTime()) {
			late = append(late, receipt{d.GetMessage(), now})
			continue
		}
		tally.ack(ctx, d.GetMessage())
	}
}

// checkSentInTime fails the test for a delivery that went into the
// transport after its lease ran out, and for a late receipt that the
// broker did not send in time.
func checkSentInTime(t *testing.T, sends []sendRecord, late []receipt) {
	t.Helper()
	sentOK := map[string]time.Time{}
	for _, s := range sends {
		if s.err != nil {
			continue
		}
		if !s.returned.Before(s.deadline) {
			t.Errorf("delivery of %s went into the transport %v after its lease ran out", s.id, s.returned.Sub(s.deadline))
		}
		sentOK[s.id+s.deadline.String()] = s.returned
	}
	for _, r := range late {
		if _, ok := sentOK[r.m.GetId()+r.m.GetLeaseDeadline().AsTime().String()]; !ok {
			t.Errorf("the paused reader got %s %v after its lease ran out, and the broker did not send it in time",
				r.m.GetId(), r.at.Sub(r.m.GetLeaseDeadline().AsTime()))
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// counterSum returns the sum of the series of a counter from reg (0
// when it has none).
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return max(0, metric(t, reg, name, nil))
}
