package broker_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// aheadStream opens an at-least-once Consume stream with prefetch 1 on
// queue, takes (and acks on the stream, with new credit) acked messages,
// then takes one more without settling it or giving credit: the broker's
// buffer then holds messages claimed ahead for it.
func aheadStream(t *testing.T, ctx context.Context, c pb.QueueClient, queue string, acked int) pb.Queue_ConsumeClient {
	t.Helper()
	s, err := c.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue, Mode: alo, Prefetch: 1}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i <= acked; i++ {
		d, err := s.Recv()
		if err != nil {
			t.Fatalf("Consume: %v", err)
		}
		if i == acked {
			break
		}
		if err := s.Send(&pb.ConsumeRequest{Credit: 1, Settle: []*pb.Settle{{AckToken: d.GetMessage().GetAckToken()}}}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// claimAhead turns on claiming ahead of credit.
func claimAhead(c *broker.Config) { c.ClaimAhead = true }

// waitClaimedAhead waits until the queue's left messages (once the acks
// are applied) include more leases than the one the stream holds: the
// rest are claimed ahead in a buffer.
func waitClaimedAhead(t *testing.T, c pb.QueueClient, queue string, left int) {
	t.Helper()
	zktest.WaitFor(t, 20*time.Second, "messages claimed ahead", func() bool {
		st := stats(t, c, queue)
		return st.GetReady()+st.GetInFlight() == uint64(left) && st.GetInFlight() >= 2
	})
}

// endStream half-closes s and reads it to its end: the broker's handler
// has returned then.
func endStream(t *testing.T, s pb.Queue_ConsumeClient) {
	t.Helper()
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := s.Recv(); err != nil {
			if err != io.EOF {
				t.Fatalf("stream end: %v", err)
			}
			return
		}
	}
}

// Several prefetch-1 streams of one queue on one broker share its
// messages claimed ahead: each message is delivered exactly once, and
// each stream receives its messages in queue order.
func TestConsumeClaimAheadExactlyOnceInOrder(t *testing.T) {
	b := newBroker(t, zktest.Root(t), claimAhead)
	const queue, n, streams = "ahead-order", 400, 4
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: queue, VisibilityTimeout: durationpb.New(30 * time.Second)})
	publishN(t, b.client, queue, n)

	drainInOrder(t, b.client, queue, n, streams)
	if st := stats(t, b.client, queue); st.GetReady()+st.GetInFlight() != 0 {
		t.Errorf("queue not empty: %v", st)
	}
}

// A message claimed ahead whose lease runs short is given back before it
// expires (with its delivery count as before the claim) and delivered
// elsewhere, rather than sent with a lease about to end.
func TestConsumeClaimAheadGivesBackShortLease(t *testing.T) {
	root := zktest.Root(t)
	a, other := newBroker(t, root, claimAhead), newBroker(t, root)
	const queue = "ahead-short"
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: queue, VisibilityTimeout: durationpb.New(time.Second)})
	publishN(t, a.client, queue, 2)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := aheadStream(t, ctx, a.client, queue, 0) // holds m00000; m00001 is claimed ahead
	waitClaimedAhead(t, a.client, queue, 2)
	for {
		ms := receive(t, other.client, &pb.ReceiveRequest{Queue: queue, Mode: alo, Wait: durationpb.New(time.Second)})
		if ctx.Err() != nil {
			t.Fatal("m00001 never came back")
		}
		if len(ms) == 0 || string(ms[0].GetPayload()) != "m00001" {
			continue // m00000 comes back when the stream's lease expires
		}
		if c := ms[0].GetDeliveryCount(); c != 1 {
			t.Fatalf("m00001 came back with delivery count %d, want 1 (given back, not expired)", c)
		}
		break
	}
	endStream(t, s)
}

// When the last stream of a queue ends, and when the broker shuts down,
// the messages claimed ahead for its streams are given back at once:
// ready for any consumer, not held until their leases expire.
func TestConsumeClaimAheadGivenBackOnStreamEndAndShutdown(t *testing.T) {
	root := zktest.Root(t)
	a, other := newBroker(t, root, claimAhead), newBroker(t, root)
	const queue, n, acked = "ahead-end", 40, 3
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: queue, VisibilityTimeout: durationpb.New(time.Minute)})
	publishN(t, a.client, queue, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	s := aheadStream(t, ctx, a.client, queue, acked)
	waitClaimedAhead(t, a.client, queue, n-acked)
	endStream(t, s)
	if st := stats(t, other.client, queue); st.GetInFlight() != 0 || st.GetReady() != n-acked {
		t.Fatalf("after the stream ended: %d in flight, %d ready; want 0, %d", st.GetInFlight(), st.GetReady(), n-acked)
	}

	aheadStream(t, ctx, a.client, queue, acked)
	waitClaimedAhead(t, a.client, queue, n-2*acked)
	a.b.Shutdown()
	if st := stats(t, other.client, queue); st.GetInFlight() != 0 || st.GetReady() != n-2*acked {
		t.Fatalf("after Shutdown: %d in flight, %d ready; want 0, %d", st.GetInFlight(), st.GetReady(), n-2*acked)
	}
	got := 0
	for got < n-2*acked {
		ms := receive(t, other.client, &pb.ReceiveRequest{Queue: queue, Mode: alo, MaxMessages: 50})
		if len(ms) == 0 {
			t.Fatalf("%d of %d messages ready after Shutdown", got, n-2*acked)
		}
		for _, m := range ms {
			if _, err := other.client.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()}); err != nil {
				t.Fatal(err)
			}
		}
		got += len(ms)
	}
}

// A broker killed with messages claimed ahead loses none of them: they
// come back when their leases expire.
func TestConsumeClaimAheadKilledBrokerLosesNothing(t *testing.T) {
	root := zktest.Root(t)
	survivor := newBroker(t, root)
	const queue, n, acked = "ahead-kill", 60, 3
	createQueue(t, survivor.client, &pb.CreateQueueRequest{Name: queue, VisibilityTimeout: durationpb.New(2 * time.Second)})
	publishN(t, survivor.client, queue, n)
	cmd, conn := startQbrokerProcess(t, root, "--claim-ahead")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	aheadStream(t, ctx, pb.NewQueueClient(conn), queue, acked)
	waitClaimedAhead(t, survivor.client, queue, n-acked)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	got := map[string]bool{}
	for len(got) < n-acked {
		if ctx.Err() != nil {
			t.Fatalf("the survivor delivered %d of %d messages", len(got), n-acked)
		}
		for _, m := range receive(t, survivor.client, &pb.ReceiveRequest{Queue: queue, Mode: alo, MaxMessages: 50, Wait: durationpb.New(time.Second)}) {
			p := string(m.GetPayload())
			if got[p] {
				t.Fatalf("%s delivered twice by the survivor", p)
			}
			got[p] = true
			if _, err := survivor.client.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()}); err != nil {
				t.Fatalf("ack %s: %v", p, err)
			}
		}
	}
	for i := range acked {
		if p := fmt.Sprintf("m%05d", i); got[p] {
			t.Errorf("%s was acked before the kill and delivered again", p)
		}
	}
}

// Messages claimed ahead and given back unsent (held too long while their
// stream paused, or left when the queue's last stream on the broker
// ended) reach the broker's streams in queue order: no younger message of
// the queue is first delivered before them. One prefetch-1 stream at a
// time consumes, pauses until the broker starts giving back what it
// claimed ahead and at once consumes again (twice), then is cancelled;
// the next stream opens as soon as the broker started giving back the
// cancelled one's messages.
func TestConsumeClaimAheadGivenBackKeepsOrder(t *testing.T) {
	root := zktest.Root(t)
	b := newBroker(t, root, claimAhead)
	conn := zktest.Conn(t)
	const queue, rounds, per = "ahead-given-back", 8, 60
	const n = rounds*3*per + 200
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: queue, VisibilityTimeout: durationpb.New(30 * time.Second)})
	publishN(t, b.client, queue, n)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	var first []string // the payloads of first deliveries, as received
	acked := 0
	// take receives k deliveries on s, acking all but the last on the
	// stream with new credit, and returns the last one's token.
	take := func(s pb.Queue_ConsumeClient, k int) string {
		t.Helper()
		for i := 1; ; i++ {
			d, err := s.Recv()
			if err != nil {
				t.Fatalf("Consume: %v", err)
			}
			m := d.GetMessage()
			if m.GetDeliveryCount() == 1 {
				first = append(first, string(m.GetPayload()))
			}
			if i == k {
				return m.GetAckToken()
			}
			if err := s.Send(&pb.ConsumeRequest{Credit: 1, Settle: []*pb.Settle{{AckToken: m.GetAckToken()}}}); err != nil {
				t.Fatal(err)
			}
			acked++
		}
	}
	// givingBack returns as soon as the queue has at least fewer leases
	// than once the stream's acks were applied: the broker started giving
	// back what it claimed ahead (a watch on the leases, to catch the
	// start of a give-back).
	leases := root + "/queues/" + queue + "/leases"
	givingBack := func(what string, fewer int) {
		t.Helper()
		zktest.WaitFor(t, 20*time.Second, "acks applied", func() bool {
			st := stats(t, b.client, queue)
			return st.GetReady()+st.GetInFlight() == uint64(n-acked)
		})
		ls, _, err := conn.Children(leases)
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) <= fewer {
			return // nothing claimed ahead
		}
		for {
			now, _, ev, err := conn.ChildrenW(leases)
			if err != nil {
				t.Fatal(err)
			}
			if len(now) <= len(ls)-fewer {
				return
			}
			select {
			case <-ev:
			case <-ctx.Done():
				t.Fatalf("%s: %d leases, none given back", what, len(ls))
			}
		}
	}
	for range rounds {
		sctx, scancel := context.WithCancel(ctx)
		s, err := b.client.Consume(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue, Mode: alo, Prefetch: 1}}); err != nil {
			t.Fatal(err)
		}
		held := take(s, per)
		for range 2 {
			givingBack("stream paused", 1) // the buffer's hold ran out
			if err := s.Send(&pb.ConsumeRequest{Credit: 1, Settle: []*pb.Settle{{AckToken: held}}}); err != nil {
				t.Fatal(err)
			}
			acked++
			held = take(s, per)
		}
		scancel()
		givingBack("stream cancelled", 2) // its held message, one claimed ahead
	}
	for i := 1; i < len(first); i++ {
		if first[i] <= first[i-1] {
			t.Errorf("%s first delivered after %s", first[i], first[i-1])
		}
	}
}

// Messages of mixed sizes make the buffer's claims run out of room while
// later claims are under way (the buffer claims several at once): those
// give back what they took, so every stream still receives its messages
// in queue order, each exactly once, and the drain does not wait for a
// lease to expire (the visibility timeout is longer than the test).
func TestConsumeClaimAheadMixedSizesKeepOrder(t *testing.T) {
	b := newBroker(t, zktest.Root(t), claimAhead)
	const queue, n, streams = "ahead-mixed", 600, 4
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: queue, VisibilityTimeout: durationpb.New(10 * time.Minute)})
	// Every seventh message is 60-100 KiB, the others small: a claim's
	// share of the buffer's bytes holds a few large ones only.
	for i := 0; i < n; i += 20 {
		req := &pb.PublishRequest{Queue: queue}
		for j := i; j < i+20; j++ {
			p := []byte(fmt.Sprintf("m%05d", j))
			if j%7 == 0 {
				p = append(p, make([]byte, 60<<10+(j%5)*10<<10)...)
			}
			req.Messages = append(req.Messages, &pb.OutMessage{Payload: p})
		}
		if _, err := b.client.Publish(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	drainInOrder(t, b.client, queue, n, streams)
}

// drainInOrder takes n deliveries of queue on streams at-least-once
// streams of prefetch 1, acking each, and checks that they are n distinct
// messages, each delivered exactly once, and that every stream receives
// its messages in queue order. A message is named by the first 6 bytes of
// its payload (publishN's "m%05d").
func drainInOrder(t *testing.T, c pb.QueueClient, queue string, n, streams int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var mu sync.Mutex
	seen := map[string]int{}
	total := 0
	done := make(chan struct{})
	orders := make([][]string, streams)
	errs := make(chan error, streams)
	for i := range streams {
		go func() {
			errs <- consumeAll(ctx, c, &pb.Subscribe{Queue: queue, Mode: alo, Prefetch: 1}, done, func(m *pb.Message) *pb.Settle {
				k := string(m.GetPayload()[:6])
				orders[i] = append(orders[i], k)
				mu.Lock()
				seen[k]++
				total++
				if total == n {
					close(done)
				}
				mu.Unlock()
				return &pb.Settle{AckToken: m.GetAckToken()}
			})
		}()
	}
	for range streams {
		if err := <-errs; err != nil {
			t.Fatalf("consume: %v", err)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct messages delivered, want %d", len(seen), n)
	}
	checkOnceInOrder(t, seen, orders, "stream")
}

// checkOnceInOrder checks that each message was delivered once (seen
// counts them) and that each consumer (a stream or a caller: who) received
// its messages in queue order.
func checkOnceInOrder(t *testing.T, seen map[string]int, orders [][]string, who string) {
	t.Helper()
	for k, times := range seen {
		if times != 1 {
			t.Errorf("%s delivered %d times", k, times)
		}
	}
	for i, o := range orders {
		for j := 1; j < len(o); j++ {
			if o[j] <= o[j-1] {
				t.Errorf("%s %d received %s after %s", who, i, o[j], o[j-1])
			}
		}
	}
}

// Receive calls that may wait take from the same buffer: concurrent
// callers get each message once, each caller in queue order. Once they
// stop calling, what the buffer holds is given back within about a second
// (not when its leases expire, minutes later); at Shutdown, at once.
func TestReceiveClaimAhead(t *testing.T) {
	root := zktest.Root(t)
	a, other := newBroker(t, root, claimAhead), newBroker(t, root)
	const queue, n, callers, first = "ahead-receive", 300, 3, 150
	createQueue(t, a.client, &pb.CreateQueueRequest{Name: queue, VisibilityTimeout: durationpb.New(2 * time.Minute)})
	publishN(t, a.client, queue, n)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	var mu sync.Mutex
	seen := map[string]int{}
	total := 0
	orders := make([][]string, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for {
				mu.Lock()
				enough := total >= first
				mu.Unlock()
				if enough || ctx.Err() != nil {
					return
				}
				resp, err := a.client.Receive(ctx, &pb.ReceiveRequest{Queue: queue, Mode: alo, Wait: durationpb.New(time.Second)})
				if err != nil {
					t.Errorf("Receive: %v", err)
					return
				}
				for _, m := range resp.GetMessages() {
					k := string(m.GetPayload())
					orders[i] = append(orders[i], k)
					mu.Lock()
					seen[k]++
					total++
					mu.Unlock()
					if _, err := a.client.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()}); err != nil {
						t.Errorf("Ack: %v", err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	checkOnceInOrder(t, seen, orders, "caller")
	left := uint64(n - total)
	zktest.WaitFor(t, 20*time.Second, "the idle buffer given back", func() bool {
		st := stats(t, other.client, queue)
		return st.GetInFlight() == 0 && st.GetReady() == left
	})

	ms := receive(t, a.client, &pb.ReceiveRequest{Queue: queue, Mode: alo, Wait: durationpb.New(time.Second)})
	if len(ms) != 1 {
		t.Fatalf("Receive returned %d messages, want 1", len(ms))
	}
	waitClaimedAhead(t, a.client, queue, int(left))
	a.b.Shutdown()
	if st := stats(t, other.client, queue); st.GetInFlight() != 1 || st.GetReady() != left-1 {
		t.Fatalf("after Shutdown: %d in flight, %d ready; want 1 (the one received), %d", st.GetInFlight(), st.GetReady(), left-1)
	}
}
