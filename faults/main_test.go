package faults_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/qbroker/qbroker/faults"
	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zktest"
)

var (
	fullRun = flag.Bool("faults.full", os.Getenv("QBROKER_FAULTS_FULL") != "",
		"run every scenario at full length, as make faults does ($QBROKER_FAULTS_FULL)")
	outFile = flag.String("faults.out", "", "also write the results table (Markdown) to this file")
)

// suite is what the scenarios share: the qbroker binary, built once, and
// a 3-member ZooKeeper ensemble, started on first use (unit tests of the
// checker need neither). Every scenario runs its own brokers under its
// own root.
type suite struct {
	once sync.Once
	err  error
	dir  string // binary, logs, ZooKeeper data
	bin  string
	zk   *zkserver.Cluster

	mu   sync.Mutex
	rows []faults.Row
}

var theSuite suite

func TestMain(m *testing.M) {
	flag.Parse()
	start := time.Now()
	code := m.Run()
	s := &theSuite
	if s.zk != nil {
		s.zk.Close()
	}
	if rows := s.results(); len(rows) > 0 {
		var b bytes.Buffer
		_ = faults.WriteTable(&b, rows)
		fmt.Printf("\nfault suite results (%s run, %v):\n\n%s\n", runKind(), time.Since(start).Round(time.Second), b.String())
		if *outFile != "" {
			if err := writeResults(*outFile, rows, time.Since(start)); err != nil {
				fmt.Fprintf(os.Stderr, "faults: write %s: %v\n", *outFile, err)
				code = 1
			}
		}
	}
	if s.dir != "" {
		if code != 0 {
			fmt.Printf("faults: broker and ZooKeeper logs kept in %s\n", s.dir)
		} else {
			_ = os.RemoveAll(s.dir)
		}
	}
	if code == 0 {
		if err := goleak.Find(zktest.IgnoreGoroutines()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func runKind() string {
	if *fullRun {
		return "full"
	}
	return "short"
}

func writeResults(path string, rows []faults.Row, took time.Duration) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Fault suite results\n\n")
	fmt.Fprintf(&b, "%s run, %s, %v. Command: `%s`.\n\n", runKind(), time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		took.Round(time.Second), command())
	if err := faults.WriteTable(&b, rows); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func command() string {
	if *fullRun {
		return "make faults (go test ./faults -args -faults.full)"
	}
	return "go test ./faults"
}

// env returns the suite, starting it on first use; it skips the test
// when ZooKeeper is not installed (fails it when CI is set).
func env(t *testing.T) *suite {
	t.Helper()
	if !zkserver.Installed() {
		if os.Getenv("CI") != "" {
			t.Fatal("ZooKeeper is required in CI")
		}
		t.Skip("ZooKeeper not installed")
	}
	s := &theSuite
	s.once.Do(func() { s.err = s.start() })
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s
}

func (s *suite) start() error {
	dir, err := os.MkdirTemp("", "qbroker-faults-")
	if err != nil {
		return err
	}
	s.dir = dir
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if s.bin, err = buildQBroker(ctx, dir); err != nil {
		return err
	}
	zkLog, err := os.Create(filepath.Join(dir, "zookeeper.log"))
	if err != nil {
		return err
	}
	defer zkLog.Close() // the servers have their own descriptors
	s.zk, err = zkserver.StartCluster(ctx, 3, zkserver.Config{Dir: filepath.Join(dir, "zk"), HeapMB: 384, Stdout: zkLog})
	if err != nil {
		return fmt.Errorf("start the ZooKeeper ensemble: %w", err)
	}
	return nil
}

// buildQBroker builds cmd/qbroker into dir: the brokers run as separate
// processes, so they can be killed, paused and cut off like real ones.
func buildQBroker(ctx context.Context, dir string) (string, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.Contains(string(b), "module github.com/qbroker/qbroker\n") {
		return "", errors.New("faults: run from the faults package directory of the qbroker module")
	}
	bin := filepath.Join(dir, "qbroker")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/qbroker")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/qbroker: %v\n%s", err, out)
	}
	return bin, nil
}

// healthy restores the ensemble after an earlier scenario (every member
// running, a leader elected) and returns it.
func (s *suite) healthy(t *testing.T) *zkserver.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, m := range s.zk.Servers {
		if !m.Running() {
			if err := m.Start(ctx); err != nil {
				t.Fatalf("restart ZooKeeper member %d: %v", m.ID, err)
			}
		}
	}
	if _, err := s.zk.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	return s.zk
}

func (s *suite) addRows(rows ...faults.Row) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rows = append(s.rows, rows...)
}

func (s *suite) results() []faults.Row {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]faults.Row(nil), s.rows...)
}

// full skips a scenario that only the full run has.
func full(t *testing.T) {
	t.Helper()
	if !*fullRun {
		t.Skip("full run only: make faults, or go test ./faults -faults.full")
	}
}

// pick returns short or long by the kind of run.
func pick[T any](short, long T) T {
	if *fullRun {
		return long
	}
	return short
}
