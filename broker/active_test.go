package broker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

// held is one delivery as its consumer held it: from its arrival to its
// ack's answer, or else to the end of its stream (the broker released it).
// A delivery whose broker died is not among them: its ack token is kept
// (sacStream.orphans), and the test shows that it can no longer be
// settled once another stream took over.
type held struct {
	stream   string
	id       string
	from, to time.Time
}

// sacStream is one Consume stream of a single-active queue, acking each
// delivery with the Ack call on the stream's broker.
type sacStream struct {
	name   string
	stream pb.Queue_ConsumeClient
	cancel context.CancelFunc
	done   chan struct{}

	sendMu sync.Mutex // Send and CloseSend
	closed bool       // half-closed

	keep atomic.Bool // keep deliveries unacked (in orphans) from now on

	mu      sync.Mutex
	holds   []held
	orphans []string  // ack tokens of deliveries kept unacked, or whose ack failed with their broker
	order   []string  // payloads in order of arrival
	first   time.Time // the first delivery's arrival
	err     error     // how the stream ended
}

func openSAC(t *testing.T, name string, c pb.QueueClient, queue string, prio int32) *sacStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := c.Consume(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := st.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue, Mode: alo, Prefetch: 2, Priority: prio}}); err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &sacStream{name: name, stream: st, cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { cancel(); <-s.done })
	go s.run(c)
	return s
}

func (s *sacStream) run(c pb.QueueClient) {
	defer close(s.done)
	var open []held // received after the client half-closed: never acked
	for {
		d, err := s.stream.Recv()
		now := time.Now()
		if err != nil {
			s.mu.Lock()
			for _, h := range open {
				h.to = now // the stream's end released them
				s.holds = append(s.holds, h)
			}
			s.err = err
			s.mu.Unlock()
			return
		}
		m := d.GetMessage()
		h := held{stream: s.name, id: string(m.GetPayload()), from: now}
		s.mu.Lock()
		if s.first.IsZero() {
			s.first = now
		}
		s.order = append(s.order, h.id)
		if s.keep.Load() {
			s.orphans = append(s.orphans, m.GetAckToken())
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, aerr := c.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()})
		cancel()
		switch {
		case aerr == nil:
			h.to = time.Now()
		case status.Code(aerr) == codes.FailedPrecondition:
			// Released by the stream's end (half-closed meanwhile):
			// held until the stream's end.
			open = append(open, h)
			continue
		default:
			// Its broker is gone: another broker could ack it until
			// the next active stream's broker revoked it.
			s.mu.Lock()
			s.orphans = append(s.orphans, m.GetAckToken())
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		s.holds = append(s.holds, h)
		s.mu.Unlock()
		s.sendMu.Lock()
		if !s.closed {
			_ = s.stream.Send(&pb.ConsumeRequest{Credit: 1})
		}
		s.sendMu.Unlock()
	}
}

func (s *sacStream) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.holds)
}

func (s *sacStream) firstAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// end half-closes the stream and waits for its end.
func (s *sacStream) end(t *testing.T) {
	t.Helper()
	s.sendMu.Lock()
	s.closed = true
	_ = s.stream.CloseSend()
	s.sendMu.Unlock()
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("stream %s did not end", s.name)
	}
	if s.err != nil && !errors.Is(s.err, io.EOF) {
		t.Fatalf("stream %s ended with %v", s.name, s.err)
	}
}

// checkNoOverlap fails when deliveries of two streams were held at once.
func checkNoOverlap(t *testing.T, streams ...*sacStream) {
	t.Helper()
	var all []held
	for _, s := range streams {
		s.mu.Lock()
		all = append(all, s.holds...)
		s.mu.Unlock()
	}
	sort.Slice(all, func(i, j int) bool { return all[i].from.Before(all[j].from) })
	var last held // the delivery that is held latest so far
	for _, h := range all {
		if last.stream != "" && last.stream != h.stream && h.from.Before(last.to) {
			t.Fatalf("%s got %s at %v while %s held %s until %v", h.stream, h.id, h.from.Format("15:04:05.000"),
				last.stream, last.id, last.to.Format("15:04:05.000"))
		}
		if last.stream == "" || h.to.After(last.to) {
			last = h
		}
	}
}

// A single-active queue consumed through two brokers, one a qbroker
// process: one stream at a time receives; the next takes over when the
// active one ends (on either broker) and when the active stream's broker
// is killed (SIGKILL), within the session timeout plus a second although
// the killed stream's leases have a minute left: they are revoked; no two
// streams ever hold deliveries at once, and each gets the queue in order.
func TestSingleActiveConsumerAcrossBrokers(t *testing.T) {
	root := zktest.Root(t)
	survivor := newBroker(t, root)
	const queue, sessionTimeout = "sac", 4 * time.Second
	createQueue(t, survivor.client, &pb.CreateQueueRequest{Name: queue, SingleActiveConsumer: true,
		VisibilityTimeout: durationpb.New(time.Minute)})
	info, err := survivor.client.GetQueue(context.Background(), &pb.GetQueueRequest{Name: queue})
	if err != nil || !info.GetSingleActiveConsumer() {
		t.Fatalf("GetQueue: %v, single_active_consumer %v, want true", err, info.GetSingleActiveConsumer())
	}
	publishN(t, survivor.client, queue, 1000)
	cmd, conn := startQbrokerProcess(t, root, "--session-timeout", sessionTimeout.String())
	victim := pb.NewQueueClient(conn)
	waitConsumers := func(n int) {
		zktest.WaitFor(t, 30*time.Second, fmt.Sprintf("%d consumers", n), func() bool {
			st, err := survivor.client.Stats(context.Background(), &pb.StatsRequest{Name: queue})
			return err == nil && int(st.GetConsumers()) == n
		})
	}
	receives := func(s *sacStream, n int) {
		zktest.WaitFor(t, 30*time.Second, fmt.Sprintf("%s receiving %d", s.name, n), func() bool { return s.count() >= n })
	}

	// The victim's stream is first: it is active, the survivor's waits.
	v1 := openSAC(t, "v1", victim, queue, 0)
	receives(v1, 10)
	s1 := openSAC(t, "s1", survivor.client, queue, 0)
	waitConsumers(2)
	receives(v1, v1.count()+10)
	if n := s1.count(); n != 0 {
		t.Fatalf("standby s1 received %d messages while v1 was active", n)
	}
	// v1 ends: the survivor's stream takes over.
	v1.end(t)
	receives(s1, 10)

	// A standby on the victim; s1 ends: the victim's stream takes over.
	v2 := openSAC(t, "v2", victim, queue, 0)
	waitConsumers(2)
	s1.end(t)
	receives(v2, 10)
	s2 := openSAC(t, "s2", survivor.client, queue, 0)
	waitConsumers(2)
	receives(v2, v2.count()+10)

	// The victim dies with v2 active, holding a delivery unacked: s2
	// takes over once the victim's session expired; v2's leases, with
	// most of their minute left, are revoked first.
	v2.keep.Store(true)
	zktest.WaitFor(t, 30*time.Second, "v2 holding a delivery", func() bool {
		v2.mu.Lock()
		defer v2.mu.Unlock()
		return len(v2.orphans) > 0
	})
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	receives(s2, 10)
	took := s2.firstAt().Sub(killed)
	t.Logf("takeover after SIGKILL: %v (session timeout %v)", took.Round(time.Millisecond), sessionTimeout)
	if took > sessionTimeout+time.Second {
		t.Errorf("s2's first delivery %v after the kill, want within %v", took, sessionTimeout+time.Second)
	}
	<-v2.done
	v2.mu.Lock()
	orphans := slices.Clone(v2.orphans)
	v2.mu.Unlock()
	for _, tok := range orphans {
		_, err := survivor.client.Ack(context.Background(), &pb.AckRequest{AckToken: tok})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("ack of v2's delivery through the survivor after the takeover: %v, want FailedPrecondition (revoked)", err)
		}
	}
	s2.end(t)
	checkNoOverlap(t, v1, s1, v2, s2)
	// Each stream got the queue in order: what the one before held was
	// back at its place before it started.
	for _, s := range []*sacStream{v1, s1, v2, s2} {
		for i := 1; i < len(s.order); i++ {
			if s.order[i] <= s.order[i-1] {
				t.Errorf("%s got %s after %s", s.name, s.order[i], s.order[i-1])
			}
		}
	}
	t.Logf("deliveries: v1 %d, s1 %d, v2 %d, s2 %d", v1.count(), s1.count(), v2.count(), s2.count())
}

// Bad input: the option on a SYNC queue, a priority out of range; and
// Receive on a single-active queue.
func TestSingleActiveConsumerRefusals(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	ctx := context.Background()
	_, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "s", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 2, SingleActiveConsumer: true})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "single_active_consumer") {
		t.Errorf("single active SYNC queue: %v, want InvalidArgument naming single_active_consumer", err)
	}
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", SingleActiveConsumer: true})
	_, err = b.client.Receive(ctx, &pb.ReceiveRequest{Queue: "q"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Receive on a single-active queue: %v, want FailedPrecondition", err)
	}
	for _, p := range []int32{1001, -1001} {
		st, err := b.client.Consume(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "q", Priority: p}}); err != nil {
			t.Fatal(err)
		}
		_, err = st.Recv()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "priority") {
			t.Errorf("priority %d: %v, want InvalidArgument naming priority", p, err)
		}
	}
}

// Stream priority on one broker: while the high-priority stream has
// credit, the low one gets nothing; once it has none, the low one gets
// the rest.
func TestConsumerPriority(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	const queue = "prio"
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: queue})
	got := func(name string, prio int32) (*sync.Mutex, *[]string) {
		ctx, cancel := context.WithCancel(context.Background())
		st, err := b.client.Consume(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue, Mode: alo, Prefetch: 10, Priority: prio}}); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var ids []string
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				d, err := st.Recv()
				if err != nil {
					return
				}
				mu.Lock()
				ids = append(ids, string(d.GetMessage().GetPayload()))
				mu.Unlock()
			}
		}()
		t.Cleanup(func() { cancel(); <-done })
		return &mu, &ids
	}
	count := func(mu *sync.Mutex, ids *[]string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(*ids)
	}
	waitConsumers := func(n int) {
		zktest.WaitFor(t, 30*time.Second, fmt.Sprintf("%d consumers", n), func() bool {
			st, err := b.client.Stats(context.Background(), &pb.StatsRequest{Name: queue})
			return err == nil && int(st.GetConsumers()) == n
		})
	}
	hmu, high := got("high", 5)
	waitConsumers(1)
	lmu, low := got("low", 0)
	waitConsumers(2)

	publishN(t, b.client, queue, 5)
	zktest.WaitFor(t, 30*time.Second, "5 to the high stream", func() bool { return count(hmu, high) == 5 })
	if n := count(lmu, low); n != 0 {
		t.Fatalf("the low stream got %d messages while the high one had credit", n)
	}
	// 15 more: the high stream's credit (10) takes 5; the rest go low.
	for i := 0; i < 15; i++ {
		if _, err := b.client.Publish(context.Background(), &pb.PublishRequest{Queue: queue,
			Messages: []*pb.OutMessage{{Payload: []byte(fmt.Sprintf("n%05d", i))}}}); err != nil {
			t.Fatal(err)
		}
	}
	zktest.WaitFor(t, 30*time.Second, "10 high and 10 low", func() bool { return count(hmu, high) == 10 && count(lmu, low) == 10 })
	hmu.Lock()
	defer hmu.Unlock()
	lmu.Lock()
	defer lmu.Unlock()
	want := []string{"m00000", "m00001", "m00002", "m00003", "m00004", "n00000", "n00001", "n00002", "n00003", "n00004"}
	if fmt.Sprint(*high) != fmt.Sprint(want) {
		t.Errorf("high stream got %v, want %v", *high, want)
	}
	t.Logf("low stream got %v", *low)
}

// Deleting a single-active queue ends its active stream and its
// standbys with NotFound.
func TestSingleActiveQueueDeletedUnderStandbys(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	const queue = "gone"
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: queue, SingleActiveConsumer: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ends := make(chan error, 3)
	for i := range 3 {
		st, err := b.client.Consume(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The last one has the highest priority: it stands first in line.
		if err := st.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue, Mode: alo, Priority: int32(i)}}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				if _, err := st.Recv(); err != nil {
					ends <- err
					return
				}
			}
		}()
	}
	zktest.WaitFor(t, 30*time.Second, "3 consumers", func() bool {
		st, err := b.client.Stats(context.Background(), &pb.StatsRequest{Name: queue})
		return err == nil && st.GetConsumers() == 3
	})
	if _, err := b.client.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: queue}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case err := <-ends:
			if status.Code(err) != codes.NotFound {
				t.Errorf("stream ended with %v, want NotFound", err)
			}
		case <-ctx.Done():
			t.Fatal("streams of the deleted queue did not end")
		}
	}
}

// On a single-active queue, priority orders the line only: a standby of
// higher priority does not hold up the active stream, and is the next
// one active, ahead of an earlier standby of lower priority.
func TestSingleActivePriorityOrdersTheLine(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	const queue = "line"
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: queue, SingleActiveConsumer: true})
	waitConsumers := func(n int) {
		zktest.WaitFor(t, 30*time.Second, fmt.Sprintf("%d consumers", n), func() bool {
			st, err := b.client.Stats(context.Background(), &pb.StatsRequest{Name: queue})
			return err == nil && int(st.GetConsumers()) == n
		})
	}
	receives := func(s *sacStream, n int) {
		zktest.WaitFor(t, 30*time.Second, fmt.Sprintf("%s receiving %d", s.name, n), func() bool { return s.count() >= n })
	}
	first := openSAC(t, "first", b.client, queue, 0)
	waitConsumers(1)
	low := openSAC(t, "low", b.client, queue, 1)
	high := openSAC(t, "high", b.client, queue, 9)
	waitConsumers(3)
	publishN(t, b.client, queue, 10)
	receives(first, 10)
	first.end(t)
	publishN(t, b.client, queue, 10)
	receives(high, 10)
	if n := low.count(); n != 0 {
		t.Fatalf("low got %d messages, want none: high stood before it", n)
	}
	checkNoOverlap(t, first, low, high)
}
