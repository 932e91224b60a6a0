// Command pathfiles measures which hand-written files of qbroker a
// message's calls run code in: a plain publish, an at-least-once consume
// on a stream (prefetch 1), its ack on the stream, and a lease expiry
// swept by the leader. `make pathfiles` runs it; docs/design.md's "A
// message's path through the code" is its answer.
//
// It runs only as a binary built with coverage of the whole module in
// atomic mode (the make target's flags: go build -cover
// -covermode=atomic -coverpkg=github.com/qbroker/qbroker/...). It starts a real ZooKeeper and
// a real broker in-process, warms them up, then for each call clears the
// coverage counters, makes the call, writes the counters and lists the
// files with a statement hit (go tool covdata textfmt). Generated code
// (.pb.go) and test files are left out. Background work the broker does
// on timers (health probes, the ZooKeeper memory probe, the leader's idle
// rounds) can land in any window; each call is measured in several rounds
// and a file counts for it only when every round hit it, the others are
// listed apart as background.
//
// None of these calls uses an optional feature (no delay, dedup id,
// group, TTL, quota, event sink or authentication), so none may run code
// of a feature's file (featureFiles): the program fails, naming the call
// and the file, when one does in every round. It fails too when a publish
// crosses more than 8 files or a consume more than 10 (maxFiles).
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/coverage"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zkserver"
)

const (
	module = "github.com/qbroker/qbroker/"
	rounds = 5
	queue  = "plain"
)

// calls in the order a round makes them.
var calls = []string{"publish", "consume", "ack", "lease expiry"}

// featureFiles hold the optional features' code: a call that uses none
// of them runs none of it. The engine's: dedup ids, message groups, TTL,
// delayed delivery, the undecodable-message path, retry backoff, single
// active consumer, fair dispatch. The broker's: delay and TTL
// (schedule.go), dedup ids, quotas, events, retry backoff, single active
// consumer, fair dispatch, authentication and authorization.
var featureFiles = []string{
	"zkqueue/dedup.go", "zkqueue/groups.go", "zkqueue/ttl.go", "zkqueue/delay.go", "zkqueue/baddata.go", "zkqueue/backoff.go",
	"zkqueue/active.go", "zkqueue/fairness.go",
	"broker/schedule.go", "broker/dedup.go", "broker/quota.go", "broker/emit.go", "broker/backoff.go", "broker/active.go",
	"broker/auth.go", "broker/authz.go", "broker/jwt.go", "broker/authstreams.go", "broker/fairness.go", "broker/ahead.go",
}

// maxFiles bounds the files a call may cross: the path of a message
// stays readable in a few files (docs/design.md). A call over its bound
// fails the program like a feature file on its path.
var maxFiles = map[string]int{"publish": 8, "consume": 10}

var verbose = flag.Bool("v", false, "also list the lines of the blocks hit")

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pathfiles:", err)
		os.Exit(1)
	}
}

// fail ends run with an error.
type fail struct{ err error }

func check(err error, what string) {
	if err != nil {
		panic(fail{fmt.Errorf("%s: %w", what, err)})
	}
}

func run() (err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fail)
			if !ok {
				panic(r)
			}
			err = f.err
		}
	}()
	if err := coverage.ClearCounters(); err != nil {
		return fmt.Errorf("%w: build with go build -cover -covermode=atomic -coverpkg=github.com/qbroker/qbroker/... (make pathfiles)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "pathfiles")
	check(err, "temporary directory")
	defer os.RemoveAll(dir)
	zs, err := zkserver.Start(ctx, zkserver.Config{})
	check(err, "ZooKeeper")
	defer zs.Close()
	addr, root := zs.Addr(), "/pathfiles"
	// The leader sweeps often, so that an expired lease goes back soon;
	// queue gauges are refreshed only at start.
	cfg := broker.Config{ZooKeeper: []string{addr}, Root: root, SweepInterval: 100 * time.Millisecond,
		StatsInterval: time.Hour, SessionTimeout: 10 * time.Second}
	s, err := brokertest.Start(ctx, cfg, brokertest.Options{})
	check(err, "broker")
	defer s.Stop()
	cc, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	check(err, "client")
	defer cc.Close()
	c := pb.NewQueueClient(cc)
	// A plain session of the unwrapped client, to watch the queue's
	// leases from outside the broker's code.
	zc, _, err := zk.Connect([]string{addr}, 10*time.Second, zk.WithLogger(discard{}))
	check(err, "ZooKeeper session")
	defer zc.Close()
	leases := root + "/queues/" + queue + "/leases"

	_, err = c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: queue, Kind: pb.QueueKind_QUEUE_KIND_FIFO})
	check(err, "create queue")
	hits := map[string][]map[string]map[string]int{} // call -> per round: file -> blocks hit
	measure := func(call string, round int, f func()) {
		d := filepath.Join(dir, fmt.Sprintf("%s-%d", strings.ReplaceAll(call, " ", "_"), round))
		check(os.MkdirAll(d, 0o755), "coverage directory")
		check(coverage.WriteMetaDir(d), "coverage meta-data")
		check(coverage.ClearCounters(), "clear counters")
		f()
		check(coverage.WriteCountersDir(d), "write counters")
		if round >= 0 {
			hits[call] = append(hits[call], filesHit(d))
		}
	}
	publish := func() {
		_, err := c.Publish(ctx, &pb.PublishRequest{Queue: queue, Messages: []*pb.OutMessage{{Payload: []byte("hello")}}})
		check(err, "publish")
	}
	// waitLeases waits, on a children watch, until the queue has n leases.
	waitLeases := func(n int) {
		for {
			kids, _, ch, err := zc.ChildrenW(leases)
			if err != nil {
				check(err, leases)
			}
			if len(kids) == n {
				return
			}
			select {
			case <-ch:
			case <-ctx.Done():
				check(ctx.Err(), fmt.Sprintf("%s: want %d leases", leases, n))
			}
		}
	}
	// round -1 warms up (it is not counted); -2 and -3 too, uncleared.
	for round := -3; round < rounds; round++ {
		measure("publish", round, publish)
		var stream pb.Queue_ConsumeClient
		var token string
		measure("consume", round, func() {
			var err error
			stream, err = c.Consume(ctx)
			check(err, "consume")
			check(stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue,
				Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE, Prefetch: 1}}), "subscribe")
			d, err := stream.Recv()
			check(err, "delivery")
			token = d.GetMessage().GetAckToken()
		})
		measure("ack", round, func() {
			check(stream.Send(&pb.ConsumeRequest{Settle: []*pb.Settle{{AckToken: token}}}), "ack")
			waitLeases(0)
		})
		check(stream.CloseSend(), "close stream")
		if _, err := stream.Recv(); err == nil {
			check(errors.New("a delivery after the only message was acked"), "consume")
		}
		publish()
		r, err := c.Receive(ctx, &pb.ReceiveRequest{Queue: queue, Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE,
			VisibilityTimeout: durationpb.New(300 * time.Millisecond)})
		check(err, "receive")
		if len(r.GetMessages()) != 1 {
			check(fmt.Errorf("%d messages", len(r.GetMessages())), "receive")
		}
		measure("lease expiry", round, func() { waitLeases(0) })
		r, err = c.Receive(ctx, &pb.ReceiveRequest{Queue: queue})
		check(err, "receive the expired message again")
		if len(r.GetMessages()) != 1 {
			check(fmt.Errorf("%d messages", len(r.GetMessages())), "receive the expired message again")
		}
	}
	return report(hits)
}

// report lists, per call, the files every round hit, with the number of
// statements hit in every round (and with -v the lines of their blocks),
// then those only some rounds hit (background work that landed in the
// window). It returns an error naming each call and feature file (see
// featureFiles) that every round of the call hit, and each call over its
// bound of files (maxFiles).
func report(hits map[string][]map[string]map[string]int) error {
	var b strings.Builder
	var crossed []string
	for _, call := range calls {
		rounds := hits[call]
		every := map[string]map[string]int{} // file -> blocks hit in every round
		some := map[string]bool{}
		for f, blocks := range rounds[0] {
			every[f] = maps.Clone(blocks)
		}
		for _, r := range rounds {
			for f := range r {
				some[f] = true
			}
			for f, blocks := range every {
				if _, ok := r[f]; !ok {
					delete(every, f)
					continue
				}
				for blk := range blocks {
					if _, ok := r[f][blk]; !ok {
						delete(blocks, blk)
					}
				}
			}
		}
		files := slices.Sorted(maps.Keys(every))
		for _, f := range files {
			if slices.Contains(featureFiles, f) {
				crossed = append(crossed, call+" runs "+f)
			}
		}
		if max, ok := maxFiles[call]; ok && len(files) > max {
			crossed = append(crossed, fmt.Sprintf("%s crosses %d files, more than %d", call, len(files), max))
		}
		fmt.Fprintf(&b, "%s: %d files (%d broker/, %d zkqueue/, %d other); statements hit in every round:\n",
			call, len(files), count(files, "broker/"), count(files, "zkqueue/"),
			len(files)-count(files, "broker/")-count(files, "zkqueue/"))
		for _, f := range files {
			n := 0
			for _, stmts := range every[f] {
				n += stmts
			}
			fmt.Fprintf(&b, "  %-32s %4d\n", f, n)
			if *verbose {
				lines := slices.SortedFunc(maps.Keys(every[f]), func(x, y string) int { return cmp.Compare(startLine(x), startLine(y)) })
				fmt.Fprintf(&b, "      lines %s\n", strings.Join(lines, " "))
			}
		}
		var bg []string
		for f := range some {
			if _, ok := every[f]; !ok {
				bg = append(bg, f)
			}
		}
		slices.Sort(bg)
		if len(bg) > 0 {
			fmt.Fprintf(&b, "  background (hit in some rounds only): %s\n", strings.Join(bg, " "))
		}
	}
	if _, err := fmt.Print(b.String()); err != nil {
		return err
	}
	if crossed != nil {
		return fmt.Errorf("a plain call runs an optional feature's code or crosses too many files: %s", strings.Join(crossed, "; "))
	}
	return nil
}

// startLine is the first line of a block "l.c,l.c".
func startLine(blk string) int {
	n, _ := strconv.Atoi(blk[:strings.IndexByte(blk, '.')])
	return n
}

// filesHit runs go tool covdata textfmt on dir and returns the
// hand-written files with statements hit, by path in the module, with the
// blocks hit ("line.col,line.col") and their number of statements.
func filesHit(dir string) map[string]map[string]int {
	out := filepath.Join(dir, "cover.txt")
	cmd := exec.Command("go", "tool", "covdata", "textfmt", "-i", dir, "-o", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		check(fmt.Errorf("%w: %s", err, msg), "go tool covdata")
	}
	f, err := os.Open(out)
	check(err, "coverage profile")
	defer f.Close()
	hit := map[string]map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// file.go:l.c,l.c statements count
		line := sc.Text()
		if strings.HasPrefix(line, "mode:") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 || fields[2] == "0" {
			continue
		}
		file, blk, _ := strings.Cut(fields[0], ":")
		file = strings.TrimPrefix(file, module)
		if strings.HasSuffix(file, ".pb.go") || strings.HasSuffix(file, "_test.go") || strings.HasPrefix(file, "internal/pathfiles/") {
			continue
		}
		n, err := strconv.Atoi(fields[1])
		check(err, "coverage profile: "+line)
		if hit[file] == nil {
			hit[file] = map[string]int{}
		}
		hit[file][blk] = n
	}
	check(sc.Err(), "coverage profile")
	return hit
}

func count(files []string, prefix string) int {
	n := 0
	for _, f := range files {
		if strings.HasPrefix(f, prefix) {
			n++
		}
	}
	return n
}

type discard struct{}

func (discard) Printf(string, ...any) {}
