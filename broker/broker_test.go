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
	const producers, consumers, total = 4, 16, 20000

	for _, mode := range []pb.DeliveryMode{pb.DeliveryMode_DELIVERY_MODE_AT_MOST_ONCE, pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE} {
		t.Run(mode.String(), func(t *testing.T) {
			name := "q-" + mode.String()
			createQueue(t, brokers[0].client, &pb.CreateQueueRequest{Name: name, VisibilityTimeout: durationpb.New(time.Minute)})
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			ack := mode == pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE

			var mu sync.Mutex
			delivered := map[string]int{} // payload -> deliveries seen
			acked := map[string]int{}
			counts := map[string]uint32{} // payload -> delivery count at ack
			var done atomic.Int64
			finished := make(chan struct{})
			var once sync.Once

			var wg sync.WaitGroup
			errc := make(chan error, producers+consumers)
			for c := 0; c < consumers; c++ {
				client := brokers[c%2].client
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := consumeAll(ctx, client, &pb.Subscribe{Queue: name, Mode: mode, Prefetch: 8}, finished, func(m *pb.Message) *pb.Settle {
						p := string(m.GetPayload())
						mu.Lock()
						delivered[p]++
						n := delivered[p]
						mu.Unlock()
						var prod, seq int
						fmt.Sscanf(p, "%d:%d", &prod, &seq)
						if !ack {
							if done.Add(1) == total {
								once.Do(func() { close(finished) })
							}
							return nil
						}
						if seq%10 == 0 && n == 1 {
							return &pb.Settle{AckToken: m.GetAckToken(), Nack: true}
						}
						mu.Lock()
						acked[p]++
						counts[p] = m.GetDeliveryCount()
						mu.Unlock()
						if done.Add(1) == total {
							once.Do(func() { close(finished) })
						}
						return &pb.Settle{AckToken: m.GetAckToken()}
					})
					if err != nil {
						errc <- err
					}
				}()
			}
			for p := 0; p < producers; p++ {
				client := brokers[p%2].client
				wg.Add(1)
				go func(p int) {
					defer wg.Done()
					per := total / producers
					for i := 0; i < per; i += 10 {
						req := &pb.PublishRequest{Queue: name}
						for j := i; j < i+10; j++ {
							req.Messages = append(req.Messages, &pb.OutMessage{Payload: []byte(fmt.Sprintf("%d:%d", p, j))})
						}
						if _, err := client.Publish(ctx, req); err != nil {
							errc <- err
							return
						}
					}
				}(p)
			}
			select {
			case <-finished:
			case <-ctx.Done():
				t.Fatalf("timed out with %d of %d messages", done.Load(), total)
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Error(err)
			}
			if len(delivered) != total {
				t.Fatalf("%d distinct messages delivered, want %d", len(delivered), total)
			}
			for p, n := range delivered {
				var prod, seq int
				fmt.Sscanf(p, "%d:%d", &prod, &seq)
				switch {
				case !ack && n != 1:
					t.Fatalf("%s delivered %d times in at-most-once mode", p, n)
				case ack && acked[p] != 1:
					t.Fatalf("%s acked %d times, want 1", p, acked[p])
				case ack && seq%10 == 0 && counts[p] != 2:
					t.Fatalf("nacked %s acked with delivery count %d, want 2", p, counts[p])
				case ack && seq%10 != 0 && counts[p] != 1:
					t.Fatalf("%s acked with delivery count %d, want 1", p, counts[p])
				}
			}
			st, err := brokers[1].client.Stats(context.Background(), &pb.StatsRequest{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			if st.GetReady() != 0 || st.GetInFlight() != 0 {
				t.Errorf("after the run: ready %d, in flight %d; want 0, 0", st.GetReady(), st.GetInFlight())
			}
		})
	}
}
