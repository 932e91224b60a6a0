package broker_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

func TestMain(m *testing.M) { zktest.Main(m) }

// testBroker is a broker on a real 127.0.0.1 listener with a client.
type testBroker struct {
	s        *brokertest.Server
	b        *broker.Broker
	srv      *grpc.Server
	addr     string
	grpcConn *grpc.ClientConn
	client   pb.QueueClient
}

func startBroker(t *testing.T, zkAddrs []string, root string, mods ...func(*broker.Config)) *testBroker {
	t.Helper()
	return launchBroker(t, zkAddrs, root, brokertest.Options{}, mods...)
}

// launchBroker starts a broker served as o says (on a 127.0.0.1
// listener, wrapped by the broker's connection limits as qbroker serve
// runs it when o.Limited) with a client of it, stopped when the test ends.
func launchBroker(t *testing.T, zkAddrs []string, root string, o brokertest.Options, mods ...func(*broker.Config)) *testBroker {
	t.Helper()
	cfg := broker.Config{ZooKeeper: zkAddrs, Root: root, SweepInterval: 100 * time.Millisecond, SessionTimeout: 4 * time.Second}
	for _, m := range mods {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	tb := &testBroker{s: s, b: s.Broker, srv: s.GRPC, addr: s.Addr}
	t.Cleanup(tb.stop)
	tb.grpcConn, err = grpc.NewClient(tb.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	tb.client = pb.NewQueueClient(tb.grpcConn)
	return tb
}

// stop shuts the broker down the way `qbroker serve` does and closes the
// client. Only the first call does anything.
func (tb *testBroker) stop() {
	tb.s.Stop()
	if tb.grpcConn != nil {
		tb.grpcConn.Close()
	}
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
