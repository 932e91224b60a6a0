// Package zkserver starts real Apache ZooKeeper servers as child processes for
// tests and for local development ("qbroker dev", "make run").
//
// It runs the ZooKeeper installed on the machine: Debian's package (jars under
// /usr/share/java) or an upstream distribution pointed to by ZOOKEEPER_HOME.
// Every server listens on free 127.0.0.1 ports, keeps its data in its own
// directory, and is started in its own process group with a parent-death
// signal, so a killed test binary leaves no java process behind. Its console
// output (ZooKeeper's log at INFO, and anything the JVM prints, such as an
// OutOfMemoryError) always goes to zookeeper.log in that directory
// (Server.LogPath), so a server that dies leaves a reason behind; Exited
// reports its death.
//
// A Server and a Cluster are safe for concurrent use.
package zkserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/qbroker/qbroker/internal/ports"
)

// ErrNotInstalled reports that no ZooKeeper installation was found.
var ErrNotInstalled = errors.New("zkserver: ZooKeeper is not installed (apt-get install zookeeper, or set ZOOKEEPER_HOME)")

// Config describes how to run a server. The zero value is usable.
type Config struct {
	// Dir holds data and logs. Empty means a new temporary directory that
	// Stop removes.
	Dir string
	// HeapMB is the JVM's maximum heap (-Xmx) in MiB; 0 means
	// DefaultHeapMB. ZooKeeper keeps every znode and its recent proposals
	// in the heap: brokers against this server should refuse data beyond
	// DataBudget(HeapMB). The heap grows only as it is used.
	HeapMB int
	// TickTime is ZooKeeper's tick; 0 means 200ms, which makes session
	// timeouts between 400ms and 4s possible (min/max are 2 and 20 ticks).
	TickTime time.Duration
	// Stdout also receives the server's console output when set; the
	// log file in the server's directory always does.
	Stdout *os.File
	// NoSync runs the server with forceSync=no: it applies a transaction
	// without waiting for its log to reach the disk, so a machine crash
	// loses its last transactions. For measurements against servers that
	// sync on a timer (JetStream's default); never for data that matters.
	NoSync bool
}

// DefaultHeapMB is a server's heap unless Config.HeapMB says otherwise:
// the 1 GiB the broker's default data budget fits.
const DefaultHeapMB = 1024

// DataBudget returns the broker data budget (bytes, broker.Config's
// ZKDataBudget) that a server with a heap of heapMB MiB holds safely: a
// quarter of the heap. Measured on ZooKeeper 3.8 with OpenJDK 17
// (docs/operations.md, Limits): a flood of 500 KiB messages through a broker exhausted a heap
// of 128 MiB at a budget estimate of about 56 MiB (44%); 1,000,000
// messages of 100 B (an estimate of 628 MB) took 480 MB of heap.
func DataBudget(heapMB int) int64 { return int64(heapMB) << 20 / 4 }

// LogName is the file, in a server's directory, that keeps its console
// output.
const LogName = "zookeeper.log"

// Classpath returns the Java classpath of the installed ZooKeeper.
// ZOOKEEPER_HOME (an upstream distribution: lib/*.jar and *.jar) wins over
// Debian's /usr/share/java/zookeeper.jar.
func Classpath() (string, error) {
	if home := os.Getenv("ZOOKEEPER_HOME"); home != "" {
		var jars []string
		for _, pat := range []string{"lib/*.jar", "*.jar", "zookeeper-server/target/*.jar"} {
			m, _ := filepath.Glob(filepath.Join(home, pat))
			jars = append(jars, m...)
		}
		if len(jars) == 0 {
			return "", fmt.Errorf("%w: no jars under ZOOKEEPER_HOME=%s", ErrNotInstalled, home)
		}
		return strings.Join(jars, ":"), nil
	}
	const debian = "/usr/share/java/zookeeper.jar"
	if _, err := os.Stat(debian); err != nil {
		return "", ErrNotInstalled
	}
	// Debian's jar brings slf4j-api but no binding, so ZooKeeper would log
	// nothing at all; slf4j-simple (Debian's libslf4j-java) writes to
	// stderr, which goes to the log file.
	if _, err := os.Stat(debianSLF4J); err == nil {
		return debian + ":" + debianSLF4J, nil
	}
	return debian, nil
}

const debianSLF4J = "/usr/share/java/slf4j-simple.jar"

// logProperties are the JVM properties that make ZooKeeper log at INFO to
// the console: slf4j-simple's (Debian) and logback's configuration file of
// an upstream distribution.
func logProperties() []string {
	props := []string{
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
		"-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSZ",
	}
	if home := os.Getenv("ZOOKEEPER_HOME"); home != "" {
		if f := filepath.Join(home, "conf", "logback.xml"); fileExists(f) {
			props = append(props, "-Dlogback.configurationFile="+f)
		}
	}
	return props
}

func fileExists(name string) bool {
	_, err := os.Stat(name)
	return err == nil
}

// Installed reports whether a ZooKeeper installation and java are available.
func Installed() bool {
	if _, err := Classpath(); err != nil {
		return false
	}
	_, err := exec.LookPath("java")
	return err == nil
}

// Server is one ZooKeeper server process.
type Server struct {
	// ID is the server's myid inside an ensemble (1-based); 0 when standalone.
	ID int

	cfg        Config
	dir        string
	ownDir     bool
	clientPort int
	peers      string // server.N lines, ensemble only

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has been waited for
	exited  chan struct{} // done of the last process started; kept after Stop
	waitErr error         // the last process's exit status, once exited is closed
}

// Start starts a standalone server and waits until it serves requests.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	s, err := newServer(cfg, 0, ports[0], "")
	if err != nil {
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		s.cleanup()
		return nil, err
	}
	return s, nil
}

func newServer(cfg Config, id, clientPort int, peers string) (*Server, error) {
	if cfg.HeapMB == 0 {
		cfg.HeapMB = DefaultHeapMB
	}
	if cfg.TickTime == 0 {
		cfg.TickTime = 200 * time.Millisecond
	}
	s := &Server{ID: id, cfg: cfg, dir: cfg.Dir, clientPort: clientPort, peers: peers}
	if s.dir == "" {
		d, err := os.MkdirTemp("", "qbroker-zk-")
		if err != nil {
			return nil, fmt.Errorf("zkserver: %w", err)
		}
		s.dir, s.ownDir = d, true
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "data"), 0o755); err != nil {
		return nil, fmt.Errorf("zkserver: %w", err)
	}
	if id > 0 {
		if err := os.WriteFile(filepath.Join(s.dir, "data", "myid"), []byte(fmt.Sprintf("%d\n", id)), 0o644); err != nil {
			return nil, fmt.Errorf("zkserver: %w", err)
		}
	}
	return s, nil
}

// Addr returns the server's client address, host:port.
func (s *Server) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.clientPort) }

// Dir returns the server's data directory.
func (s *Server) Dir() string { return s.dir }

// LogPath returns the file that keeps the server's console output,
// appended to by every start.
func (s *Server) LogPath() string { return filepath.Join(s.dir, LogName) }

// Exited returns a channel closed when the server process started last
// ends, whatever ended it: a crash, an OutOfMemoryError, a kill, Stop. It
// is nil before the first Start. ExitError then tells how it ended.
func (s *Server) Exited() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exited
}

// ExitError returns how the last process ended ("signal: killed", "exit
// status 3"), nil while it runs or when it exited with status 0.
func (s *Server) ExitError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waitErr
}

// LogTail returns the last n lines of the server's log.
func (s *Server) LogTail(n int) ([]string, error) {
	f, err := os.Open(s.LogPath())
	if err != nil {
		return nil, err
	}
	defer f.Close()
	const window = 64 << 10
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(st.Size()-window, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	lines := strings.Split(strings.TrimRight(string(buf), "\n"), "\n")
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // the first is cut
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines, nil
}

func (s *Server) writeConfig() (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "tickTime=%d\n", s.cfg.TickTime.Milliseconds())
	fmt.Fprintf(&b, "dataDir=%s\n", filepath.Join(s.dir, "data"))
	fmt.Fprintf(&b, "clientPort=%d\nclientPortAddress=127.0.0.1\n", s.clientPort)
	b.WriteString("maxClientCnxns=0\nadmin.enableServer=false\n")
	// mntr also serves the brokers' data budget (zk_approximate_data_size,
	// zk_znode_count).
	b.WriteString("4lw.commands.whitelist=ruok,srvr,mntr,stat,conf,cons\n")
	b.WriteString("autopurge.purgeInterval=1\nautopurge.snapRetainCount=3\n")
	if s.cfg.NoSync {
		b.WriteString("forceSync=no\n")
	}
	if s.peers != "" {
		b.WriteString("initLimit=20\nsyncLimit=10\nreconfigEnabled=false\nstandaloneEnabled=false\n")
		b.WriteString(s.peers)
	}
	path := filepath.Join(s.dir, "zoo.cfg")
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// Start (re)starts a stopped server and waits until it answers ruok and,
// in an ensemble, has joined the quorum or ctx ends. Starting a running
// server is a no-op.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.cmd != nil {
		s.mu.Unlock()
		return nil
	}
	cp, err := Classpath()
	if err != nil {
		s.mu.Unlock()
		return err
	}
	cfgPath, err := s.writeConfig()
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("zkserver: %w", err)
	}
	logFile, err := os.OpenFile(s.LogPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("zkserver: %w", err)
	}
	fmt.Fprintf(logFile, "--- zkserver: starting ZooKeeper on %s at %s ---\n", s.Addr(), time.Now().Format(time.RFC3339))
	args := []string{
		fmt.Sprintf("-Xmx%dm", s.cfg.HeapMB), "-Xss512k",
		"-XX:+UseSerialGC", "-Xshare:auto",
		// A JVM out of memory exits, saying so, instead of serving on
		// with some of its threads dead.
		"-XX:+ExitOnOutOfMemoryError",
		// The last proposals are kept in memory to sync followers
		// (500 by default); with transactions near 1 MiB that alone
		// can fill a small heap. 100 still lets a follower that fell a
		// little behind catch up by diff.
		"-Dzookeeper.commitLogCount=100",
		"-Dzookeeper.admin.enableServer=false",
		"-Dzookeeper.jmx.log4j.disable=true",
	}
	args = append(args, logProperties()...)
	args = append(args, "-cp", cp, "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfgPath)
	cmd := exec.Command("java", args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if s.cfg.Stdout != nil {
		w := io.MultiWriter(logFile, s.cfg.Stdout)
		cmd.Stdout, cmd.Stderr = w, w
	}
	// Own process group (so Stop can kill the whole tree) and SIGKILL when
	// the parent dies, so no orphaned java survives a killed test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		s.mu.Unlock()
		return fmt.Errorf("zkserver: start java: %w", err)
	}
	done := make(chan struct{})
	s.cmd, s.done, s.exited, s.waitErr = cmd, done, done, nil
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(logFile, "--- zkserver: ZooKeeper exited at %s: %v ---\n", time.Now().Format(time.RFC3339), exitText(err))
		logFile.Close()
		s.mu.Lock()
		s.waitErr = err
		s.mu.Unlock()
		close(done)
	}()
	s.mu.Unlock()

	if err := s.waitReady(ctx, done); err != nil {
		_ = s.Stop()
		return err
	}
	return nil
}

func (s *Server) waitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if s.ready() {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("zkserver: server %s exited during startup: %s (see %s)", s.Addr(), exitText(s.ExitError()), s.LogPath())
		case <-ctx.Done():
			return fmt.Errorf("zkserver: server %s not ready: %w", s.Addr(), ctx.Err())
		case <-t.C:
		}
	}
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// ready reports whether the server answers ruok and serves clients
// (standalone, leader or follower according to srvr).
func (s *Server) ready() bool {
	if out, err := FourLetter(s.Addr(), "ruok", time.Second); err != nil || out != "imok" {
		return false
	}
	out, err := FourLetter(s.Addr(), "srvr", time.Second)
	if err != nil {
		return false
	}
	return strings.Contains(out, "Mode: standalone") || strings.Contains(out, "Mode: leader") ||
		strings.Contains(out, "Mode: follower")
}

// Running reports whether the server process is alive.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Pid returns the server's process id, or 0 when stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop terminates the server's process group (SIGTERM, then SIGKILL after
// 5s) and waits for it. Data is kept, so Start can restart the server.
func (s *Server) Stop() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	return nil
}

// Kill stops the server abruptly with SIGKILL, as a crash would.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Close stops the server and removes its directory when Start created it.
func (s *Server) Close() error {
	err := s.Stop()
	s.cleanup()
	return err
}

func (s *Server) cleanup() {
	if s.ownDir {
		_ = os.RemoveAll(s.dir)
	}
}

// Cluster is a ZooKeeper ensemble on loopback ports.
type Cluster struct {
	Servers []*Server
}

// StartCluster starts an ensemble of n servers (3 or 5 for a quorum that
// survives failures) and waits until every member serves clients.
func StartCluster(ctx context.Context, n int, cfg Config) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("zkserver: cluster size %d", n)
	}
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, err
	}
	var peers strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&peers, "server.%d=127.0.0.1:%d:%d\n", i+1, ports[3*i+1], ports[3*i+2])
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		scfg := cfg
		if cfg.Dir != "" {
			scfg.Dir = filepath.Join(cfg.Dir, fmt.Sprintf("zk%d", i+1))
		}
		s, err := newServer(scfg, i+1, ports[3*i], peers.String())
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Servers = append(c.Servers, s)
	}
	// Start all processes first: none becomes ready before a quorum runs.
	errs := make(chan error, n)
	for _, s := range c.Servers {
		go func(s *Server) { errs <- s.Start(ctx) }(s)
	}
	var first error
	for range c.Servers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		c.Close()
		return nil, first
	}
	return c, nil
}

// Addrs returns the client addresses of all members.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		out[i] = s.Addr()
	}
	return out
}

// Close stops every member and removes their directories.
func (c *Cluster) Close() {
	for _, s := range c.Servers {
		_ = s.Close()
	}
}

// FourLetter sends a four-letter-word command (ruok, srvr, mntr...) and
// returns the trimmed answer.
func FourLetter(addr, cmd string, timeout time.Duration) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte(cmd)); err != nil {
		return "", err
	}
	var b strings.Builder
	r := bufio.NewReader(conn)
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return strings.TrimSpace(b.String()), nil
}

// freePorts reserves n distinct free loopback ports, below the ephemeral
// range (see package ports): a server restarted on its ports finds them
// free.
func freePorts(n int) ([]int, error) {
	ps, err := ports.Free(n)
	if err != nil {
		return nil, fmt.Errorf("zkserver: %w", err)
	}
	return ps, nil
}
