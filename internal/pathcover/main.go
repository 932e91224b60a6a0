// Command pathcover lists the zkqueue files that a plain message's path
// crosses: a publish, a take with a lease (as a consume), its ack, and a
// lease's expiry (LeaseSweeper), each run once after a warm-up, with the
// coverage counters cleared before it. A plain message uses no optional
// feature (no dedup id, no group, no TTL, no delay); the queue is opened
// as the broker opens one (groups, dedup, a publisher tag, a Committer).
// It fails when a step runs code of an optional feature's file.
//
// It needs a coverage build and a ZooKeeper install (internal/zkserver):
//
//	go build -cover -covermode=atomic -coverpkg=./zkqueue/... -o /tmp/pathcover ./internal/pathcover
//	GOCOVERDIR=$(mktemp -d) /tmp/pathcover
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/coverage"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkserver"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// featureFiles hold the optional features: a message that uses none of
// them goes through none of their functions.
var featureFiles = []string{"dedup.go", "groups.go", "ttl.go", "delay.go", "baddata.go"}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pathcover:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := zkserver.Start(ctx, zkserver.Config{HeapMB: 256})
	if err != nil {
		return err
	}
	defer srv.Close()
	conn, err := zkutil.Connect([]string{srv.Addr()}, 10*time.Second, nil, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	p := newPath(ctx, conn)
	if err := p.open("/pathcover"); err != nil {
		return err
	}
	defer p.com.Close()
	// Warm-up: every step once, so what runs once per queue (the first
	// listing, the tail's lookup, creating the parents) is not counted.
	for _, f := range []func() error{p.publish, p.take(time.Minute), p.ack} {
		if err := f(); err != nil {
			return err
		}
	}
	if _, err := p.sweeper.Sweep(ctx, time.Now(), zkqueue.Policy{}); err != nil {
		return err
	}
	steps := []struct {
		name    string
		run     func() error
		measure bool
	}{
		{"publish", p.publish, true},
		{"consume (Leases.Take)", p.take(time.Minute), true},
		{"ack (Leases.Ack)", p.ack, true},
		{"publish", p.publish, false},
		{"take with a short lease", p.take(time.Millisecond), false},
		{"lease expiry (LeaseSweeper.Sweep)", p.expire, true},
	}
	dir, err := os.MkdirTemp("", "pathcover-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var failed []string
	for i, s := range steps {
		if err := coverage.ClearCounters(); err != nil {
			return err
		}
		if err := s.run(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		files, err := coveredFiles(filepath.Join(dir, fmt.Sprint(i)))
		if err != nil {
			return err
		}
		if !s.measure {
			continue
		}
		fmt.Printf("%s: %d files: %s\n", s.name, len(files), strings.Join(files, " "))
		for _, f := range featureFiles {
			if slices.Contains(files, f) {
				failed = append(failed, s.name+" runs "+f)
			}
		}
	}
	if failed != nil {
		return fmt.Errorf("a plain message runs an optional feature's code: %s", strings.Join(failed, "; "))
	}
	return nil
}

// path is one queue and what the steps share.
type path struct {
	ctx     context.Context
	conn    *zk.Conn
	com     *zkqueue.Committer
	items   *zkqueue.Queue
	leases  *zkqueue.Leases
	sweeper *zkqueue.LeaseSweeper
	token   string
}

func newPath(ctx context.Context, conn *zk.Conn) *path { return &path{ctx: ctx, conn: conn} }

func (p *path) open(root string) error {
	p.com = zkqueue.NewCommitter([]*zk.Conn{p.conn}, zkqueue.CommitterConfig{})
	var err error
	p.items, err = zkqueue.New(p.conn, root+"/items", zkqueue.WithGroups(root+"/groups"),
		zkqueue.WithDedup(root+"/dedup", time.Minute), zkqueue.WithPublisher("pathcover"), zkqueue.WithCommitter(p.com))
	if err != nil {
		return err
	}
	if p.leases, err = zkqueue.NewLeases(p.items, root+"/leases", root+"/dead"); err != nil {
		return err
	}
	p.sweeper = zkqueue.NewLeaseSweeper(p.conn, root+"/items", root+"/leases", root+"/dead",
		zkqueue.SweeperConfig{Groups: root + "/groups", Committer: p.com})
	return nil
}

// publish publishes one plain message as the broker does: checked once,
// then published.
func (p *path) publish() error {
	drafts := []zkqueue.Draft{{Payload: []byte("plain")}}
	if err := p.items.Check(drafts); err != nil {
		return err
	}
	_, err := p.items.PublishDraft(p.ctx, drafts[0])
	return err
}

func (p *path) take(ttl time.Duration) func() error {
	return func() error {
		ls, err := p.leases.Take(p.ctx, 1, zkqueue.Room{}, ttl, false)
		if err != nil {
			return err
		}
		p.token = ls[0].Token
		return nil
	}
}

func (p *path) ack() error {
	_, err := p.leases.Ack(p.ctx, p.token)
	return err
}

// expire waits for the lease's deadline and sweeps it.
func (p *path) expire() error {
	for !p.sweeper.Due(time.Now()) {
		select {
		case <-p.ctx.Done():
			return p.ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	ex, err := p.sweeper.Sweep(p.ctx, time.Now(), zkqueue.Policy{})
	if err == nil && len(ex) != 1 {
		err = errors.New("the sweep released no lease")
	}
	return err
}

// coveredFiles writes the coverage data into dir and returns the names
// of the zkqueue files with a statement run since the counters were
// cleared.
func coveredFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := coverage.WriteMetaDir(dir); err != nil {
		return nil, err
	}
	if err := coverage.WriteCountersDir(dir); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "cover.txt")
	if b, err := exec.Command("go", "tool", "covdata", "textfmt", "-i", dir, "-o", out).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("covdata: %v: %s", err, b)
	}
	f, err := os.Open(out)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// github.com/qbroker/qbroker/zkqueue/queue.go:12.3,14.5 2 1
		name, rest, ok := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(rest)
		if ok && len(fields) == 3 && fields[2] != "0" && strings.Contains(name, "/zkqueue/") {
			seen[filepath.Base(name)] = true
		}
	}
	files := make([]string, 0, len(seen))
	for f := range seen {
		files = append(files, f)
	}
	slices.Sort(files)
	return files, sc.Err()
}
