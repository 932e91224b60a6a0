package broker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zktest"
)

func waitHealth(t *testing.T, tb *testBroker, want healthpb.HealthCheckResponse_ServingStatus, within time.Duration) {
	t.Helper()
	hc := healthpb.NewHealthClient(tb.grpcConn)
	deadline := time.Now().Add(within)
	for {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: pb.Queue_ServiceDesc.ServiceName})
		if err == nil && r.GetStatus() == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("health did not become %v within %v (last %v, %v)", want, within, r.GetStatus(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// load publishes and consumes (at-least-once) until stop, retrying what
// fails while ZooKeeper is away. It records the payloads whose publish
// succeeded and those delivered (in acked).
type load struct {
	mu        sync.Mutex
	published map[string]bool
	acked     map[string]bool
	errs      map[codes.Code]int
	wait      func()
}

func runLoad(ctx context.Context, c pb.QueueClient, queue string, stop <-chan struct{}) *load {
	l := &load{published: map[string]bool{}, acked: map[string]bool{}, errs: map[codes.Code]int{}}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p := fmt.Sprintf("m%06d", i)
			_, err := c.Publish(ctx, &pb.PublishRequest{Queue: queue, Messages: []*pb.OutMessage{{Payload: []byte(p)}}})
			l.mu.Lock()
			if err == nil {
				l.published[p] = true
			} else {
				l.errs[status.Code(err)]++
			}
			l.mu.Unlock()
			if err != nil {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := c.Receive(ctx, &pb.ReceiveRequest{Queue: queue, Mode: alo, MaxMessages: 20, Wait: durationpb.New(100 * time.Millisecond)})
			if err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			for _, m := range resp.GetMessages() {
				// Delivered is what counts: an ack whose answer is lost
				// with the connection may still have been applied.
				l.mu.Lock()
				l.acked[string(m.GetPayload())] = true
				l.mu.Unlock()
				_, _ = c.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()})
			}
		}
	}()
	l.wait = wg.Wait
	return l
}

// publishedCount returns how many publishes have succeeded so far.
func (l *load) publishedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.published)
}

// runFor waits until n more publishes have succeeded: the load is
// running, however slow the machine.
func (l *load) runFor(t *testing.T, n int) {
	t.Helper()
	want := l.publishedCount() + n
	zktest.WaitFor(t, time.Minute, fmt.Sprintf("%d messages published", want), func() bool { return l.publishedCount() >= want })
}

// check drains what is left and checks that every published message was
// delivered at least once.
func (l *load) check(t *testing.T, c pb.QueueClient, queue string) {
	t.Helper()
	l.wait()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := c.Receive(context.Background(), &pb.ReceiveRequest{Queue: queue, Mode: alo, MaxMessages: 100, Wait: durationpb.New(500 * time.Millisecond)})
		if err != nil {
			continue
		}
		if len(resp.GetMessages()) == 0 {
			st, err := c.Stats(context.Background(), &pb.StatsRequest{Name: queue})
			if err == nil && st.GetReady() == 0 && st.GetInFlight() == 0 {
				break
			}
		}
		for _, m := range resp.GetMessages() {
			l.acked[string(m.GetPayload())] = true
			_, _ = c.Ack(context.Background(), &pb.AckRequest{AckToken: m.GetAckToken()})
		}
	}
	lost := 0
	for p := range l.published {
		if !l.acked[p] {
			lost++
		}
	}
	t.Logf("published %d, acked %d, publish errors %v", len(l.published), len(l.acked), l.errs)
	if lost > 0 {
		t.Fatalf("%d published messages never delivered", lost)
	}
	if len(l.published) < 50 {
		t.Fatalf("only %d messages published: the load did not run", len(l.published))
	}
}

// ZooKeeper restarts mid-load: the broker reports NOT_SERVING while it is
// down, recovers by itself, and loses no published message.
func TestZooKeeperRestartMidLoad(t *testing.T) {
	if !zkserver.Installed() {
		zktest.Server(t) // skips or fails as the package server would
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := zkserver.Start(ctx, zkserver.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	b := startBroker(t, []string{srv.Addr()}, "/fault", func(c *broker.Config) { c.SessionTimeout = 10 * time.Second })
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", VisibilityTimeout: durationpb.New(time.Second)})
	waitHealth(t, b, healthpb.HealthCheckResponse_SERVING, 10*time.Second)

	stop := make(chan struct{})
	l := runLoad(ctx, b.client, "q", stop)
	l.runFor(t, 30)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, b, healthpb.HealthCheckResponse_NOT_SERVING, 10*time.Second)
	time.Sleep(time.Second)
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, b, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	l.runFor(t, 30)
	close(stop)
	l.check(t, b.client, "q")
}

// The broker's session expires (a partition longer than the session
// timeout): it gets a new session, registers again, keeps leadership
// duties going, and no message is lost.
func TestSessionExpiry(t *testing.T) {
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	root := zktest.Root(t)
	b := startBroker(t, []string{proxy.Addr()}, root, func(c *broker.Config) { c.SessionTimeout = 2 * time.Second })
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", VisibilityTimeout: durationpb.New(time.Second)})
	observer := zktest.Conn(t)
	reg := root + "/brokers/" + b.b.ID()
	if ok, _, _ := observer.Exists(reg); !ok {
		t.Fatalf("broker not registered at %s", reg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	l := runLoad(ctx, b.client, "q", stop)
	l.runFor(t, 30)
	proxy.Cut()
	waitHealth(t, b, healthpb.HealthCheckResponse_NOT_SERVING, 10*time.Second)
	// Wait until the server has expired the session: the ephemeral
	// registration disappears.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, _, err := observer.Exists(reg)
		if err == nil && !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("session did not expire")
		}
		time.Sleep(100 * time.Millisecond)
	}
	proxy.Restore()
	waitHealth(t, b, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	deadline = time.Now().Add(20 * time.Second)
	for {
		if ok, _, _ := observer.Exists(reg); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("broker did not register again after its session expired")
		}
		time.Sleep(100 * time.Millisecond)
	}
	l.runFor(t, 30)
	close(stop)
	l.check(t, b.client, "q")
}
