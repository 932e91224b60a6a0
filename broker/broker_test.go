package broker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

// consumeAll runs a Consume stream, handing every delivery to handle
// (which settles it on the stream, or not), until stop is closed: then it
// half-closes the stream and reads to its end, so the broker has processed
// every settlement sent before.
func consumeAll(ctx context.Context, c pb.QueueClient, sub *pb.Subscribe, stop <-chan struct{}, handle func(*pb.Message) *pb.Settle) error {
	stream, err := c.Consume(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: sub}); err != nil {
		return err
	}
	type recv struct {
		d   *pb.Delivery
		err error
	}
	ch := make(chan recv)
	go func() {
		for {
			d, err := stream.Recv()
			ch <- recv{d, err}
			if err != nil {
				return
			}
		}
	}()
	stopped := false
	for {
		select {
		case <-stop:
			if !stopped {
				stopped = true
				if err := stream.CloseSend(); err != nil {
					return err
				}
			}
			stop = nil
		case r := <-ch:
			if r.err != nil {
				if errors.Is(r.err, io.EOF) {
					return nil
				}
				return r.err
			}
			if stopped {
				continue // released by the broker when the stream ends
			}
			req := &pb.ConsumeRequest{Credit: 1}
			if s := handle(r.d.GetMessage()); s != nil {
				req.Settle = []*pb.Settle{s}
			}
			if err := stream.Send(req); err != nil {
				return err
			}
		}
	}
}

// Two brokers over one ZooKeeper: 4 producers and 16 consumers spread over
// both move 20,000 messages in each delivery mode.
func TestTwoBrokersMoveMessages(t *testing.T) {
	root := zktest.Root(t)
	brokers := []*testBroker{newBroker(t, root), newBroker(t, root)}
	for _, mode := range []pb.DeliveryMode{pb.DeliveryMode_DELIVERY_MODE_AT_MOST_ONCE, pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE} {
		t.Run(mode.String(), func(t *testing.T) { moveMessages(t, brokers, mode) })
	}
}

// moveMessages moves 20,000 messages through a new queue in mode, with
// 4 producers and 16 consumers spread over brokers, and checks what each
// message went through.
func moveMessages(t *testing.T, brokers []*testBroker, mode pb.DeliveryMode) {
	moveMessagesBy(t, brokers, mode, 4)
}

// moveMessagesBy is moveMessages with the given number of producers.
func moveMessagesBy(t *testing.T, brokers []*testBroker, mode pb.DeliveryMode, producers int) {
	const consumers, total = 16, 20000
	name := "q-" + mode.String()
	createQueue(t, brokers[0].client, &pb.CreateQueueRequest{Name: name, VisibilityTimeout: durationpb.New(time.Minute)})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tally := newMoveTally(total, mode == pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE)

	var wg sync.WaitGroup
	errc := make(chan error, producers+consumers)
	for c := 0; c < consumers; c++ {
		client := brokers[c%2].client
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := consumeAll(ctx, client, &pb.Subscribe{Queue: name, Mode: mode, Prefetch: 8}, tally.finished, tally.handle); err != nil {
				errc <- err
			}
		}()
	}
	for p := 0; p < producers; p++ {
		client := brokers[p%2].client
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			if err := publishNumbered(ctx, client, name, p, total/producers); err != nil {
				errc <- err
			}
		}(p)
	}
	select {
	case <-tally.finished:
	case <-ctx.Done():
		t.Fatalf("timed out with %d of %d messages", tally.done.Load(), total)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	tally.check(t)
	st, err := brokers[1].client.Stats(context.Background(), &pb.StatsRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetReady() != 0 || st.GetInFlight() != 0 {
		t.Errorf("after the run: ready %d, in flight %d; want 0, 0", st.GetReady(), st.GetInFlight())
	}
}

// publishNumbered publishes the payloads "p:0" to "p:<per-1>" to queue in
// batches of 10.
func publishNumbered(ctx context.Context, client pb.QueueClient, queue string, p, per int) error {
	for i := 0; i < per; i += 10 {
		req := &pb.PublishRequest{Queue: queue}
		for j := i; j < i+10; j++ {
			req.Messages = append(req.Messages, &pb.OutMessage{Payload: []byte(fmt.Sprintf("%d:%d", p, j))})
		}
		if _, err := client.Publish(ctx, req); err != nil {
			return err
		}
	}
	return nil
}

// moveTally settles the deliveries of moveMessages and counts what each
// message went through. At least once (ack), a message whose sequence
// number is a multiple of 10 is nacked on its first delivery and acked on
// its second; every other delivery is acked. It is safe for concurrent
// use.
type moveTally struct {
	total    int64
	ack      bool
	done     atomic.Int64  // messages handled for good
	finished chan struct{} // closed when done reaches total
	once     sync.Once

	mu        sync.Mutex
	delivered map[string]int    // payload -> deliveries seen
	acked     map[string]int    // payload -> acks
	counts    map[string]uint32 // payload -> delivery count at ack
}

func newMoveTally(total int64, ack bool) *moveTally {
	return &moveTally{total: total, ack: ack, finished: make(chan struct{}),
		delivered: map[string]int{}, acked: map[string]int{}, counts: map[string]uint32{}}
}

// handle counts the delivery of m and returns its settlement.
func (mt *moveTally) handle(m *pb.Message) *pb.Settle {
	p := string(m.GetPayload())
	mt.mu.Lock()
	mt.delivered[p]++
	n := mt.delivered[p]
	mt.mu.Unlock()
	var prod, seq int
	fmt.Sscanf(p, "%d:%d", &prod, &seq)
	if !mt.ack {
		mt.handled()
		return nil
	}
	if seq%10 == 0 && n == 1 {
		return &pb.Settle{AckToken: m.GetAckToken(), Nack: true}
	}
	mt.mu.Lock()
	mt.acked[p]++
	mt.counts[p] = m.GetDeliveryCount()
	mt.mu.Unlock()
	mt.handled()
	return &pb.Settle{AckToken: m.GetAckToken()}
}

// handled counts a message handled for good.
func (mt *moveTally) handled() {
	if mt.done.Add(1) == mt.total {
		mt.once.Do(func() { close(mt.finished) })
	}
}

// check fails the test unless every message was delivered once (at most
// once) or acked once with the expected delivery count (at least once).
func (mt *moveTally) check(t *testing.T) {
	t.Helper()
	mt.mu.Lock()
	defer mt.mu.Unlock()
	if int64(len(mt.delivered)) != mt.total {
		t.Fatalf("%d distinct messages delivered, want %d", len(mt.delivered), mt.total)
	}
	for p, n := range mt.delivered {
		var prod, seq int
		fmt.Sscanf(p, "%d:%d", &prod, &seq)
		switch {
		case !mt.ack && n != 1:
			t.Fatalf("%s delivered %d times in at-most-once mode", p, n)
		case mt.ack && mt.acked[p] != 1:
			t.Fatalf("%s acked %d times, want 1", p, mt.acked[p])
		case mt.ack && seq%10 == 0 && mt.counts[p] != 2:
			t.Fatalf("nacked %s acked with delivery count %d, want 2", p, mt.counts[p])
		case mt.ack && seq%10 != 0 && mt.counts[p] != 1:
			t.Fatalf("%s acked with delivery count %d, want 1", p, mt.counts[p])
		}
	}
}
