package broker_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

// benchBroker starts a broker with default settings on a real listener
// and returns a client of it with a FIFO queue "q".
func benchBroker(b *testing.B) pb.QueueClient {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(b)}, Root: zktest.Root(b)}, brokertest.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	cc, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	c := pb.NewQueueClient(cc)
	if _, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "q", Kind: pb.QueueKind_QUEUE_KIND_FIFO}); err != nil {
		b.Fatal(err)
	}
	return c
}

// zxid returns ZooKeeper's last transaction id, as the zxid of a node
// made for it (which takes one transaction itself).
func zxid(b *testing.B) int64 {
	conn := zktest.Conn(b)
	p, err := conn.Create("/zxid-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		b.Fatal(err)
	}
	_, st, err := conn.Get(p)
	if err != nil {
		b.Fatal(err)
	}
	return st.Czxid
}

// reportTxns reports the ZooKeeper transactions per operation since
// zxid first (less the one of the second zxid's node and a session's
// creation and close).
func reportTxns(b *testing.B, first int64) {
	b.ReportMetric(float64(zxid(b)-first-3)/float64(b.N), "zk-txn/op")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU per operation since start (the
// broker's and the client's: a CPU profile's focus on the server side,
// grpc.(*Server).handleStream and the ZooKeeper client, tells them apart).
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/float64(b.N), "cpu-µs/op")
}

// BenchmarkPublishOne publishes one message per call from 4 callers at
// once (a plain publish: FIFO queue, no options, no quota, no auth).
func BenchmarkPublishOne(b *testing.B) {
	c := benchBroker(b)
	ctx := context.Background()
	req := &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: make([]byte, 100)}}}
	for range 200 { // warm up: the queue's handle, the connection
		if _, err := c.Publish(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.SetParallelism(2) // 4 callers on 2 cores
	txns := zxid(b)
	start := cpuTime(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Publish(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	reportCPU(b, start)
	reportTxns(b, txns)
}

// BenchmarkConsumePrefetch1 is one at-least-once Consume stream with
// prefetch 1 taking a backlog of b.N messages, acking each on the stream
// as it arrives: the claim/ack cycle of a prefetch-1 consumer.
func BenchmarkConsumePrefetch1(b *testing.B) {
	c := benchBroker(b)
	ctx := context.Background()
	for left := b.N + 10; left > 0; left -= 500 {
		req := &pb.PublishRequest{Queue: "q"}
		for range min(left, 500) {
			req.Messages = append(req.Messages, &pb.OutMessage{Payload: make([]byte, 100)})
		}
		if _, err := c.Publish(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	stream, err := c.Consume(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "q",
		Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE, Prefetch: 1}}); err != nil {
		b.Fatal(err)
	}
	next := func() {
		d, err := stream.Recv()
		if err != nil {
			b.Fatal(err)
		}
		if err := stream.Send(&pb.ConsumeRequest{Credit: 1, Settle: []*pb.Settle{{AckToken: d.GetMessage().GetAckToken()}}}); err != nil {
			b.Fatal(err)
		}
	}
	for range 10 {
		next()
	}
	b.ReportAllocs()
	txns := zxid(b)
	start := cpuTime(b)
	b.ResetTimer()
	for range b.N {
		next()
	}
	b.StopTimer()
	reportCPU(b, start)
	reportTxns(b, txns)
	if err := stream.CloseSend(); err != nil {
		b.Fatal(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
}
