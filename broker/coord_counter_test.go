package broker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/internal/natsbridge"
	"github.com/qbroker/qbroker/internal/zktest"
)

// 16 clients, eight on each of two brokers, add 1 a thousand times each
// to one counter: every Add returned a distinct value, 1 to 16,000, and
// both brokers read 16,000.
func TestCounterAddsOverTwoBrokers(t *testing.T) {
	const clients, adds = 16, 1000
	root := zktest.Root(t)
	reg := prometheus.NewRegistry()
	brokers := []*testBroker{newBroker(t, root, func(c *broker.Config) { c.Registerer = reg }), newBroker(t, root)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var mu sync.Mutex
	seen := make(map[int64]bool, clients*adds)
	errs := make(chan error, clients)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range clients {
		c := pb.NewCounterClient(brokers[i%2].grpcConn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range adds {
				r, err := c.Add(ctx, &pb.CounterAddRequest{Name: "hits", Delta: 1})
				if err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				mu.Lock()
				dup := seen[r.GetValue()]
				seen[r.GetValue()] = true
				mu.Unlock()
				if dup {
					errs <- fmt.Errorf("client %d: value %d returned twice", i, r.GetValue())
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
	t.Logf("%d Adds by %d clients over 2 brokers in %v; broker 1 wrote %v times, %v conflicts", clients*adds, clients,
		time.Since(start).Round(time.Millisecond), counterSum(t, reg, "qbroker_counter_writes_total"),
		counterSum(t, reg, "qbroker_counter_conflicts_total"))
	if len(seen) != clients*adds {
		t.Fatalf("%d distinct values, want %d", len(seen), clients*adds)
	}
	for _, b := range brokers {
		r, err := pb.NewCounterClient(b.grpcConn).Get(ctx, &pb.CounterGetRequest{Name: "hits"})
		if err != nil || r.GetValue() != clients*adds {
			t.Fatalf("Get: got %v, %v; want %d", r, err, clients*adds)
		}
	}
	if got := counterSum(t, reg, "qbroker_counter_operations_total"); got < clients*adds/2 {
		t.Errorf("qbroker_counter_operations_total = %v, want at least %d", got, clients*adds/2)
	}
}

// A broker process is killed (SIGKILL) while clients add through it and
// through another broker: every acknowledged Add is counted once, the
// Adds that were on their way through the dead broker are counted at
// most once each, and the survivor goes on without a pause (a counter
// holds no session's state).
func TestCounterSurvivesKilledBroker(t *testing.T) {
	root := zktest.Root(t)
	survivor := newBroker(t, root)
	cmd, conn := startQbrokerProcess(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var acked, unknown, afterKill atomic.Int64
	var killed atomic.Bool
	var mu sync.Mutex
	values := map[int64]bool{}
	errs := make(chan error, 8)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		c := pb.NewCounterClient(survivor.grpcConn)
		if i%2 == 0 {
			c = pb.NewCounterClient(conn)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := c.Add(ctx, &pb.CounterAddRequest{Name: "n", Delta: 1})
				if err != nil {
					if i%2 == 0 && status.Code(err) == codes.Unavailable {
						unknown.Add(1) // the victim: its Add may or may not have applied
						return
					}
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				acked.Add(1)
				if killed.Load() && i%2 == 1 {
					afterKill.Add(1)
				}
				mu.Lock()
				dup := values[r.GetValue()]
				values[r.GetValue()] = true
				mu.Unlock()
				if dup {
					errs <- fmt.Errorf("client %d: value %d acknowledged twice", i, r.GetValue())
					return
				}
			}
		}()
	}
	zktest.WaitFor(t, time.Minute, "300 acknowledged Adds", func() bool { return acked.Load() >= 300 })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed.Store(true)
	zktest.WaitFor(t, time.Minute, "200 Adds through the survivor after the kill", func() bool { return afterKill.Load() >= 200 })
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	r, err := pb.NewCounterClient(survivor.grpcConn).Get(ctx, &pb.CounterGetRequest{Name: "n"})
	if err != nil {
		t.Fatal(err)
	}
	a, u := acked.Load(), unknown.Load()
	t.Logf("%d Adds acknowledged, %d unknown (on their way through the killed broker), counter %d", a, u, r.GetValue())
	if r.GetValue() < a || r.GetValue() > a+u {
		t.Fatalf("counter %d after %d acknowledged and %d unknown Adds: want %d to %d", r.GetValue(), a, u, a, a+u)
	}
}

// Bad names get InvalidArgument naming the counter name, an Add past the
// int64 range one naming the delta; neither changes anything.
func TestCounterBadInput(t *testing.T) {
	root := zktest.Root(t)
	tb := newBroker(t, root)
	c := pb.NewCounterClient(tb.grpcConn)
	ctx := callCtx(t)
	for _, name := range []string{"", "..", "a/b", strings.Repeat("x", 201)} {
		calls := map[string]error{}
		_, calls["Get"] = c.Get(ctx, &pb.CounterGetRequest{Name: name})
		_, calls["Add"] = c.Add(ctx, &pb.CounterAddRequest{Name: name, Delta: 1})
		_, calls["CompareAndSet"] = c.CompareAndSet(ctx, &pb.CounterCompareAndSetRequest{Name: name, NewValue: 1})
		_, calls["Set"] = c.Set(ctx, &pb.CounterSetRequest{Name: name, Value: 1})
		for call, err := range calls {
			wantCode(t, fmt.Sprintf("%s(%q)", call, name), err, codes.InvalidArgument)
			if !strings.Contains(status.Convert(err).Message(), "counter name") {
				t.Errorf("%s(%q): %v does not name the counter name", call, name, err)
			}
		}
	}
	if _, err := c.Set(ctx, &pb.CounterSetRequest{Name: "big", Value: math.MaxInt64 - 1}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Add(ctx, &pb.CounterAddRequest{Name: "big", Delta: 2})
	wantCode(t, "Add past MaxInt64", err, codes.InvalidArgument)
	if !strings.Contains(status.Convert(err).Message(), "delta 2") {
		t.Errorf("Add past MaxInt64: %v does not name the delta", err)
	}
	if r, err := c.Get(ctx, &pb.CounterGetRequest{Name: "big"}); err != nil || r.GetValue() != math.MaxInt64-1 {
		t.Fatalf("after the refused Add: got %v, %v; want %d", r, err, int64(math.MaxInt64-1))
	}
	if r, err := c.Get(ctx, &pb.CounterGetRequest{Name: "never"}); err != nil || r.GetValue() != 0 {
		t.Fatalf("Get of a counter never written: got %v, %v; want 0", r, err)
	}
	kids, _, err := zktest.Conn(t).Children(root + "/counters")
	if err != nil || len(kids) != 1 || kids[0] != "big" {
		t.Fatalf("counters after bad input: %v, %v; want only big", kids, err)
	}
}

// CompareAndSet and Set answer as documented, and each write is a
// counter_changed event on NATS with the value after it; a CompareAndSet
// that fails writes nothing and sends none.
func TestCounterCompareAndSetAndEvents(t *testing.T) {
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(ns.Shutdown)
	bridge, err := natsbridge.New(natsbridge.Config{URL: ns.ClientURL(), BrokerID: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bridge.Close(context.Background()) })
	got := subscribeEvents(t, ns.ClientURL())
	tb := newBroker(t, zktest.Root(t), func(c *broker.Config) { c.Events = bridge; c.ID = "b1" })
	c := pb.NewCounterClient(tb.grpcConn)
	ctx := callCtx(t)

	if r, err := c.Add(ctx, &pb.CounterAddRequest{Name: "seq.a", Delta: 5}); err != nil || r.GetValue() != 5 {
		t.Fatalf("Add 5: got %v, %v", r, err)
	}
	if r, err := c.CompareAndSet(ctx, &pb.CounterCompareAndSetRequest{Name: "seq.a", OldValue: 4, NewValue: 9}); err != nil || r.GetSwapped() {
		t.Fatalf("CompareAndSet(4, 9) on 5: got %v, %v; want not swapped", r, err)
	}
	if r, err := c.CompareAndSet(ctx, &pb.CounterCompareAndSetRequest{Name: "seq.a", OldValue: 5, NewValue: 9}); err != nil || !r.GetSwapped() {
		t.Fatalf("CompareAndSet(5, 9) on 5: got %v, %v; want swapped", r, err)
	}
	if r, err := c.Set(ctx, &pb.CounterSetRequest{Name: "seq.a", Value: -3}); err != nil || r.GetValue() != 9 {
		t.Fatalf("Set(-3) on 9: got %v, %v; want the old value 9", r, err)
	}
	ids := map[string]bool{}
	var values []int64
	for len(values) < 3 {
		select {
		case m := <-got:
			var e events.Event
			if err := json.Unmarshal(m.Data, &e); err != nil {
				t.Fatal(err)
			}
			if m.Subject != "qbroker.counter.seq~a.counter_changed" || e.Kind != events.CounterChanged || e.Counter != "seq.a" ||
				e.Broker != "b1" || e.ID == "" || ids[e.ID] {
				t.Fatalf("event on %s: %+v", m.Subject, e)
			}
			ids[e.ID] = true
			values = append(values, e.Value)
		case <-time.After(10 * time.Second):
			t.Fatalf("counter events: got values %v, want 3", values)
		}
	}
	if fmt.Sprint(values) != "[5 9 -3]" {
		t.Fatalf("event values %v, want [5 9 -3]", values)
	}
	select {
	case m := <-got:
		t.Fatalf("a fourth event: %s %s", m.Subject, m.Data)
	case <-time.After(200 * time.Millisecond):
	}
}

const counterRules = `# identity  actions       patterns
admin       all           *
writer      counter       hits
reader      counter.read  hits
`

// counter lets Get and the changes; counter.read only Get; neither
// reaches another name. Set and refusals are in the audit log.
func TestCounterPermissions(t *testing.T) {
	e := newAuthBroker(t, counterRules, []string{"admin", "writer", "reader"})
	ctx := callCtx(t)
	writer, reader := pb.NewCounterClient(e.conn(t, "writer")), pb.NewCounterClient(e.conn(t, "reader"))
	if _, err := writer.Add(ctx, &pb.CounterAddRequest{Name: "hits", Delta: 2}); err != nil {
		t.Fatalf("writer's Add: %v", err)
	}
	if _, err := writer.CompareAndSet(ctx, &pb.CounterCompareAndSetRequest{Name: "hits", OldValue: 2, NewValue: 3}); err != nil {
		t.Fatalf("writer's CompareAndSet: %v", err)
	}
	if _, err := writer.Set(ctx, &pb.CounterSetRequest{Name: "hits", Value: 4}); err != nil {
		t.Fatalf("writer's Set: %v", err)
	}
	if r, err := reader.Get(ctx, &pb.CounterGetRequest{Name: "hits"}); err != nil || r.GetValue() != 4 {
		t.Fatalf("reader's Get: got %v, %v; want 4", r, err)
	}
	_, err := reader.Add(ctx, &pb.CounterAddRequest{Name: "hits", Delta: 1})
	mustCode(t, "reader's Add", err, codes.PermissionDenied)
	_, err = reader.CompareAndSet(ctx, &pb.CounterCompareAndSetRequest{Name: "hits", OldValue: 4, NewValue: 0})
	mustCode(t, "reader's CompareAndSet", err, codes.PermissionDenied)
	_, err = reader.Set(ctx, &pb.CounterSetRequest{Name: "hits", Value: 0})
	mustCode(t, "reader's Set", err, codes.PermissionDenied)
	_, err = writer.Get(ctx, &pb.CounterGetRequest{Name: "other"})
	mustCode(t, "writer's Get of another counter", err, codes.PermissionDenied)
	_, err = writer.Add(ctx, &pb.CounterAddRequest{Name: "other", Delta: 1})
	mustCode(t, "writer's Add to another counter", err, codes.PermissionDenied)
	if r, err := pb.NewCounterClient(e.conn(t, "admin")).Get(ctx, &pb.CounterGetRequest{Name: "hits"}); err != nil || r.GetValue() != 4 {
		t.Fatalf("after the refusals: got %v, %v; want 4 unchanged", r, err)
	}
	e.wantAudit(t,
		`msg=audit .*action=set counter=hits .*grpc_code=OK identity=writer via=token`,
		`msg=audit .*action=counter counter=hits .*grpc_code=PermissionDenied identity=reader via=token`,
		`msg=audit .*action=counter.read counter=other .*grpc_code=PermissionDenied identity=writer via=token`,
	)
}
