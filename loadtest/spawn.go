package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/qbroker/qbroker/internal/ports"
	"github.com/qbroker/qbroker/internal/proccpu"
	"github.com/qbroker/qbroker/internal/zkserver"
)

// Topology is what the load test runs against: brokers (with their
// /metrics when known) and, for the baselines, their ZooKeeper. Spawned
// topologies also know the process ids, for CPU accounting.
type Topology struct {
	Brokers   []string
	Metrics   []string
	ZooKeeper string
	Spawned   bool
	// Security is what clients of spawned secure brokers use; nil
	// otherwise.
	Security *Security

	zk      *zkserver.Server
	procs   []*brokerProc
	tmp     string
	bin     string   // the qbroker binary of spawned brokers
	extra   []string // their security flags (--spawn-secure)
	stopped sync.Once
}

// brokerProc is one spawned `qbroker serve`.
type brokerProc struct {
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has been waited for
	logPath string

	killed    bool          // by kill, on purpose
	cpuAtKill time.Duration // its CPU time just before
}

// spawnZKHeapMB is the spawned ZooKeeper's heap, and the spawned brokers'
// data budget is what it holds (zkserver.DataBudget: 1 GiB), for a
// backlog of 1,000,000 messages of 100 B: a budget of 768 MiB refused the
// last 0.5% of such a backlog in segments (their node paths are longer).
// The heap grows only as it is used.
const spawnZKHeapMB = 4096

// externalTopology is a topology of brokers started by someone else.
func externalTopology(c Config) *Topology {
	return &Topology{Brokers: c.Brokers, Metrics: c.Metrics, ZooKeeper: c.ZooKeeper}
}

// spawnTopology starts a ZooKeeper and n brokers on free loopback ports.
// bin is the qbroker binary; empty builds one with `go build`. Every
// process runs in its own process group with SIGKILL as its parent-death
// signal; Close stops them all. The brokers log (at warn level) to files
// in a temporary directory, whose last lines errors quote.
func spawnTopology(ctx context.Context, n int, bin string, secure, noSync bool) (_ *Topology, err error) {
	if !zkserver.Installed() {
		return nil, zkserver.ErrNotInstalled
	}
	tmp, err := os.MkdirTemp("", "qbroker-loadtest-")
	if err != nil {
		return nil, err
	}
	t := &Topology{Spawned: true, tmp: tmp}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	if bin == "" {
		if bin, err = buildQBroker(ctx, tmp, false); err != nil {
			return nil, err
		}
	}
	zkLog, err := os.Create(filepath.Join(tmp, "zookeeper.log"))
	if err != nil {
		return nil, err
	}
	defer zkLog.Close() // the child has its own descriptor
	t.bin = bin
	t.zk, err = zkserver.Start(ctx, zkserver.Config{Dir: filepath.Join(tmp, "zk"), HeapMB: spawnZKHeapMB, Stdout: zkLog, NoSync: noSync})
	if err != nil {
		return nil, err
	}
	t.ZooKeeper = t.zk.Addr()
	if secure {
		var sec Security
		if t.extra, sec, err = secureFiles(filepath.Join(tmp, "security")); err != nil {
			return nil, err
		}
		t.Security = &sec
	}
	for i := range n {
		p, grpcAddr, metricsAddr, err := runBroker(ctx, tmp, bin, t.ZooKeeper, i, t.extra...)
		if err != nil {
			return nil, err
		}
		t.procs = append(t.procs, p)
		t.Brokers = append(t.Brokers, grpcAddr)
		t.Metrics = append(t.Metrics, metricsAddr)
	}
	return t, nil
}

// runBroker starts broker i and waits until it serves. The ports are picked
// free (ports.Free) and then bound by the broker, so another process can
// take one in between; a broker that exits on a bind collision is started
// again on fresh ports, a few times.
func runBroker(ctx context.Context, tmp, bin, zkAddr string, i int, extra ...string) (*brokerProc, string, string, error) {
	const attempts = 5
	for attempt := 1; ; attempt++ {
		p, grpcAddr, metricsAddr, err := startBroker(tmp, bin, zkAddr, i, extra...)
		if err != nil {
			return nil, "", "", err
		}
		err = waitServing(ctx, p, grpcAddr, metricsAddr)
		if err == nil {
			return p, grpcAddr, metricsAddr, nil
		}
		p.stop()
		if attempt == attempts || !strings.Contains(tail(p.logPath), "address already in use") {
			return nil, "", "", err
		}
	}
}

// moduleRoot finds the qbroker module from the working directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/qbroker/qbroker\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the qbroker module: give --qbroker-bin")
		}
		dir = parent
	}
}

// buildQBroker builds cmd/qbroker into dir and returns the binary's path.
func buildQBroker(ctx context.Context, dir string, race bool) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "qbroker")
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/qbroker")...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/qbroker: %v\n%s", err, b)
	}
	return out, nil
}

func startBroker(tmp, bin, zkAddr string, i int, extra ...string) (*brokerProc, string, string, error) {
	ps, err := ports.Free(2)
	if err != nil {
		return nil, "", "", err
	}
	grpcAddr, metricsAddr := "127.0.0.1:"+strconv.Itoa(ps[0]), "127.0.0.1:"+strconv.Itoa(ps[1])
	logPath := filepath.Join(tmp, fmt.Sprintf("broker-%d.log", i))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, "", "", err
	}
	defer logf.Close()
	cmd := exec.Command(bin, append([]string{"serve",
		"--zk", zkAddr, "--root", "/qbroker-loadtest",
		"--listen", grpcAddr, "--metrics-listen", metricsAddr,
		"--id", "loadtest-" + strconv.Itoa(i), "--log-level", "warn",
		"--zk-data-budget", strconv.FormatInt(zkserver.DataBudget(spawnZKHeapMB)>>20, 10),
		"--shutdown-timeout", "3s",
		"--insecure"}, extra...)...) // ZooKeeper nodes open, as in the measurements so far
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = cleanEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, "", "", fmt.Errorf("start %s: %w", bin, err)
	}
	p := &brokerProc{cmd: cmd, done: make(chan struct{}), logPath: logPath}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, grpcAddr, metricsAddr, nil
}

// cleanEnv drops QBROKER_* variables, so the flags alone configure the
// spawned brokers.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QBROKER_") {
			env = append(env, kv)
		}
	}
	return env
}

// waitServing waits until the broker's gRPC port accepts connections and
// its /healthz answers 200 (which, unlike /metrics, needs no identity when
// authentication is on).
func waitServing(ctx context.Context, p *brokerProc, grpcAddr, metricsAddr string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if c, err := net.DialTimeout("tcp", grpcAddr, time.Second); err == nil {
			c.Close()
			if resp, err := httpClient.Get("http://" + metricsAddr + "/healthz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("broker %s exited during startup:\n%s", grpcAddr, tail(p.logPath))
		case <-ctx.Done():
			return fmt.Errorf("broker %s not serving: %w\n%s", grpcAddr, ctx.Err(), tail(p.logPath))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tail returns the end of a log file, for errors (the file is removed
// with the topology).
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.TrimSpace(string(b))
}

// stop ends a broker (stopGroup).
func (p *brokerProc) stop() { stopGroup(p.cmd, p.done) }

// stopGroup ends a spawned server: SIGTERM to the process group of cmd,
// SIGKILL after 5s; it returns once done (cmd waited for) is closed.
func stopGroup(cmd *exec.Cmd, done <-chan struct{}) {
	pid := cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-done
	}
}

// exited reports brokers that died during the run, with their logs.
func (t *Topology) exited() []string {
	var out []string
	for i, p := range t.procs {
		if p.killed {
			continue
		}
		select {
		case <-p.done:
			out = append(out, fmt.Sprintf("broker %s exited: %s", t.Brokers[i], tail(p.logPath)))
		default:
		}
	}
	return out
}

// Close stops spawned processes (brokers first, then ZooKeeper) and
// removes their files. It does nothing for external topologies.
func (t *Topology) Close() {
	t.stopped.Do(func() {
		var wg sync.WaitGroup
		for _, p := range t.procs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.stop()
			}()
		}
		wg.Wait()
		if t.zk != nil {
			_ = t.zk.Close()
		}
		if t.tmp != "" {
			_ = os.RemoveAll(t.tmp)
		}
	})
}

// cpuSample is the CPU time used so far by the spawned processes and by
// the load test itself.
type cpuSample struct {
	Brokers   time.Duration
	ZooKeeper time.Duration
	Self      time.Duration
}

func (a cpuSample) sub(b cpuSample) cpuSample {
	return cpuSample{Brokers: a.Brokers - b.Brokers, ZooKeeper: a.ZooKeeper - b.ZooKeeper, Self: a.Self - b.Self}
}

// cpu reads the spawned processes' CPU time; ok is false for external
// topologies or when a process is gone.
func (t *Topology) cpu() (s cpuSample, ok bool) {
	if !t.Spawned || t.zk == nil {
		return s, false
	}
	zk, err := proccpu.Process(t.zk.Pid())
	if err != nil {
		return s, false
	}
	s.ZooKeeper = zk
	if s.Self, err = proccpu.Process(os.Getpid()); err != nil {
		return s, false
	}
	for _, p := range t.procs {
		if p.killed {
			s.Brokers += p.cpuAtKill
			continue
		}
		d, err := proccpu.Process(p.cmd.Process.Pid)
		if err != nil {
			return s, false
		}
		s.Brokers += d
	}
	return s, true
}
