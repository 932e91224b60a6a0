package faults_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/ports"
	"github.com/qbroker/qbroker/internal/zktest"
)

// Timings of the suite's brokers: short, so faults take effect within
// seconds, and within ZooKeeper's session bounds (2 to 20 ticks of 200ms).
const (
	sessionTimeout = 3 * time.Second
	sweepInterval  = 500 * time.Millisecond
	visibility     = 3 * time.Second
)

// brokerProc is one `qbroker serve` process. Its ZooKeeper traffic goes
// through its own proxies (one per ensemble member), so a partition can
// cut it off alone.
type brokerProc struct {
	t       *testing.T
	bin     string
	id      string
	addr    string // gRPC
	metrics string
	args    []string
	proxies []*zktest.Proxy
	logPath string
	nofile  uint64 // descriptor limit; 0 inherits

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// cluster is one scenario's brokers under their own root.
type cluster struct {
	t       *testing.T
	s       *suite
	name    string
	root    string
	dir     string
	brokers []*brokerProc
}

type clusterOptions struct {
	brokers int
	sweep   time.Duration // 0: sweepInterval
	nofile  uint64        // descriptor limit of each broker; 0 inherits
}

// newCluster starts n brokers for scenario name and stops them when the
// test ends.
func newCluster(t *testing.T, name string, o clusterOptions) *cluster {
	t.Helper()
	s := env(t)
	zkc := s.healthy(t)
	var b [3]byte
	_, _ = rand.Read(b[:])
	c := &cluster{t: t, s: s, name: name, root: "/faults/" + name + "-" + hex.EncodeToString(b[:]), dir: filepath.Join(s.dir, name)}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if o.sweep == 0 {
		o.sweep = sweepInterval
	}
	for i := range o.brokers {
		p := &brokerProc{t: t, bin: s.bin, id: fmt.Sprintf("%s-%d", name, i), nofile: o.nofile,
			logPath: filepath.Join(c.dir, fmt.Sprintf("broker-%d.log", i))}
		var zkAddrs []string
		for _, addr := range zkc.Addrs() {
			px := zktest.NewProxy(t, addr)
			p.proxies = append(p.proxies, px)
			zkAddrs = append(zkAddrs, px.Addr())
		}
		p.addr, p.metrics = freeAddr(t), freeAddr(t)
		p.args = []string{"serve",
			"--zk", strings.Join(zkAddrs, ","), "--root", c.root,
			"--listen", p.addr, "--metrics-listen", p.metrics, "--id", p.id,
			"--session-timeout", sessionTimeout.String(), "--sweep-interval", o.sweep.String(),
			"--visibility-timeout", visibility.String(), "--shutdown-timeout", "3s",
			"--max-payload", "524288", "--max-batch-count", "1000", "--max-batch-bytes", "921600",
			"--log-level", "info", "--insecure"}
		c.brokers = append(c.brokers, p)
	}
	// Registered after the proxies' cleanups, so it runs before them.
	t.Cleanup(c.close)
	var wg sync.WaitGroup
	errs := make([]error, len(c.brokers))
	for i, p := range c.brokers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.start()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// addrs returns the gRPC addresses of the brokers with the given indexes,
// all when none are given.
func (c *cluster) addrs(idx ...int) []string {
	if len(idx) == 0 {
		for i := range c.brokers {
			idx = append(idx, i)
		}
	}
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = c.brokers[j].addr
	}
	return out
}

func (c *cluster) close() {
	var wg sync.WaitGroup
	for _, p := range c.brokers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stop()
		}()
	}
	wg.Wait()
}

// zkConn opens a session to the ensemble itself (not through a proxy),
// for looking at registrations.
func (c *cluster) zkConn() *zk.Conn {
	return zktest.ConnTo(c.t, c.s.zk.Addrs())
}

// sessionOf returns the session that owns broker p's registration, 0 when
// it is not registered.
func (c *cluster) sessionOf(conn *zk.Conn, p *brokerProc) int64 {
	ok, st, err := conn.Exists(c.root + "/brokers/" + p.id)
	if err != nil || !ok {
		return 0
	}
	return st.EphemeralOwner
}

// freeAddr returns a loopback address to start a server on, and start it
// again on after a stop (ports.Free).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := ports.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// cleanEnv drops QBROKER_* variables: the flags alone configure brokers.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QBROKER_") {
			env = append(env, kv)
		}
	}
	return env
}

// start starts the process (again, after kill or stop, with the same id
// and addresses) and waits until it reports SERVING.
func (p *brokerProc) start() error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- start %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	if p.nofile > 0 {
		// The limit must hold from the start: a broker sizes its
		// connection limits from it.
		cmd = exec.Command("prlimit", append([]string{fmt.Sprintf("--nofile=%d:%d", p.nofile, p.nofile), p.bin}, p.args...)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = cleanEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start broker %s: %w", p.id, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := waitServing(ctx, p.addr, done); err != nil {
		return fmt.Errorf("broker %s: %w\n%s", p.id, err, p.logTail())
	}
	return nil
}

// waitServing waits until the broker at addr answers its health check
// with SERVING, failing early when the process exits.
func waitServing(ctx context.Context, addr string, exited <-chan struct{}) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: pb.Queue_ServiceDesc.ServiceName})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before serving")
		case <-ctx.Done():
			return fmt.Errorf("not serving (last: %v, %v): %w", r.GetStatus(), err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *brokerProc) proc() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.done
}

// alive reports whether the process runs (paused counts as running).
func (p *brokerProc) alive() bool {
	cmd, done := p.proc()
	if cmd == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

func (p *brokerProc) signal(sig syscall.Signal) {
	if cmd, _ := p.proc(); cmd != nil {
		_ = syscall.Kill(cmd.Process.Pid, sig)
	}
}

// kill ends the process with SIGKILL, as a crash would, and waits.
func (p *brokerProc) kill() {
	cmd, done := p.proc()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// stop ends the process with SIGTERM (SIGKILL after 15s) and waits. A
// paused process is continued first.
func (p *brokerProc) stop() {
	cmd, done := p.proc()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT)
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// pause stops the process with SIGSTOP: it holds its sockets but answers
// nothing, as a broker in a long GC pause or a frozen VM would.
func (p *brokerProc) pause() { p.signal(syscall.SIGSTOP) }

// resume continues a paused process.
func (p *brokerProc) resume() { p.signal(syscall.SIGCONT) }

// stall partitions the broker from ZooKeeper: its proxies stop forwarding
// without closing connections.
func (p *brokerProc) stall() {
	for _, px := range p.proxies {
		px.Stall()
	}
}

// heal ends a stall.
func (p *brokerProc) heal() {
	for _, px := range p.proxies {
		px.Resume()
	}
}

// logTail returns the end of the broker's log.
func (p *brokerProc) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	const max = 3000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.TrimSpace(string(b))
}

// registered waits until broker p's registration exists under a session
// other than the ones in not (sessions that died or were cut off), and
// reports whether it did within the deadline.
func (c *cluster) registered(conn *zk.Conn, p *brokerProc, within time.Duration, not ...int64) bool {
	deadline := time.Now().Add(within)
	for {
		if s := c.sessionOf(conn, p); s != 0 && !slices.Contains(not, s) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// unregistered waits until the session owner no longer owns broker p's
// registration (it expired), and reports whether it did in time.
func (c *cluster) unregistered(conn *zk.Conn, p *brokerProc, owner int64, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		if c.sessionOf(conn, p) != owner {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}
