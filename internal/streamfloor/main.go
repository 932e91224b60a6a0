// Command streamfloor measures the least CPU a Go gRPC server and client
// spend per message on a Consume stream, at prefetch 1 (per message a
// Delivery one way and an ack with its credit the other) and at prefetch
// 100 (Deliveries of what the credit allows, up to 100 messages, and acks
// a quarter of the prefetch at a time, as qbroker's Go client sends them),
// with nothing but the stream's work: the server answers credit with
// the same in-memory message (the size of a qbroker at-least-once
// delivery of 100 bytes) and drops the acks, and each stream of the client
// reads and acks on one goroutine. 16 streams share one connection, as the
// load tester's consumers do. The server runs as a process of its own
// (grpc-go's defaults, no interceptors); the client's CPU is this
// process's. Each setting runs 3 s warm, then 10 s measured.
//
// Unpaced, the streams run as fast as the two processes allow, where
// each write carries many stream messages. -rate1 and -rate100 pace the
// streams of a prefetch to a total rate (a stream takes a token per
// message before it acks it, tokens released every millisecond), to
// measure the floor at the rate a real drain runs, where a stream
// message has fewer others to share a write or a wake-up with.
//
//	go run ./internal/streamfloor -rounds 2
//	go run ./internal/streamfloor -rounds 3 -rate1 13000 -rate100 16500
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/ports"
	"github.com/qbroker/qbroker/internal/proccpu"
)

const (
	streams = 16
	warm    = 3 * time.Second
	window  = 10 * time.Second
)

func main() {
	serve := flag.String("serve", "", "internal: serve on this address")
	rounds := flag.Int("rounds", 2, "rounds over the prefetches")
	rate1 := flag.Int("rate1", 0, "messages per second of all streams together at prefetch 1; 0: unpaced")
	rate100 := flag.Int("rate100", 0, "messages per second of all streams together at prefetch 100; 0: unpaced")
	flag.Parse()
	if *serve != "" {
		log.Fatal(serveFloor(*serve))
	}
	if err := measure(*rounds, map[int]int{1: *rate1, 100: *rate100}); err != nil {
		log.Fatal(err)
	}
}

// floorServer serves Consume from memory.
type floorServer struct {
	pb.UnimplementedQueueServer
	msg *pb.Message
}

// Consume sends what the stream's credit allows, in Deliveries of up to
// its max_batch messages, then reads the next request for more credit.
func (s *floorServer) Consume(stream pb.Queue_ConsumeServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	sub := first.GetSubscribe()
	credit := int(sub.GetPrefetch()) + int(first.GetCredit())
	batch := max(int(sub.GetMaxBatch()), 1)
	more := make([]*pb.Message, batch-1)
	for i := range more {
		more[i] = s.msg
	}
	for {
		for credit > 0 {
			n := min(credit, batch)
			if err := stream.Send(&pb.Delivery{Message: s.msg, More: more[:n-1]}); err != nil {
				return err
			}
			credit -= n
		}
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		credit += int(req.GetCredit())
	}
}

func serveFloor(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	now := time.Now()
	s := &floorServer{msg: &pb.Message{
		Queue:         "loadtest-20261128-000000-0000",
		Id:            "qn-1-p7f3a9c2e-0000012345",
		Payload:       make([]byte, 100),
		PublishedAt:   timestamppb.New(now),
		DeliveryCount: 1,
		AckToken:      "loadtest-20261128-000000-0000/qn-1-p7f3a9c2e-0000012345/l-0000004711-a3f9c1",
		LeaseDeadline: timestamppb.New(now.Add(30 * time.Second)),
	}}
	g := grpc.NewServer()
	pb.RegisterQueueServer(g, s)
	return g.Serve(ln)
}

func measure(rounds int, rates map[int]int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	addr, err := ports.FreeAddr()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-serve", addr)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	c := pb.NewQueueClient(cc)
	for r := 1; r <= rounds; r++ {
		var per [2]float64
		for i, prefetch := range []int{1, 100} {
			if _, _, _, err := consume(ctx, c, cmd.Process.Pid, prefetch, rates[prefetch], warm); err != nil {
				return err
			}
			n, server, client, err := consume(ctx, c, cmd.Process.Pid, prefetch, rates[prefetch], window)
			if err != nil {
				return err
			}
			s := float64(server.Nanoseconds()) / 1e3 / float64(n)
			cl := float64(client.Nanoseconds()) / 1e3 / float64(n)
			per[i] = s + cl
			fmt.Printf("round %d  prefetch %-3d  %7.0f msg/s  server %5.2f µs/msg  client %5.2f µs/msg  together %5.2f µs/msg\n",
				r, prefetch, float64(n)/window.Seconds(), s, cl, s+cl)
		}
		fmt.Printf("round %d  prefetch 1 costs %.2f µs/msg more than prefetch 100 (server and client together)\n", r, per[0]-per[1])
	}
	return nil
}

// consume runs the streams at prefetch for d, paced to rate messages per
// second (0: unpaced), and returns the messages they received and the CPU
// the server and this process used meanwhile.
func consume(ctx context.Context, c pb.QueueClient, pid, prefetch, rate int, d time.Duration) (int64, time.Duration, time.Duration, error) {
	sctx, cancel := context.WithCancel(ctx)
	var tokens chan struct{}
	var pacing sync.WaitGroup
	defer func() {
		cancel()
		pacing.Wait()
	}()
	if rate > 0 {
		tokens = make(chan struct{}, max(rate/100, prefetch))
		pacing.Go(func() { pace(sctx, rate, tokens) })
	}
	var ss []pb.Queue_ConsumeClient
	for range streams {
		s, err := c.Consume(sctx, grpc.WaitForReady(true))
		if err != nil {
			return 0, 0, 0, err
		}
		ss = append(ss, s)
	}
	server0, client0, err := cpu(pid)
	if err != nil {
		return 0, 0, 0, err
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, streams)
	end := time.Now().Add(d)
	for i, s := range ss {
		wg.Go(func() { errs[i] = stream(sctx, s, prefetch, end, tokens, &n) })
	}
	wg.Wait()
	server1, client1, err := cpu(pid)
	if err != nil {
		return 0, 0, 0, err
	}
	return n.Load(), server1 - server0, client1 - client0, errors.Join(errs...)
}

// cpu returns the CPU time used so far by the server pid and by this
// process.
func cpu(pid int) (server, client time.Duration, err error) {
	if server, err = proccpu.Process(pid); err != nil {
		return 0, 0, err
	}
	client, err = proccpu.Process(os.Getpid())
	return server, client, err
}

// pace releases rate tokens per second into tokens, a share every
// millisecond, until ctx ends; tokens no stream takes are dropped once
// the channel is full, so that a stream late for its turn does not make
// up for it in a burst.
func pace(ctx context.Context, rate int, tokens chan<- struct{}) {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	start, released := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			due := int(now.Sub(start).Seconds() * float64(rate))
			for ; released < due; released++ {
				select {
				case tokens <- struct{}{}:
				default:
				}
			}
		}
	}
}

// stream subscribes, then reads deliveries and acks them, a quarter of
// the prefetch (at least 1) per request with the credit they give back,
// until end. With tokens, it takes one per message before acking it.
func stream(ctx context.Context, s pb.Queue_ConsumeClient, prefetch int, end time.Time, tokens <-chan struct{}, n *atomic.Int64) error {
	err := s.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "q", Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE,
		Prefetch: uint32(prefetch), MaxBatch: uint32(prefetch)}})
	if err != nil {
		return err
	}
	quarter := max(prefetch/4, 1)
	var settles []*pb.Settle
	for time.Now().Before(end) {
		d, err := s.Recv()
		if err != nil {
			return err
		}
		for _, m := range append([]*pb.Message{d.GetMessage()}, d.GetMore()...) {
			if tokens != nil {
				select {
				case <-tokens:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			n.Add(1)
			settles = append(settles, &pb.Settle{AckToken: m.GetAckToken()})
			if len(settles) >= quarter {
				if err := s.Send(&pb.ConsumeRequest{Settle: settles, Credit: uint32(len(settles))}); err != nil {
					return err
				}
				settles = nil
			}
		}
	}
	return s.CloseSend()
}
