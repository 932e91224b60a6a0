package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/internal/natsbridge"
	"github.com/qbroker/qbroker/internal/zktest"
)

// acquireReq opens an Acquire stream on c and sends its first request.
func acquireReq(ctx context.Context, c pb.SemaphoreClient, req *pb.SemaphoreAcquireRequest) (pb.Semaphore_AcquireClient, error) {
	s, err := c.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(req); err != nil {
		return nil, err
	}
	return s, nil
}

// acquired opens an Acquire stream for permits of name (limit) and waits
// for its grant.
func acquired(ctx context.Context, c pb.SemaphoreClient, name string, limit, permits int32, value string) (pb.Semaphore_AcquireClient, *pb.SemaphoreEvent, error) {
	s, err := acquireReq(ctx, c, &pb.SemaphoreAcquireRequest{Name: name, Limit: limit, Permits: permits, Value: []byte(value)})
	if err != nil {
		return nil, nil, err
	}
	ev, err := s.Recv()
	if err != nil {
		return nil, nil, err
	}
	if ev.GetType() != pb.SemaphoreEvent_TYPE_GRANTED || ev.GetToken() == 0 || !strings.HasPrefix(ev.GetKey(), "lease-") {
		return nil, nil, fmt.Errorf("first event %v, want GRANTED with key and token", ev)
	}
	return s, ev, nil
}

// releaseStream sends release and waits for the stream to end with OK.
func releaseStream(s pb.Semaphore_AcquireClient) error {
	if err := s.Send(&pb.SemaphoreAcquireRequest{Release: true}); err != nil {
		return err
	}
	if ev, err := s.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("after release: got %v, %v; want the stream's end", ev, err)
	}
	return nil
}

// Twelve clients, six on each of two brokers, take one of three permits
// 15 times each, releasing by message or by ending the stream: never more
// than three hold at once (markers in ZooKeeper), every grant's token is
// new, no node is left behind, and the gauge of permits held returns to 0.
func TestSemaphoreOverGRPC(t *testing.T) {
	const clients, rounds, limit = 12, 15, 3
	root := zktest.Root(t)
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	brokers := []*testBroker{
		newBroker(t, root, func(c *broker.Config) { c.Registerer = regs[0] }),
		newBroker(t, root, func(c *broker.Config) { c.Registerer = regs[1] }),
	}
	zc := zktest.Conn(t)
	check := root + "/check"
	if _, err := zc.Create(check, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var maxMarkers atomic.Int32
	var mu sync.Mutex
	tokens := map[int64]bool{}
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		c := pb.NewSemaphoreClient(brokers[i%2].grpcConn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				if err := holdPermit(ctx, c, zc, check, fmt.Sprintf("%s/c%d-%d", check, i, r), r%2 == 0, &maxMarkers, &mu, tokens); err != nil {
					errs <- fmt.Errorf("client %d round %d: %w", i, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m := maxMarkers.Load(); m > limit {
		t.Fatalf("%d holders at once, want at most %d", m, limit)
	}
	if len(tokens) != clients*rounds {
		t.Fatalf("%d distinct tokens for %d grants", len(tokens), clients*rounds)
	}
	for _, d := range []string{"queue", "leases"} {
		p := root + "/semaphores/pool/" + d
		zktest.WaitFor(t, 30*time.Second, "no node left in "+p, func() bool {
			kids, _, err := zc.Children(p)
			return err == nil && len(kids) == 0
		})
	}
	for i, reg := range regs {
		zktest.WaitFor(t, 10*time.Second, "qbroker_semaphore_permits_held back to 0", func() bool {
			return metric(t, reg, "qbroker_semaphore_permits_held", nil) == 0
		})
		if n := metric(t, reg, "qbroker_semaphore_wait_seconds", nil); n < 1 {
			t.Errorf("broker %d: qbroker_semaphore_wait_seconds counted %v grants", i, n)
		}
	}
}

// holdPermit takes a permit of "pool", creates its marker under check,
// counts the markers, and gives everything back: by a release message or
// by ending the stream.
func holdPermit(ctx context.Context, c pb.SemaphoreClient, zc *zk.Conn, check, marker string, byMessage bool,
	maxMarkers *atomic.Int32, mu *sync.Mutex, tokens map[int64]bool) error {
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s, ev, err := acquired(sctx, c, "pool", 3, 1, "")
	if err != nil {
		return err
	}
	mu.Lock()
	dup := tokens[ev.GetToken()]
	tokens[ev.GetToken()] = true
	mu.Unlock()
	if dup {
		return fmt.Errorf("token %d granted twice", ev.GetToken())
	}
	if _, err := zc.Create(marker, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		return fmt.Errorf("marker: %w", err)
	}
	kids, _, err := zc.Children(check)
	if err != nil {
		return err
	}
	for {
		m := maxMarkers.Load()
		if int32(len(kids)) <= m || maxMarkers.CompareAndSwap(m, int32(len(kids))) {
			break
		}
	}
	// The marker goes before the permit: the next holder's marker
	// cannot overlap ours.
	if err := zc.Delete(marker, -1); err != nil {
		return err
	}
	if byMessage {
		return releaseStream(s)
	}
	stop() // the broker releases when it sees the stream end
	return nil
}

// Bad requests are refused with InvalidArgument naming what is wrong,
// and change nothing; a limit other than the semaphore's is
// FailedPrecondition; SetLimit of a semaphore nobody made is NotFound.
func TestSemaphoreBadInput(t *testing.T) {
	root := zktest.Root(t)
	tb := newBroker(t, root)
	c := pb.NewSemaphoreClient(tb.grpcConn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tt := range []struct {
		req  *pb.SemaphoreAcquireRequest
		want string
	}{
		{&pb.SemaphoreAcquireRequest{Name: "", Limit: 2}, "semaphore name"},
		{&pb.SemaphoreAcquireRequest{Name: "a/b", Limit: 2}, "semaphore name"},
		{&pb.SemaphoreAcquireRequest{Name: "..", Limit: 2}, "semaphore name"},
		{&pb.SemaphoreAcquireRequest{Name: "ok", Limit: 0}, "limit 0"},
		{&pb.SemaphoreAcquireRequest{Name: "ok", Limit: -3}, "limit -3"},
		{&pb.SemaphoreAcquireRequest{Name: "ok", Limit: 1<<20 + 1}, "limit 1048577"},
		{&pb.SemaphoreAcquireRequest{Name: "ok", Limit: 2, Permits: -1}, "permits -1"},
		{&pb.SemaphoreAcquireRequest{Name: "ok", Limit: 2, Permits: 3}, "permits 3"},
		{&pb.SemaphoreAcquireRequest{Name: "ok", Limit: 2, Value: make([]byte, 64<<10+1)}, "value"},
		{&pb.SemaphoreAcquireRequest{Name: "ok", Limit: 2, LockDelay: durationpb.New(-time.Second)}, "lock_delay"},
		{&pb.SemaphoreAcquireRequest{Name: "ok", Limit: 2, LockDelay: durationpb.New(time.Minute + time.Millisecond)}, "lock_delay"},
		{&pb.SemaphoreAcquireRequest{Name: "ok", Limit: 2, LockDelay: &durationpb.Duration{Seconds: 1, Nanos: -1}}, "lock_delay"},
	} {
		s, err := acquireReq(ctx, c, tt.req)
		if err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
			t.Errorf("Acquire %+v: got %v, want InvalidArgument naming %q", tt.req, err, tt.want)
		}
	}
	if kids, _, err := zktest.Conn(t).Children(root + "/semaphores"); err == nil && len(kids) > 0 {
		t.Fatalf("bad requests made semaphores: %v", kids)
	}

	s, g, err := acquired(ctx, c, "ok", 2, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	m, err := acquireReq(ctx, c, &pb.SemaphoreAcquireRequest{Name: "ok", Limit: 3})
	if err == nil {
		_, err = m.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "limit 2, not 3") {
		t.Errorf("Acquire with another limit: got %v, want FailedPrecondition naming both limits", err)
	}
	for _, tt := range []struct {
		req  *pb.SemaphoreReleaseRequest
		want string
	}{
		{&pb.SemaphoreReleaseRequest{Name: "ok", Key: g.GetKey()}, "token"},
		{&pb.SemaphoreReleaseRequest{Name: "ok", Key: "../x", Token: 1}, "key"},
		{&pb.SemaphoreReleaseRequest{Name: "ok", Key: "lock-0000000001", Token: 1}, "key"},
		{&pb.SemaphoreReleaseRequest{Name: "ok", Key: "lease-1-zz", Token: 1}, "lease"},
		{&pb.SemaphoreReleaseRequest{Name: "", Key: g.GetKey(), Token: g.GetToken()}, "semaphore name"},
	} {
		_, err := c.Release(ctx, tt.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
			t.Errorf("Release %+v: got %v, want InvalidArgument naming %q", tt.req, err, tt.want)
		}
	}
	_, err = c.Release(ctx, &pb.SemaphoreReleaseRequest{Name: "ok", Key: g.GetKey(), Token: g.GetToken() + 1})
	wantCode(t, "Release with another token", err, codes.FailedPrecondition)
	_, err = c.Revoke(ctx, &pb.SemaphoreRevokeRequest{Name: "ok", Key: "lease-1-0123456789abcdef"})
	wantCode(t, "Revoke of a lease that is not held", err, codes.FailedPrecondition)
	_, err = c.Revoke(ctx, &pb.SemaphoreRevokeRequest{Name: "none"})
	wantCode(t, "Revoke of a semaphore nobody holds", err, codes.FailedPrecondition)
	for _, lim := range []int32{0, -1, 1<<20 + 1} {
		_, err = c.SetLimit(ctx, &pb.SemaphoreSetLimitRequest{Name: "ok", Limit: lim})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "limit") {
			t.Errorf("SetLimit(%d): got %v, want InvalidArgument naming the limit", lim, err)
		}
	}
	_, err = c.SetLimit(ctx, &pb.SemaphoreSetLimitRequest{Name: "none", Limit: 2})
	wantCode(t, "SetLimit of a semaphore nobody made", err, codes.NotFound)
	if err := releaseStream(s); err != nil {
		t.Fatal(err)
	}
}

// Revoke through another broker reaches the holder; SetLimit raises the
// limit and the waiter is granted at once; Release by key from another
// broker ends the holder's lease (LOST, Aborted). NATS carries a
// semaphore_granted and a semaphore_released event per lease.
func TestSemaphoreRevokeSetLimitRelease(t *testing.T) {
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

	root := zktest.Root(t)
	b1, b2 := newBroker(t, root, func(c *broker.Config) { c.Events = bridge; c.ID = "b1" }), newBroker(t, root)
	c1, c2 := pb.NewSemaphoreClient(b1.grpcConn), pb.NewSemaphoreClient(b2.grpcConn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	holder, g, err := acquired(ctx, c1, "db", 1, 1, "worker-1")
	if err != nil {
		t.Fatal(err)
	}
	r, err := c2.Revoke(ctx, &pb.SemaphoreRevokeRequest{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	if hs := r.GetHolders(); len(hs) != 1 || hs[0].GetKey() != g.GetKey() || hs[0].GetToken() != g.GetToken() ||
		string(hs[0].GetValue()) != "worker-1" || hs[0].GetPermits() != 1 {
		t.Fatalf("Revoke returned %v, want %v with value worker-1", hs, g)
	}
	if ev, err := holder.Recv(); err != nil || ev.GetType() != pb.SemaphoreEvent_TYPE_REVOKE_REQUESTED {
		t.Fatalf("holder after Revoke: got %v, %v; want REVOKE_REQUESTED", ev, err)
	}
	waiter, err := acquireReq(ctx, c2, &pb.SemaphoreAcquireRequest{Name: "db", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	zc := zktest.Conn(t)
	zktest.WaitFor(t, 30*time.Second, "the waiter in line", func() bool {
		kids, _, err := zc.Children(root + "/semaphores/db/queue")
		return err == nil && len(kids) == 1
	})
	if _, err := c2.SetLimit(ctx, &pb.SemaphoreSetLimitRequest{Name: "db", Limit: 2}); err != nil {
		t.Fatal(err)
	}
	w, err := waiter.Recv()
	if err != nil || w.GetType() != pb.SemaphoreEvent_TYPE_GRANTED || w.GetToken() <= g.GetToken() {
		t.Fatalf("waiter after SetLimit 2: got %v, %v; want GRANTED with a token above %d", w, err, g.GetToken())
	}
	if _, err := c2.Release(ctx, &pb.SemaphoreReleaseRequest{Name: "db", Key: g.GetKey(), Token: g.GetToken()}); err != nil {
		t.Fatal(err)
	}
	if ev, err := holder.Recv(); err != nil || ev.GetType() != pb.SemaphoreEvent_TYPE_LOST {
		t.Fatalf("holder after Release by key: got %v, %v; want LOST", ev, err)
	}
	_, err = holder.Recv()
	wantCode(t, "the holder's stream after LOST", err, codes.Aborted)
	_, err = c1.Release(ctx, &pb.SemaphoreReleaseRequest{Name: "db", Key: g.GetKey(), Token: g.GetToken()})
	wantCode(t, "Release of a released lease", err, codes.FailedPrecondition)
	if err := releaseStream(waiter); err != nil {
		t.Fatal(err)
	}

	seen := map[events.Kind]events.Event{}
	deadline := time.After(10 * time.Second)
	for len(seen) < 2 {
		select {
		case m := <-got:
			var e events.Event
			if err := json.Unmarshal(m.Data, &e); err != nil {
				t.Fatal(err)
			}
			if m.Subject != "qbroker.semaphore.db."+string(e.Kind) || e.Semaphore != "db" {
				t.Fatalf("event %+v on %s", e, m.Subject)
			}
			seen[e.Kind] = e
		case <-deadline:
			t.Fatalf("semaphore events seen: %v", seen)
		}
	}
	for _, k := range []events.Kind{events.SemaphoreGranted, events.SemaphoreReleased} {
		if e := seen[k]; e.Key != g.GetKey() || e.Token != g.GetToken() || e.Broker != "b1" {
			t.Errorf("%s event %+v, want key %s token %d from b1", k, e, g.GetKey(), g.GetToken())
		}
	}
}

// A broker process holding a client's permit is killed (SIGKILL): its
// client's stream fails with Unavailable, and once the broker's session
// expires the waiter on another broker is granted the permit.
func TestKilledBrokerReleasesPermits(t *testing.T) {
	root := zktest.Root(t)
	survivor := newBroker(t, root)
	cmd, conn := startQbrokerProcess(t, root, "--session-timeout", "4s")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	held, g, err := acquired(ctx, pb.NewSemaphoreClient(conn), "job", 1, 1, "victim")
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := acquireReq(ctx, pb.NewSemaphoreClient(survivor.grpcConn), &pb.SemaphoreAcquireRequest{Name: "job", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	zc := zktest.Conn(t)
	zktest.WaitFor(t, 30*time.Second, "the waiter in line", func() bool {
		kids, _, err := zc.Children(root + "/semaphores/job/queue")
		return err == nil && len(kids) == 1
	})
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if ev, err := held.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the victim's client after the kill: got %v, %v; want Unavailable", ev, err)
	}
	ev, err := waiter.Recv()
	if err != nil || ev.GetType() != pb.SemaphoreEvent_TYPE_GRANTED || ev.GetToken() <= g.GetToken() {
		t.Fatalf("waiter: got %v, %v; want GRANTED with a token above %d", ev, err, g.GetToken())
	}
	t.Logf("permit passed on %v after the kill (session timeout 4s)", time.Since(killed).Round(time.Millisecond))
	if err := releaseStream(waiter); err != nil {
		t.Fatal(err)
	}
	if kids, _, err := zc.Children(root + "/semaphores/job/leases"); err != nil || len(kids) != 0 {
		t.Fatalf("leases left: %v, %v", kids, err)
	}
}

// The leader deletes a semaphore once idle; the name works again after,
// with the limit of the Acquire that makes it again.
func TestIdleSemaphoreReaped(t *testing.T) {
	t.Cleanup(broker.SetCoordReapInterval(200 * time.Millisecond))
	root := zktest.Root(t)
	tb := newBroker(t, root)
	c := pb.NewSemaphoreClient(tb.grpcConn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, _, err := acquired(ctx, c, "batch", 2, 2, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := releaseStream(s); err != nil {
		t.Fatal(err)
	}
	zc := zktest.Conn(t)
	zktest.WaitFor(t, 30*time.Second, "the idle semaphore deleted", func() bool {
		kids, _, err := zc.Children(root + "/semaphores")
		return err == nil && len(kids) == 0
	})
	s, _, err = acquired(ctx, c, "batch", 5, 1, "")
	if err != nil {
		t.Fatalf("a reaped semaphore's name used again with another limit: %v", err)
	}
	if err := releaseStream(s); err != nil {
		t.Fatal(err)
	}
}
