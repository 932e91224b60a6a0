// Command pubfloor measures the least CPU a Go gRPC server spends on a
// one-message publish, and what a qbroker broker spends, with the same
// callers: 4 goroutines of one client process, each calling Publish with
// one 100-byte message and waiting for the answer before the next call.
// Each server runs as a process of its own, its CPU read from /proc over
// a 10 s window after 3 s of warm calls:
//
//   - sleep: a Publish handler that waits 1.5 ms (a commit's latency)
//     and answers, with no work at all;
//   - create: a handler that makes one ZooKeeper create of the message
//     (PERSISTENT_SEQUENTIAL, go-zookeeper) and answers with its name,
//     under the Go runtime's default GOMAXPROCS and with GOMAXPROCS=1;
//   - qbroker: `qbroker serve` with its defaults, a FIFO queue.
//
// It starts a ZooKeeper of its own on a free loopback port (warmed with
// creates until its JIT is past its first compiles), removes what each
// window published before the next (so ZooKeeper's tree stays small),
// and stops everything at its end or on an interrupt.
//
//	go build -o bin/qbroker ./cmd/qbroker && go run ./internal/pubfloor -qbroker bin/qbroker
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/ports"
	"github.com/qbroker/qbroker/internal/proccpu"
	"github.com/qbroker/qbroker/internal/zkserver"
)

const (
	callers = 4
	warm    = 3 * time.Second
	window  = 10 * time.Second
)

func main() {
	serve := flag.String("serve", "", "internal: serve on this address (sleep or create)")
	zkAddr := flag.String("zk", "", "internal: ZooKeeper of the create server")
	qbins := flag.String("qbroker", "", "the qbroker binaries to measure beside the floors, comma-separated (none: floors only)")
	rounds := flag.Int("rounds", 2, "rounds over the servers")
	flag.Parse()
	if *serve != "" {
		log.Fatal(serveFloor(*serve, *zkAddr))
	}
	var bins []string
	if *qbins != "" {
		bins = strings.Split(*qbins, ",")
	}
	if err := measure(bins, *rounds); err != nil {
		log.Fatal(err)
	}
}

// floorServer answers Publish: after sleep, or with one ZooKeeper create.
type floorServer struct {
	pb.UnimplementedQueueServer
	conn *zk.Conn // nil: sleep
}

func (s *floorServer) Publish(ctx context.Context, req *pb.PublishRequest) (*pb.PublishResponse, error) {
	if s.conn == nil {
		time.Sleep(1500 * time.Microsecond)
		return &pb.PublishResponse{Ids: []string{"qn-0000000001"}}, nil
	}
	p, err := s.conn.Create("/pubfloor/qn-", req.Messages[0].Payload, zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		return nil, err
	}
	return &pb.PublishResponse{Ids: []string{p}}, nil
}

func serveFloor(addr, zkAddr string) error {
	s := &floorServer{}
	if zkAddr != "" {
		c, _, err := zk.Connect([]string{zkAddr}, 10*time.Second, zk.WithLogInfo(false))
		if err != nil {
			return err
		}
		s.conn = c
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	g := grpc.NewServer()
	pb.RegisterQueueServer(g, s)
	return g.Serve(ln)
}

// server is one measured server process.
type server struct {
	name   string
	addr   string
	cmd    *exec.Cmd
	broker bool // a qbroker broker, not a floor server
}

func measure(qbins []string, rounds int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "pubfloor-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	zks, err := zkserver.Start(ctx, zkserver.Config{Dir: filepath.Join(dir, "zk")})
	if err != nil {
		return err
	}
	defer zks.Close()
	conn, _, err := zk.Connect([]string{zks.Addr()}, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Create("/pubfloor", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	specs := []struct {
		name string
		env  []string
		args []string
	}{
		{"sleep 1.5 ms, no work", nil, []string{"-zk", ""}},
		{"one ZooKeeper create", nil, []string{"-zk", zks.Addr()}},
		{"one ZooKeeper create, GOMAXPROCS=1", []string{"GOMAXPROCS=1"}, []string{"-zk", zks.Addr()}},
	}
	var servers []*server
	defer func() {
		for _, s := range servers {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			_ = s.cmd.Wait()
		}
	}()
	for _, sp := range specs {
		addr, err := ports.FreeAddr()
		if err != nil {
			return err
		}
		cmd := exec.Command(self, append([]string{"-serve", addr}, sp.args...)...)
		cmd.Env, cmd.Stderr = append(os.Environ(), sp.env...), os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return err
		}
		servers = append(servers, &server{name: sp.name, addr: addr, cmd: cmd})
	}
	for i, bin := range qbins {
		s, err := startQBroker(ctx, bin, zks.Addr(), dir, i)
		if err != nil {
			return err
		}
		servers = append(servers, s)
	}
	// ZooKeeper's JIT compiles for the first seconds under load.
	if _, _, err := calls(ctx, servers[1], 20*time.Second); err != nil {
		return err
	}
	for r := 1; r <= rounds; r++ {
		for _, s := range servers {
			if err := purge(ctx, conn, s); err != nil {
				return err
			}
			if _, _, err := calls(ctx, s, warm); err != nil {
				return err
			}
			n, cpu, err := calls(ctx, s, window)
			if err != nil {
				return err
			}
			fmt.Printf("round %d  %-36s %6.0f calls/s  server CPU %5.1f µs per call\n",
				r, s.name, float64(n)/window.Seconds(), float64(cpu.Microseconds())/float64(n))
		}
	}
	return nil
}

// startQBroker starts `qbroker serve` on ZooKeeper zkAddr, under a root
// of its own (the i-th), and creates queue q on it.
func startQBroker(ctx context.Context, bin, zkAddr, dir string, i int) (*server, error) {
	addr, err := ports.FreeAddr()
	if err != nil {
		return nil, err
	}
	metrics, err := ports.FreeAddr()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("qbroker-%d.log", i)))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", "--insecure", "--zk", zkAddr, "--root", fmt.Sprintf("/pubfloor-qbroker-%d", i),
		"--listen", addr, "--metrics-listen", metrics)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{name: fmt.Sprintf("qbroker serve %s (defaults)", filepath.Base(bin)), addr: addr, cmd: cmd, broker: true}
	c, err := dial(addr)
	if err != nil {
		return s, err
	}
	defer c.Close()
	for {
		_, err := pb.NewQueueClient(c).CreateQueue(ctx, &pb.CreateQueueRequest{Name: "q"})
		if err == nil {
			return s, nil
		}
		select {
		case <-ctx.Done():
			return s, fmt.Errorf("qbroker at %s: %w (log %s)", addr, err, logf.Name())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// calls runs the callers against s for d and returns the calls made and
// the CPU s used meanwhile.
func calls(ctx context.Context, s *server, d time.Duration) (int64, time.Duration, error) {
	cc, err := dial(s.addr)
	if err != nil {
		return 0, 0, err
	}
	defer cc.Close()
	c := pb.NewQueueClient(cc)
	req := &pb.PublishRequest{Queue: "q", Messages: []*pb.OutMessage{{Payload: make([]byte, 100)}}}
	// A server still starting: its first call waits for it.
	if _, err := c.Publish(ctx, req, grpc.WaitForReady(true)); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", s.name, err)
	}
	cpu0, err := proccpu.Process(s.cmd.Process.Pid)
	if err != nil {
		return 0, 0, err
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, callers)
	end := time.Now().Add(d)
	for i := range callers {
		wg.Go(func() {
			for time.Now().Before(end) {
				if _, err := c.Publish(ctx, req); err != nil {
					errs[i] = fmt.Errorf("%s: %w", s.name, err)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	cpu1, err := proccpu.Process(s.cmd.Process.Pid)
	if err != nil {
		return 0, 0, err
	}
	return n.Load(), cpu1 - cpu0, errors.Join(errs...)
}

// purge removes what the servers published: the floor servers' nodes,
// or, for a broker, its queue's messages.
func purge(ctx context.Context, conn *zk.Conn, s *server) error {
	if s.broker {
		cc, err := dial(s.addr)
		if err != nil {
			return err
		}
		defer cc.Close()
		_, err = pb.NewQueueClient(cc).Purge(ctx, &pb.PurgeRequest{Name: "q"})
		return err
	}
	names, _, err := conn.Children("/pubfloor")
	if err != nil {
		return err
	}
	for len(names) > 0 {
		n := min(len(names), 500)
		ops := make([]any, n)
		for i, name := range names[:n] {
			ops[i] = &zk.DeleteRequest{Path: "/pubfloor/" + name, Version: -1}
		}
		if _, err := conn.Multi(ops...); err != nil {
			return err
		}
		names = names[n:]
	}
	return nil
}

func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}
