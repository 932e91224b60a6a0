package broker_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// countingProxy forwards ZooKeeper client connections to a server and
// counts the requests clients send, pings aside: what a broker asks of
// ZooKeeper, whether or not the broker observes it in its metrics.
type countingProxy struct {
	ln     net.Listener
	target string
	reqs   atomic.Int64

	mu    sync.Mutex
	ops   map[int32]int64 // requests by opcode
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// ZooKeeper's ping opcode; a ping is the session's heartbeat.
const zkOpPing = 11

func newCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln, target: target, ops: map[int32]int64{}, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *countingProxy) addr() string { return p.ln.Addr().String() }

func (p *countingProxy) opsSeen() map[int32]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[int32]int64{}
	for k, v := range p.ops {
		out[k] = v
	}
	return out
}

func (p *countingProxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
}

func (p *countingProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.track(c, s)
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(c, s)
			c.Close()
			s.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.forwardRequests(s, c)
			c.Close()
			s.Close()
		}()
	}
}

// forwardRequests copies the client's frames (a 4-byte length, then the
// packet) to the server, counting each request's opcode; the first frame
// is the connect request, which has none.
func (p *countingProxy) forwardRequests(dst, src net.Conn) {
	r := bufio.NewReader(src)
	var hdr [4]byte
	for first := true; ; first = false {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		pkt := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(r, pkt); err != nil {
			return
		}
		if !first && len(pkt) >= 8 {
			if op := int32(binary.BigEndian.Uint32(pkt[4:8])); op != zkOpPing {
				p.reqs.Add(1)
				p.mu.Lock()
				p.ops[op]++
				p.mu.Unlock()
			}
		}
		if _, err := dst.Write(append(hdr[:], pkt...)); err != nil {
			return
		}
	}
}

// zkRequests sums the broker's qbroker_zk_request_duration_seconds counts.
func zkRequests(t *testing.T, reg *prometheus.Registry) int64 {
	t.Helper()
	return int64(max(0, metric(t, reg, "qbroker_zk_request_duration_seconds", nil)))
}

// waitQuiet waits (at most 60s) until neither the proxy nor the metric
// counts a request for a whole window: the leader has read every queue.
func waitQuiet(t *testing.T, proxy *countingProxy, reg *prometheus.Registry, window time.Duration) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, m := proxy.reqs.Load(), zkRequests(t, reg)
		time.Sleep(window)
		if proxy.reqs.Load() == p && zkRequests(t, reg) == m {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker keeps sending requests: %v", proxy.opsSeen())
		}
	}
}

// Idle queues cost nothing: with 50 idle queues the leader, once it has
// read each queue (those reads appear in the request metric), sends
// ZooKeeper no request at all over 20 sweep intervals. An expired lease
// in one of them is still redelivered.
func TestSweepOfIdleQueues(t *testing.T) {
	proxy := newCountingProxy(t, zktest.Addr(t))
	reg := prometheus.NewRegistry()
	const sweep = 100 * time.Millisecond
	b := startBroker(t, []string{proxy.addr()}, zktest.Root(t), func(c *broker.Config) {
		c.SweepInterval = sweep
		c.StatsInterval = time.Hour
		c.Registerer = reg
		c.ZKDataBudget = -1 // the proxy carries ZooKeeper's protocol, not the budget's mntr
	})
	const queues = 50
	for i := 0; i < queues; i++ {
		createQueue(t, b.client, &pb.CreateQueueRequest{Name: fmt.Sprintf("idle-%02d", i)})
	}
	// The leader reads each queue's metadata and leases once: at least
	// two requests per queue, through the metric.
	deadline := time.Now().Add(60 * time.Second)
	for zkRequests(t, reg) < 2*queues {
		if time.Now().After(deadline) {
			t.Fatalf("the leader's reads of %d queues: %d requests in the metric, want at least %d", queues, zkRequests(t, reg), 2*queues)
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitQuiet(t, proxy, reg, 5*sweep)

	// The window: 20 sweeps.
	p, m := proxy.reqs.Load(), zkRequests(t, reg)
	time.Sleep(20 * sweep)
	if dp, dm := proxy.reqs.Load()-p, zkRequests(t, reg)-m; dp != 0 || dm != 0 {
		t.Fatalf("over 20 sweeps of %d idle queues: %d requests sent (%v), %d in the metric; want none", queues, dp, proxy.opsSeen(), dm)
	}

	// An expired lease in one of them is redelivered.
	publishN(t, b.client, "idle-07", 1)
	first := receive(t, b.client, &pb.ReceiveRequest{Queue: "idle-07", Mode: alo, VisibilityTimeout: durationpb.New(time.Second)})
	if len(first) != 1 {
		t.Fatalf("received %d, want 1", len(first))
	}
	again := receive(t, b.client, &pb.ReceiveRequest{Queue: "idle-07", Mode: alo, Wait: durationpb.New(30 * time.Second)})
	if len(again) != 1 || again[0].GetId() != first[0].GetId() || again[0].GetDeliveryCount() != 2 {
		t.Fatalf("after the lease expired: got %v, want %s delivered a second time", again, first[0].GetId())
	}
}

// A lease whose deadline moves earlier than the leader read it (a delayed
// Nack shorter than the visibility timeout) is released at its new
// deadline, not at the one the leader knew.
func TestSweepSeesShortenedLease(t *testing.T) {
	b := newBroker(t, zktest.Root(t))
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q", VisibilityTimeout: durationpb.New(10 * time.Minute)})
	publishN(t, b.client, "q", 1)
	ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", Mode: alo})
	if len(ms) != 1 {
		t.Fatalf("received %d, want 1", len(ms))
	}
	// Let the leader read the 10-minute lease first.
	time.Sleep(500 * time.Millisecond)
	if _, err := b.client.Nack(context.Background(), &pb.NackRequest{AckToken: ms[0].GetAckToken(), Delay: durationpb.New(300 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	again := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", Mode: alo, Wait: durationpb.New(60 * time.Second)})
	if len(again) != 1 || again[0].GetDeliveryCount() != 2 {
		t.Fatalf("after a 300ms delayed nack: got %v, want the message again", again)
	}
}

var idleQueues = flag.Bool("idle-queues", false, "run TestIdleQueuesCost: 10,000 idle queues, CPU of broker and ZooKeeper")

// cpuSelf returns this process's CPU time (the broker runs in it).
func cpuSelf(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuOf returns a process's CPU time from /proc/<pid>/stat (utime and
// stime, in clock ticks of 10ms).
func cpuOf(t *testing.T, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name (which is in parentheses).
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// TestIdleQueuesCost is a benchmark, run on demand:
//
//	go test ./broker -run TestIdleQueuesCost -v -idle-queues
//
// It creates 10,000 queues, measures the CPU the broker (this process)
// and ZooKeeper use over 20s while they are idle, then how late expired
// leases are redelivered with the default 1s sweep interval. It asserts
// nothing about the figures; it logs them.
func TestIdleQueuesCost(t *testing.T) {
	if !*idleQueues {
		t.Skip("a benchmark: run with -idle-queues")
	}
	zks := zktest.Server(t)
	reg := prometheus.NewRegistry()
	proxy := newCountingProxy(t, zks.Addr())
	b := startBroker(t, []string{proxy.addr()}, zktest.Root(t), func(c *broker.Config) {
		c.SweepInterval = time.Second
		c.Registerer = reg
		c.ZKDataBudget = -1 // the proxy carries ZooKeeper's protocol, not the budget's mntr
	})
	const queues = 10_000
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < queues; i = next.Add(1) - 1 {
				if _, err := b.client.CreateQueue(context.Background(), &pb.CreateQueueRequest{Name: fmt.Sprintf("idle-%05d", i)}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("created %d queues in %v", queues, time.Since(start).Round(time.Millisecond))
	waitQuiet(t, proxy, reg, 3*time.Second)
	t.Logf("the leader read them: %d requests in the metric", zkRequests(t, reg))

	const window = 20 * time.Second
	self0, zk0, reqs0 := cpuSelf(t), cpuOf(t, zks.Pid()), proxy.reqs.Load()
	time.Sleep(window)
	self, zkCPU, reqs := cpuSelf(t)-self0, cpuOf(t, zks.Pid())-zk0, proxy.reqs.Load()-reqs0
	t.Logf("%d idle queues over %v: broker %.4f cores, ZooKeeper %.4f cores, together %.4f; %d requests from the broker",
		queues, window, self.Seconds()/window.Seconds(), zkCPU.Seconds()/window.Seconds(),
		(self+zkCPU).Seconds()/window.Seconds(), reqs)

	// Lease expiry among them: a 1s lease, redelivered how long after
	// its deadline?
	var worst time.Duration
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("idle-%05d", i*1999)
		publishN(t, b.client, name, 1)
		ms := receive(t, b.client, &pb.ReceiveRequest{Queue: name, Mode: alo, VisibilityTimeout: durationpb.New(time.Second)})
		if len(ms) != 1 {
			t.Fatalf("received %d, want 1", len(ms))
		}
		again := receive(t, b.client, &pb.ReceiveRequest{Queue: name, Mode: alo, Wait: durationpb.New(30 * time.Second)})
		if len(again) != 1 {
			t.Fatalf("%s: lease not redelivered within 30s", name)
		}
		late := time.Since(ms[0].GetLeaseDeadline().AsTime())
		worst = max(worst, late)
		t.Logf("%s: redelivered %v after its lease's deadline", name, late.Round(time.Millisecond))
	}
	t.Logf("worst: %v after the deadline (sweep interval 1s)", worst.Round(time.Millisecond))
}
