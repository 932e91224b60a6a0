package broker_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) { zktest.Main(m) }

// testBroker is a broker on a real 127.0.0.1 listener with a client.
type testBroker struct {
	b      *broker.Broker
	srv    *grpc.Server
	addr   string
	conn   *grpc.ClientConn
	client pb.QueueClient
	closed bool
}

func startBroker(t *testing.T, zkAddrs []string, root string, mods ...func(*broker.Config)) *testBroker {
	t.Helper()
	return launchBroker(t, zkAddrs, root, false, mods...)
}

// launchBroker starts a broker on a 127.0.0.1 listener, wrapped by the
// broker's connection limits (as qbroker serve runs it) when limited.
func launchBroker(t *testing.T, zkAddrs []string, root string, limited bool, mods ...func(*broker.Config)) *testBroker {
	t.Helper()
	cfg := broker.Config{ZooKeeper: zkAddrs, Root: root, SweepInterval: 100 * time.Millisecond, SessionTimeout: 4 * time.Second}
	for _, m := range mods {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := broker.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tb := &testBroker{b: b, srv: b.GRPCServer(), addr: lis.Addr().String()}
	var served net.Listener = lis
	if limited {
		served = b.LimitListener(lis)
	}
	go func() { _ = tb.srv.Serve(served) }()
	tb.conn, err = grpc.NewClient(tb.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	tb.client = pb.NewQueueClient(tb.conn)
	t.Cleanup(tb.stop)
	return tb
}

// stop shuts the broker down the way `qbroker serve` does.
func (tb *testBroker) stop() {
	if tb.closed {
		return
	}
	tb.closed = true
	tb.b.Shutdown()
	done := make(chan struct{})
	go func() { tb.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		tb.srv.Stop()
		<-done
	}
	tb.b.Close()
	tb.conn.Close()
}

func newBroker(t *testing.T, root string, mods ...func(*broker.Config)) *testBroker {
	return startBroker(t, []string{zktest.Addr(t)}, root, mods...)
}

func createQueue(t *testing.T, c pb.QueueClient, req *pb.CreateQueueRequest) {
	t.Helper()
	if _, err := c.CreateQueue(context.Background(), req); err != nil {
		t.Fatalf("CreateQueue(%s): %v", req.GetName(), err)
	}
}
