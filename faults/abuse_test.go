package faults_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/faults"
)

// One broker is abused while a legitimate producer and consumer keep
// working through it: bad names, edited ack tokens, oversized input and
// garbage on its gRPC port (every run); a reply larger than the client's
// limit, a flood of Consume streams that never subscribe and a flood of
// connections that never speak (full run). After each, the broker must
// still run and a new client must get a message through within a
// generous deadline; bad input must get a clear status and change
// nothing; the legitimate traffic must lose nothing.
//
// The broker runs with a descriptor limit of 1024, so that the
// connection flood is bounded, and a 5s sweep interval, so that an
// expired lease stays in place long enough to try acking it with an
// edited token.
func TestAbuse(t *testing.T) {
	s := newScenario(t, "abuse", clusterOptions{brokers: 1, sweep: 5 * time.Second, nofile: 1024})
	s.load(qbroker.AtLeastOnce, loadOptions{producers: 1, streams: []int{0}, receivers: 1})
	p := s.c.brokers[0]
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	a := &abuse{t: t, s: s, p: p, rpc: pb.NewQueueClient(conn)}
	for _, q := range []string{"abuse-probe", "abuse-tokens", "abuse-big"} {
		if _, err := s.admin.CreateQueue(s.ctx, q, qbroker.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.progress(50, time.Minute, "warm-up")
	a.run("bad names", a.badNames)
	a.run("edited ack tokens", a.editedTokens)
	a.run("forged lease deadline", a.forgedDeadline)
	a.run("oversized input", a.oversized)
	a.run("garbage on the gRPC port", a.garbage)
	if *fullRun {
		a.run("reply over the client's limit", a.largeReceive)
		a.run("Consume streams that never subscribe", a.streamFlood)
		a.run("connections that never speak", a.halfOpen)
	}
	s.progress(50, time.Minute, "after the abuse")
	s.finish()
}

type abuse struct {
	t        *testing.T
	s        *scenario
	p        *brokerProc
	rpc      pb.QueueClient
	probeSeq int
	keySeq   int
}

// run runs one abuse check as a subtest; a failure also fails the
// scenario's row. Every check ends by making sure the broker still runs.
func (a *abuse) run(name string, check func(t *testing.T) error) {
	a.t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
		err := check(t)
		if err == nil && !a.p.alive() {
			err = fmt.Errorf("the broker exited:\n%s", a.p.logTail())
		}
		if err != nil {
			t.Error(err)
			a.s.fail("abuse %q: %v", name, err)
		}
	})
}

func (a *abuse) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(a.s.ctx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantCode checks that err carries one of the codes.
func wantCode(what string, err error, want ...codes.Code) error {
	if got := faults.Code(err); !slices.Contains(want, got) {
		return fmt.Errorf("%s: got %v (%v), want %v", what, got, err, want)
	}
	return nil
}

var badNames = []string{
	"", ".", "..", "a/b", "../escape", "/abs", "x\x00y", strings.Repeat("n", 201), "é", "a b",
	"q\n", "%2e%2e", "queue~1", "*",
}

// Bad queue names and member ids are refused with InvalidArgument by
// every call, and nothing appears in ZooKeeper.
func (a *abuse) badNames(t *testing.T) error {
	ctx := a.ctx(t)
	before := a.tree(t)
	if _, err := a.s.admin.CreateQueue(ctx, "abuse-sync", qbroker.QueueOptions{Kind: qbroker.KindSync, SyncMembers: 2}); err != nil {
		return err
	}
	var errs []string
	check := func(what string, err error) {
		if e := wantCode(what, err, codes.InvalidArgument); e != nil {
			errs = append(errs, e.Error())
		}
	}
	one := []*pb.OutMessage{{Payload: []byte("x")}}
	for _, n := range badNames {
		q := fmt.Sprintf("%q", n)
		_, err := a.rpc.CreateQueue(ctx, &pb.CreateQueueRequest{Name: n})
		check("CreateQueue "+q, err)
		_, err = a.rpc.GetQueue(ctx, &pb.GetQueueRequest{Name: n})
		check("GetQueue "+q, err)
		_, err = a.rpc.Stats(ctx, &pb.StatsRequest{Name: n})
		check("Stats "+q, err)
		_, err = a.rpc.Purge(ctx, &pb.PurgeRequest{Name: n})
		check("Purge "+q, err)
		_, err = a.rpc.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: n})
		check("DeleteQueue "+q, err)
		_, err = a.rpc.Publish(ctx, &pb.PublishRequest{Queue: n, Messages: one})
		check("Publish "+q, err)
		_, err = a.rpc.Receive(ctx, &pb.ReceiveRequest{Queue: n})
		check("Receive "+q, err)
		_, err = a.rpc.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{Queue: n})
		check("ListDeadLetters "+q, err)
		_, err = a.rpc.Redrive(ctx, &pb.RedriveRequest{Queue: n})
		check("Redrive "+q, err)
		check("Consume "+q, a.consumeErr(ctx, n))
		check("JoinSync queue "+q, a.joinErr(ctx, n, "m1"))
		check("JoinSync member "+q, a.joinErr(ctx, "abuse-sync", n))
	}
	after := a.tree(t)
	if added := slices.DeleteFunc(after, func(p string) bool { return slices.Contains(before, p) }); !slices.Equal(added, []string{a.s.c.root + "/queues/abuse-sync"}) {
		errs = append(errs, fmt.Sprintf("ZooKeeper nodes added by bad names: %v", added))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d wrong answers:\n%s", len(errs), strings.Join(errs, "\n"))
	}
	return nil
}

// tree lists ZooKeeper's top-level nodes and the scenario's queues.
func (a *abuse) tree(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"/", a.s.c.root, a.s.c.root + "/queues"} {
		children, _, err := a.s.zk.Children(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range children {
			out = append(out, strings.TrimSuffix(dir, "/")+"/"+c)
		}
	}
	slices.Sort(out)
	return out
}

// consumeErr opens a Consume stream on queue and returns how it ended.
func (a *abuse) consumeErr(ctx context.Context, queue string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := a.rpc.Consume(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue}}); err != nil {
		_, err = st.Recv()
		return err
	}
	_, err = st.Recv()
	return err
}

// joinErr joins a synchronizing queue and returns how the stream ended.
func (a *abuse) joinErr(ctx context.Context, queue, member string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := a.rpc.JoinSync(ctx, &pb.JoinSyncRequest{Queue: queue, MemberId: member})
	if err != nil {
		return err
	}
	for {
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
}

// publishKeys publishes n tracked messages to queue and returns their keys.
func (a *abuse) publishKeys(ctx context.Context, queue string, n, size int) ([]faults.Key, error) {
	var keys []faults.Key
	for range n {
		a.keySeq++
		k := faults.Key{Producer: 1000, Seq: a.keySeq}
		if _, err := a.s.admin.Publish(ctx, queue, faults.Payload(k, size)); err != nil {
			return keys, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// collect receives from queue until every key in keys arrived (acking
// at-least-once deliveries), or within passes; it returns the missing.
func (a *abuse) collect(ctx context.Context, cl *qbroker.Client, queue string, keys []faults.Key, mode qbroker.DeliveryMode, within time.Duration) ([]faults.Key, error) {
	missing := slices.Clone(keys)
	var lastErr error
	deadline := time.Now().Add(within)
	for len(missing) > 0 && time.Now().Before(deadline) {
		ms, err := cl.Receive(ctx, queue, qbroker.ReceiveOptions{Max: 10, Wait: time.Second, Mode: mode})
		if err != nil {
			lastErr = err
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for _, m := range ms {
			k, err := faults.ParsePayload(m.Payload)
			if err != nil {
				return missing, fmt.Errorf("%s: corrupt payload: %v", m.ID, err)
			}
			missing = slices.DeleteFunc(missing, func(x faults.Key) bool { return x == k })
			if mode == qbroker.AtLeastOnce {
				if err := m.Ack(ctx); err != nil {
					lastErr = err
				}
			}
		}
	}
	return missing, lastErr
}

// tokenEdits returns edited forms of a genuine ack token: other lease
// nonces, another queue, extra or malformed parts.
func tokenEdits(tok, otherQueue string) []string {
	parts := strings.Split(tok, "/")
	edits := []string{"", "x", tok + "/x", "../" + tok, strings.Repeat("a", 10_000), "abuse-tokens/../../zookeeper"}
	if len(parts) >= 2 {
		lease := parts[1]
		flipped := lease[:len(lease)-1] + string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", lease[len(lease)-1])+1)%16])
		edits = append(edits,
			strings.Join(append([]string{parts[0], flipped}, parts[2:]...), "/"),
			strings.Join(append([]string{otherQueue}, parts[1:]...), "/"),
			strings.Join(append([]string{"abuse-no-such-queue"}, parts[1:]...), "/"),
			parts[0]+"/"+lease+"/not-a-hint",
			parts[0]+"/../"+lease,
		)
	}
	return edits
}

// Edited ack tokens are refused by Ack, Nack and ExtendLease, and leave
// the genuine lease in place: afterwards the genuine token acks it.
func (a *abuse) editedTokens(t *testing.T) error {
	ctx := a.ctx(t)
	keys, err := a.publishKeys(ctx, "abuse-tokens", 1, 100)
	if err != nil {
		return err
	}
	resp, err := a.rpc.Receive(ctx, &pb.ReceiveRequest{Queue: "abuse-tokens", Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE,
		Wait: durationpb.New(10 * time.Second), VisibilityTimeout: durationpb.New(time.Minute)})
	if err != nil || len(resp.GetMessages()) != 1 {
		return fmt.Errorf("receive the message: %d messages, %v", len(resp.GetMessages()), err)
	}
	tok := resp.GetMessages()[0].GetAckToken()
	var errs []string
	for _, e := range tokenEdits(tok, a.s.loads[0].queue) {
		accepted := []codes.Code{codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition}
		_, err := a.rpc.Ack(ctx, &pb.AckRequest{AckToken: e})
		if err := wantCode(fmt.Sprintf("Ack %.60q", e), err, accepted...); err != nil {
			errs = append(errs, err.Error())
		}
		_, err = a.rpc.Nack(ctx, &pb.NackRequest{AckToken: e})
		if err := wantCode(fmt.Sprintf("Nack %.60q", e), err, accepted...); err != nil {
			errs = append(errs, err.Error())
		}
		_, err = a.rpc.ExtendLease(ctx, &pb.ExtendLeaseRequest{AckToken: e})
		if err := wantCode(fmt.Sprintf("ExtendLease %.60q", e), err, accepted...); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if st, err := a.s.admin.Stats(ctx, "abuse-tokens"); err != nil || st.InFlight != 1 {
		errs = append(errs, fmt.Sprintf("after the edited tokens: %d in flight (err %v), want the 1 genuine lease", st.InFlight, err))
	}
	if _, err := a.rpc.Ack(ctx, &pb.AckRequest{AckToken: tok}); err != nil {
		errs = append(errs, fmt.Sprintf("genuine ack of %v after the edited ones: %v", keys[0], err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

// hintRE finds the deadline hint of a token: <queue>/<lease>/<ms>...
var hintRE = regexp.MustCompile(`^([^/]+/[^/]+/)([0-9]+)(.*)$`)

// An ack token whose deadline was edited into the future must not ack a
// lease that expired: the ack fails and the message comes back. Two
// rounds of three messages, each forged just after its lease expired
// (the sweep runs every 5s here, so the expired lease is usually still
// in place).
func (a *abuse) forgedDeadline(t *testing.T) error {
	ctx := a.ctx(t)
	const vis = 500 * time.Millisecond
	for round := range 2 {
		keys, err := a.publishKeys(ctx, "abuse-tokens", 3, 100)
		if err != nil {
			return err
		}
		var toks []string
		var last time.Time
		for len(toks) < len(keys) {
			resp, err := a.rpc.Receive(ctx, &pb.ReceiveRequest{Queue: "abuse-tokens", Mode: pb.DeliveryMode_DELIVERY_MODE_AT_LEAST_ONCE,
				MaxMessages: 3, Wait: durationpb.New(10 * time.Second), VisibilityTimeout: durationpb.New(vis)})
			if err != nil {
				return fmt.Errorf("round %d: receive: %v", round+1, err)
			}
			for _, m := range resp.GetMessages() {
				toks = append(toks, m.GetAckToken())
				if d := m.GetLeaseDeadline().AsTime(); d.After(last) {
					last = d
				}
			}
		}
		waitFor(time.Minute, func() bool { return time.Since(last) > 300*time.Millisecond })
		future := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
		for _, tok := range toks {
			forged := tok + "0"
			if m := hintRE.FindStringSubmatch(tok); m != nil {
				forged = m[1] + future + m[3]
			}
			_, err := a.rpc.Ack(ctx, &pb.AckRequest{AckToken: forged})
			if err == nil {
				return fmt.Errorf("round %d: an ack token with its deadline moved an hour ahead acked a lease that had expired", round+1)
			}
			if err := wantCode("forged ack", err, codes.InvalidArgument, codes.FailedPrecondition, codes.NotFound); err != nil {
				return err
			}
		}
		missing, err := a.collect(ctx, a.s.admin, "abuse-tokens", keys, qbroker.AtLeastOnce, 60*time.Second)
		if len(missing) > 0 {
			return fmt.Errorf("round %d: %v never came back after the forged acks (last error %v)", round+1, missing, err)
		}
	}
	return nil
}

// Payloads and batches over the limits are refused with a clear status
// and store nothing.
func (a *abuse) oversized(t *testing.T) error {
	ctx := a.ctx(t)
	big := func(n int) []byte { return make([]byte, n) }
	var errs []string
	for _, c := range []struct {
		what string
		msgs []*pb.OutMessage
	}{
		{"payload of 512 KiB + 1", []*pb.OutMessage{{Payload: big(512<<10 + 1)}}},
		{"payload of 2 MiB", []*pb.OutMessage{{Payload: big(2 << 20)}}},
		{"batch of 1,001 messages", slices.Repeat([]*pb.OutMessage{{Payload: []byte("x")}}, 1001)},
		{"batch of 2 x 500 KiB", []*pb.OutMessage{{Payload: big(500 << 10)}, {Payload: big(500 << 10)}}},
		{"empty batch", nil},
	} {
		_, err := a.rpc.Publish(ctx, &pb.PublishRequest{Queue: "abuse-big", Messages: c.msgs})
		if err := wantCode(c.what, err, codes.InvalidArgument, codes.ResourceExhausted); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if st, err := a.s.admin.Stats(ctx, "abuse-big"); err != nil || st.Ready != 0 {
		errs = append(errs, fmt.Sprintf("refused publishes stored %d messages (err %v)", st.Ready, err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

// Bytes that are not HTTP/2 make the broker close the connection; then a
// new client still gets through.
func (a *abuse) garbage(t *testing.T) error {
	for _, g := range garbage {
		if err := sendGarbage(a.p.addr, g.data, 30*time.Second); err != nil {
			return fmt.Errorf("%s: %v", g.name, err)
		}
	}
	return a.probe(60 * time.Second)
}

// At most once, 20 messages of 480 KiB taken with one Receive of up to
// 20 by a client with default options: the reply cannot exceed what the
// client accepts, and no message may be lost on the way.
func (a *abuse) largeReceive(t *testing.T) error {
	ctx := a.ctx(t)
	keys, err := a.publishKeys(ctx, "abuse-big", 20, 480<<10)
	if err != nil {
		return err
	}
	cl, err := qbroker.Dial(ctx, a.p.addr)
	if err != nil {
		return err
	}
	defer cl.Close()
	var missing []faults.Key
	var lastErr error
	deadline := time.Now().Add(time.Minute)
	missing = slices.Clone(keys)
	for len(missing) > 0 && time.Now().Before(deadline) {
		ms, err := cl.Receive(ctx, "abuse-big", qbroker.ReceiveOptions{Max: 20, Wait: time.Second})
		if err != nil {
			lastErr = err
			if st, serr := a.s.admin.Stats(ctx, "abuse-big"); serr == nil && st.Ready == 0 {
				break // nothing left to receive
			}
			continue
		}
		for _, m := range ms {
			k, _ := faults.ParsePayload(m.Payload)
			missing = slices.DeleteFunc(missing, func(x faults.Key) bool { return x == k })
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%d of 20 messages lost (last Receive error: %v)", len(missing), lastErr)
	}
	return nil
}

// 11,000 Consume streams that never send their subscribe message, over 11
// connections that stay up: a new client must still consume.
func (a *abuse) streamFlood(t *testing.T) error {
	const conns, per = 11, 1000
	startedConsume := func() int {
		return int(metricSum(a.p.metrics, "grpc_server_started_total", `grpc_method="Consume"`))
	}
	before := startedConsume()
	f, err := floodStreams(a.p.addr, conns, per)
	if err != nil {
		return fmt.Errorf("open the flood: %v", err)
	}
	a.s.mark(faults.Fault, fmt.Sprintf("%d Consume streams that never subscribe", conns*per))
	// Probe once the broker has taken in every stream: started a handler
	// for it, or refused it.
	if !waitFor(time.Minute, func() bool { return startedConsume()-before+int(f.refused.Load()) >= conns*per }) {
		t.Logf("the broker had not taken in the whole flood after a minute")
	}
	t.Logf("flood: %d streams sent; broker started %d handlers; refused or ended: %v", conns*per, startedConsume()-before, f.why())
	err = a.probe(60 * time.Second)
	t.Logf("flood after the probe: %v", f.why())
	f.release()
	a.s.mark(faults.Heal, "stream flood released")
	if err != nil {
		return fmt.Errorf("with the flood held: %v", err)
	}
	return a.probe(60 * time.Second)
}

// 1,100 TCP connections that never send a byte, more than the broker's
// descriptors: a new client must still get through.
func (a *abuse) halfOpen(t *testing.T) error {
	h, err := floodHalfOpen(a.p.addr, 1100)
	if err != nil {
		return fmt.Errorf("open the flood: %v", err)
	}
	a.s.mark(faults.Fault, fmt.Sprintf("%d connections that never speak", len(h.conns)))
	err = a.probe(60 * time.Second)
	t.Logf("flood: %d connections held; broker has %d descriptors open (limit 1024)", len(h.conns), openFDs(a.p))
	h.release()
	a.s.mark(faults.Heal, "connection flood released")
	if err != nil {
		return fmt.Errorf("with the flood held: %v", err)
	}
	return a.probe(60 * time.Second)
}

// probe checks that a new client (a new connection and a new Consume
// stream) gets a message through the broker within the deadline. A
// stream the broker refuses is tried again, with a fresh message, until
// the deadline.
func (a *abuse) probe(within time.Duration) error {
	ctx, cancel := context.WithTimeout(a.s.ctx, within)
	defer cancel()
	a.probeSeq++
	prefix := fmt.Sprintf("probe-%d-", a.probeSeq)
	cl, err := qbroker.Dial(ctx, a.p.addr, qbroker.WithCallTimeout(callTimeout))
	if err != nil {
		return err
	}
	defer cl.Close()
	var last error
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			sleep(ctx, 500*time.Millisecond)
		}
		cons, err := cl.Consume(ctx, "abuse-probe", qbroker.ConsumeOptions{})
		if err != nil {
			last = fmt.Errorf("open a Consume stream: %v", err)
			continue
		}
		if _, err := cl.Publish(ctx, "abuse-probe", []byte(fmt.Sprint(prefix, attempt))); err != nil {
			last = fmt.Errorf("publish: %v", err)
			_ = cons.Close()
			continue
		}
		for {
			m, err := cons.Next(ctx)
			if err != nil {
				last = fmt.Errorf("consume: %v", err)
				break
			}
			if strings.HasPrefix(string(m.Payload), prefix) {
				_ = cons.Close()
				return nil
			}
		}
		_ = cons.Close()
	}
	return fmt.Errorf("a new client got no message through within %v: %v", within, last)
}

// metricSum adds up the samples of a Prometheus metric whose labels
// contain match; 0 when /metrics cannot be read.
func metricSum(addr, name, match string) float64 {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, match) {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// openFDs counts a process's open descriptors; -1 when unknown.
func openFDs(p *brokerProc) int {
	cmd, _ := p.proc()
	if cmd == nil {
		return -1
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
	if err != nil {
		return -1
	}
	return len(ents)
}
