package broker_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

// heldStream holds a server stream's RecvMsg that failed (the stream
// ended) until release is closed, or for at most holdFor: a goroutine
// receiving on the stream outlives its handler at least that long.
type heldStream struct {
	grpc.ServerStream
	release <-chan struct{}
}

const holdFor = 2 * time.Second

// settle bounds how long the check waits for goroutines that Shutdown
// waited for to finish returning; a goroutine it did not wait for is held
// for holdFor, longer than that.
const settle = 500 * time.Millisecond

func (s heldStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err != nil {
		t := time.NewTimer(holdFor)
		defer t.Stop()
		select {
		case <-s.release:
		case <-t.C:
		}
	}
	return err
}

// consumeGoroutines returns the stacks of the goroutines running code of
// the broker's Consume streams.
func consumeGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "/broker/consume.go:") ||
			strings.Contains(g, "broker_test.heldStream.RecvMsg") {
			out = append(out, g)
		}
	}
	return out
}

// A Consume stream's goroutines (receiving, settling, sending) all end
// before Shutdown returns, whether the client ended the stream before or
// Shutdown ends it, even one that gRPC lets out of its Recv only after the
// handler returned: here a Recv that failed is held until the check below
// (or for holdFor), so a goroutine that Shutdown does not wait for is
// still there when it returns. A goroutine Shutdown waited for may still
// be returning from its last deferred call when Shutdown returns: the
// check gives those up to settle, a fraction of holdFor.
func TestConsumeStreamGoroutinesEndBeforeShutdownReturns(t *testing.T) {
	t.Run("client cancels", func(t *testing.T) { testStreamGoroutinesOwned(t, true) })
	t.Run("broker shuts down", func(t *testing.T) { testStreamGoroutinesOwned(t, false) })
}

func testStreamGoroutinesOwned(t *testing.T, clientCancels bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	checked := make(chan struct{})
	returned := make(chan error, 1)
	hold := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if !strings.HasSuffix(info.FullMethod, "/Consume") {
			return h(srv, ss)
		}
		err := h(srv, heldStream{ServerStream: ss, release: checked})
		returned <- err
		return err
	}
	tb := launchBroker(t, []string{zktest.Addr(t)}, zktest.Root(t),
		brokertest.Options{ServerOptions: []grpc.ServerOption{grpc.ChainStreamInterceptor(hold)}})
	b := tb.b

	const queue = "owned"
	createQueue(t, tb.client, &pb.CreateQueueRequest{Name: queue})
	publishN(t, tb.client, queue, 6)

	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	stream, err := tb.client.Consume(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue, Mode: alo, Prefetch: 3}}); err != nil {
		t.Fatal(err)
	}
	// Settle what arrives, so the stream's settle workers have work.
	for i := 0; i < 4; i++ {
		d, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&pb.ConsumeRequest{Credit: 1, Settle: []*pb.Settle{{AckToken: d.GetMessage().GetAckToken()}}}); err != nil {
			t.Fatal(err)
		}
	}
	if clientCancels {
		scancel()
		select {
		case <-returned:
		case <-ctx.Done():
			t.Fatal("the Consume handler did not return after the client cancelled the stream")
		}
	}
	b.Shutdown()
	left := consumeGoroutines()
	for deadline := time.Now().Add(settle); len(left) > 0 && time.Now().Before(deadline); left = consumeGoroutines() {
		time.Sleep(10 * time.Millisecond)
	}
	close(checked)
	if len(left) > 0 {
		t.Fatalf("%d Consume goroutines still running after Shutdown returned:\n%s", len(left), strings.Join(left, "\n\n"))
	}
	if !clientCancels {
		if err := <-returned; status.Code(err) != codes.Unavailable {
			t.Fatalf("stream ended by Shutdown: got %v, want Unavailable", err)
		}
	}
}
