package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/qbroker/qbroker/internal/ports"
	"github.com/qbroker/qbroker/internal/proccpu"
)

// natsServerModule is the nats-server the repository already requires
// (go.mod): the JetStream baselines build it with go build unless
// --nats-server-bin names a binary.
const natsServerModule = "github.com/nats-io/nats-server/v2"

// buildNATSServer builds nats-server into dir from the module this tree
// requires and returns the binary's path.
func buildNATSServer(ctx context.Context, dir string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", errors.New("not inside the qbroker module: give --nats-server-bin")
	}
	out := filepath.Join(dir, "nats-server")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, natsServerModule)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", natsServerModule, err, b)
	}
	return out, nil
}

// natsProc is one nats-server process with JetStream, run as its users
// run it: its own process, configured by a file, storing in a directory.
type natsProc struct {
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd has been waited for
	url     string
	logPath string
}

// natsConfig is the configuration file of a JetStream server listening on
// port, storing in storeDir; syncAlways sets `sync_interval: always`
// (every write fsynced), else the server keeps its default (files synced
// every 2 minutes).
func natsConfig(port int, storeDir string, syncAlways bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: \"127.0.0.1:%d\"\n", port)
	b.WriteString("jetstream {\n")
	fmt.Fprintf(&b, "  store_dir: %s\n", strconv.Quote(storeDir))
	if syncAlways {
		b.WriteString("  sync_interval: always\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// startNATS starts bin in dir (its configuration, store and log there) on
// a free loopback port and waits until JetStream answers. Like the spawned
// brokers it runs in its own process group with SIGKILL as its
// parent-death signal; a start that lost its port to another process is
// tried again on a fresh one, a few times.
func startNATS(ctx context.Context, bin, dir string, syncAlways bool) (*natsProc, error) {
	const attempts = 5
	for attempt := 1; ; attempt++ {
		p, err := startNATSOnce(bin, dir, syncAlways)
		if err != nil {
			return nil, err
		}
		err = p.waitReady(ctx)
		if err == nil {
			return p, nil
		}
		p.stop()
		if attempt == attempts || !strings.Contains(tail(p.logPath), "address already in use") {
			return nil, err
		}
	}
}

func startNATSOnce(bin, dir string, syncAlways bool) (*natsProc, error) {
	ps, err := ports.Free(1)
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(conf, []byte(natsConfig(ps[0], filepath.Join(dir, "store"), syncAlways)), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "nats-server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &natsProc{cmd: cmd, done: make(chan struct{}), url: "nats://127.0.0.1:" + strconv.Itoa(ps[0]), logPath: logPath}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady waits until the server takes a connection and its JetStream
// answers an account info request.
func (p *natsProc) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if nc, err := nats.Connect(p.url, nats.Timeout(time.Second)); err == nil {
			_, err = nc.Request("$JS.API.INFO", nil, time.Second)
			nc.Close()
			if err == nil {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("nats-server exited during startup:\n%s", tail(p.logPath))
		case <-ctx.Done():
			return fmt.Errorf("nats-server %s not ready: %w\n%s", p.url, ctx.Err(), tail(p.logPath))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// cpu returns the CPU time the server has used so far.
func (p *natsProc) cpu() (time.Duration, error) { return proccpu.Process(p.cmd.Process.Pid) }

// exited reports whether the server died.
func (p *natsProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends the server (stopGroup).
func (p *natsProc) stop() { stopGroup(p.cmd, p.done) }
