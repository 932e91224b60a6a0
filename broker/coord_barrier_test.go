package broker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// participant is one DoubleBarrier Enter stream of a test, its events
// read on a goroutine of its own.
type participant struct {
	s      pb.DoubleBarrier_EnterClient
	events chan *pb.DoubleBarrierEvent // closed after the stream's end
	err    error                       // the stream's end, once events is closed
}

// arrive opens an Enter stream on c for name and count, after counting
// itself in arrived.
func arrive(ctx context.Context, t *testing.T, c pb.DoubleBarrierClient, name string, count int32, arrived *atomic.Int32) *participant {
	t.Helper()
	s, err := c.Enter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	arrived.Add(1)
	if err := s.Send(&pb.DoubleBarrierRequest{Name: name, Count: count}); err != nil {
		t.Fatal(err)
	}
	p := &participant{s: s, events: make(chan *pb.DoubleBarrierEvent, 4)}
	go func() {
		defer close(p.events)
		for {
			ev, err := s.Recv()
			if err != nil {
				p.err = err
				return
			}
			p.events <- ev
		}
	}()
	return p
}

// next returns p's next event, or nil and the stream's end.
func (p *participant) next(ctx context.Context) (*pb.DoubleBarrierEvent, error) {
	select {
	case ev, ok := <-p.events:
		if !ok {
			return nil, p.err
		}
		return ev, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// want waits for p's next event and fails unless it is of type typ.
func (p *participant) want(ctx context.Context, t *testing.T, typ pb.DoubleBarrierEvent_Type) *pb.DoubleBarrierEvent {
	t.Helper()
	ev, err := p.next(ctx)
	if err != nil || ev.GetType() != typ {
		t.Fatalf("got %v, %v; want %v", ev, err, typ)
	}
	return ev
}

// participantsOf lists the participant nodes of the double barrier dir
// (all but ready).
func participantsOf(t *testing.T, dir string) []string {
	t.Helper()
	kids, _, err := zktest.Conn(t).Children(dir)
	if errors.Is(err, zk.ErrNoNode) {
		return nil // not made yet
	}
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(kids, func(k string) bool { return k == "ready" })
}

// Six participants, three on each of two brokers, arrive one after the
// other: none enters before the sixth arrived; they leave one after the
// other, and none is told LEFT before the last asked to leave. Nothing is
// left under the barrier afterwards, and the leader's reaper then deletes
// the barrier's node.
func TestDoubleBarrierOverTwoBrokers(t *testing.T) {
	t.Cleanup(broker.SetCoordReapInterval(200 * time.Millisecond))
	root := zktest.Root(t)
	reg := prometheus.NewRegistry()
	b1 := newBroker(t, root, func(c *broker.Config) { c.Registerer = reg })
	b2 := newBroker(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clients := []pb.DoubleBarrierClient{pb.NewDoubleBarrierClient(b1.grpcConn), pb.NewDoubleBarrierClient(b2.grpcConn)}
	const n = 6
	dir := root + "/doublebarriers/round"
	var arrived atomic.Int32
	ps := make([]*participant, n)
	for i := range ps {
		ps[i] = arrive(ctx, t, clients[i%2], "round", n, &arrived)
		if i < n-1 {
			zktest.WaitFor(t, 10*time.Second, fmt.Sprintf("participant %d's node", i), func() bool {
				return len(participantsOf(t, dir)) == i+1
			})
		}
	}
	keys := make([]string, n)
	for i, p := range ps {
		keys[i] = p.want(ctx, t, pb.DoubleBarrierEvent_TYPE_ENTERED).GetKey()
		if got := arrived.Load(); got != n {
			t.Fatalf("participant %d entered after %d arrivals, want %d", i, got, n)
		}
	}
	if got := gaugeOf(t, reg, "qbroker_double_barrier_participants"); got != n/2 {
		t.Errorf("qbroker_double_barrier_participants = %v, want %d", got, n/2)
	}

	// Leave from the highest key down: each but the lowest deletes its
	// node as it asks; the lowest asks last.
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(keys[b], keys[a]) })
	var leaving atomic.Int32
	for k, i := range order {
		leaving.Add(1)
		if err := ps[i].s.Send(&pb.DoubleBarrierRequest{Leave: true}); err != nil {
			t.Fatal(err)
		}
		if k < n-1 {
			zktest.WaitFor(t, 10*time.Second, "the leaver's node gone", func() bool {
				return !slices.Contains(participantsOf(t, dir), keys[i])
			})
		}
	}
	for i, p := range ps {
		p.want(ctx, t, pb.DoubleBarrierEvent_TYPE_LEFT)
		if got := leaving.Load(); got != n {
			t.Fatalf("participant %d left after %d leave requests, want %d", i, got, n)
		}
		if ev, err := p.next(ctx); !errors.Is(err, io.EOF) {
			t.Fatalf("after LEFT: got %v, %v; want the stream's end (OK)", ev, err)
		}
	}
	kids, _, err := zktest.Conn(t).Children(dir)
	if err != nil || len(kids) != 0 {
		t.Fatalf("barrier after everyone left: %v, %v; want nothing", kids, err)
	}
	zktest.WaitFor(t, 10*time.Second, "the idle barrier reaped", func() bool {
		ok, _, err := zktest.Conn(t).Exists(dir)
		return err == nil && !ok
	})
}

// gaugeOf reads the value of an unlabelled metric of reg.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A barrier that is set holds Wait calls on two brokers until it is
// removed; Wait on a barrier that is not set returns at once.
func TestBarrierWaitReleasedOnRemove(t *testing.T) {
	root := zktest.Root(t)
	reg := prometheus.NewRegistry()
	b1 := newBroker(t, root, func(c *broker.Config) { c.Registerer = reg })
	b2 := newBroker(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c1, c2 := pb.NewBarrierClient(b1.grpcConn), pb.NewBarrierClient(b2.grpcConn)
	if _, err := c2.Wait(ctx, &pb.WaitBarrierRequest{Name: "deploy"}); err != nil {
		t.Fatalf("Wait on a barrier not set: %v", err)
	}
	for range 2 {
		if _, err := c1.Set(ctx, &pb.SetBarrierRequest{Name: "deploy"}); err != nil {
			t.Fatal(err)
		}
	}
	var removed atomic.Bool
	const waiters = 4
	errc := make(chan error, waiters)
	for i := range waiters {
		c := []pb.BarrierClient{c1, c2}[i%2]
		go func() {
			_, err := c.Wait(ctx, &pb.WaitBarrierRequest{Name: "deploy"})
			if err == nil && !removed.Load() {
				err = errors.New("Wait returned while the barrier was set")
			}
			errc <- err
		}()
	}
	zktest.WaitFor(t, 10*time.Second, "b1's waiters waiting", func() bool {
		return gaugeOf(t, reg, "qbroker_barrier_waits") == waiters/2
	})
	sctx, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := c2.Wait(sctx, &pb.WaitBarrierRequest{Name: "deploy"})
	scancel()
	wantCode(t, "Wait on a set barrier past its deadline", err, codes.DeadlineExceeded)
	removed.Store(true)
	for range 2 {
		if _, err := c2.Remove(ctx, &pb.RemoveBarrierRequest{Name: "deploy"}); err != nil {
			t.Fatal(err)
		}
	}
	for range waiters {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if ok, _, err := zktest.Conn(t).Exists(root + "/barriers/deploy"); err != nil || ok {
		t.Fatalf("barrier node after Remove: exists %v, %v", ok, err)
	}
}

// Bad names and counts get InvalidArgument naming the field, and create
// nothing.
func TestBarrierBadInput(t *testing.T) {
	root := zktest.Root(t)
	tb := newBroker(t, root)
	bc, dc := pb.NewBarrierClient(tb.grpcConn), pb.NewDoubleBarrierClient(tb.grpcConn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	enter := func(req *pb.DoubleBarrierRequest) error {
		s, err := dc.Enter(ctx)
		if err == nil {
			err = s.Send(req)
		}
		if err == nil {
			_, err = s.Recv()
		}
		return err
	}
	wantMsg := func(what string, err error, field string) {
		t.Helper()
		wantCode(t, what, err, codes.InvalidArgument)
		if !strings.Contains(status.Convert(err).Message(), field) {
			t.Errorf("%s: message %q does not name %q", what, status.Convert(err).Message(), field)
		}
	}
	for _, name := range []string{"", "..", "a/b", strings.Repeat("x", 201)} {
		_, err := bc.Set(ctx, &pb.SetBarrierRequest{Name: name})
		wantMsg(fmt.Sprintf("Set(%q)", name), err, "barrier name")
		_, err = bc.Remove(ctx, &pb.RemoveBarrierRequest{Name: name})
		wantMsg(fmt.Sprintf("Remove(%q)", name), err, "barrier name")
		_, err = bc.Wait(ctx, &pb.WaitBarrierRequest{Name: name})
		wantMsg(fmt.Sprintf("Wait(%q)", name), err, "barrier name")
		wantMsg(fmt.Sprintf("Enter(%q)", name), enter(&pb.DoubleBarrierRequest{Name: name, Count: 2}), "double barrier name")
	}
	for _, count := range []int32{0, -1, 1001, 1 << 30} {
		wantMsg(fmt.Sprintf("Enter with count %d", count), enter(&pb.DoubleBarrierRequest{Name: "b", Count: count}), "count")
	}
	for _, p := range []string{root + "/barriers", root + "/doublebarriers"} {
		if ok, _, err := zktest.Conn(t).Exists(p); err != nil || ok {
			t.Errorf("%s after bad input: exists %v, %v; want nothing", p, ok, err)
		}
	}
}

// A participant that ends its stream, entering or entered, leaves at
// once: it no longer counts, and one that was the only other entered does
// not hold the rest.
func TestDoubleBarrierParticipantGoes(t *testing.T) {
	root := zktest.Root(t)
	tb := newBroker(t, root)
	c := pb.NewDoubleBarrierClient(tb.grpcConn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := root + "/doublebarriers/g"
	var arrived atomic.Int32
	gctx, gone := context.WithCancel(ctx)
	early := arrive(gctx, t, c, "g", 2, &arrived)
	zktest.WaitFor(t, 10*time.Second, "the first participant", func() bool { return len(participantsOf(t, dir)) == 1 })
	gone()
	if ev, err := early.next(ctx); status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled participant: got %v, %v", ev, err)
	}
	zktest.WaitFor(t, 10*time.Second, "the cancelled participant gone", func() bool { return len(participantsOf(t, dir)) == 0 })
	a := arrive(ctx, t, c, "g", 2, &arrived)
	zktest.WaitFor(t, 10*time.Second, "a's node", func() bool { return len(participantsOf(t, dir)) == 1 })
	select {
	case ev := <-a.events:
		t.Fatalf("a alone after the other went: got %v, want to wait", ev)
	default:
	}
	b := arrive(ctx, t, c, "g", 2, &arrived)
	a.want(ctx, t, pb.DoubleBarrierEvent_TYPE_ENTERED)
	b.want(ctx, t, pb.DoubleBarrierEvent_TYPE_ENTERED)
	// b half-closes: it goes without waiting; a's leave then ends at once.
	if err := b.s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if ev, err := b.next(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: got %v, %v; want the stream's end", ev, err)
	}
	if err := a.s.Send(&pb.DoubleBarrierRequest{Leave: true}); err != nil {
		t.Fatal(err)
	}
	a.want(ctx, t, pb.DoubleBarrierEvent_TYPE_LEFT)
	if kids, _, err := zktest.Conn(t).Children(dir); err != nil || len(kids) != 0 {
		t.Fatalf("barrier after everyone left: %v, %v; want nothing", kids, err)
	}
}

// A broker process killed (SIGKILL) mid-barrier. Its clients' streams
// fail at once; its participants leave when its session times out. In a
// barrier still filling, the survivor's participant is not let in by the
// dead ones (they no longer count), and enters only with a full count of
// live ones. In a barrier whose participants entered, the survivor's
// leaving participants are held until the dead one's node goes, then told
// LEFT; the ready node the dead lowest participant left behind goes with
// the leader's reaper.
func TestKilledBrokerLeavesDoubleBarrier(t *testing.T) {
	t.Cleanup(broker.SetCoordReapInterval(200 * time.Millisecond))
	root := zktest.Root(t)
	survivor := newBroker(t, root)
	cmd, conn := startQbrokerProcess(t, root, "--session-timeout", "4s")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dead, live := pb.NewDoubleBarrierClient(conn), pb.NewDoubleBarrierClient(survivor.grpcConn)
	filling, entered := root+"/doublebarriers/filling", root+"/doublebarriers/entered"

	// filling: 4 needed; 2 on the doomed broker, 1 on the survivor.
	var fillArrived atomic.Int32
	var victims []*participant
	for range 2 {
		victims = append(victims, arrive(ctx, t, dead, "filling", 4, &fillArrived))
	}
	waiting := arrive(ctx, t, live, "filling", 4, &fillArrived)
	zktest.WaitFor(t, 10*time.Second, "three participants", func() bool { return len(participantsOf(t, filling)) == 3 })

	// entered: 3 needed; the doomed broker's arrives first (lowest), then
	// two on the survivor; all enter, the survivor's ask to leave.
	var entArrived atomic.Int32
	lowest := arrive(ctx, t, dead, "entered", 3, &entArrived)
	zktest.WaitFor(t, 10*time.Second, "the lowest participant", func() bool { return len(participantsOf(t, entered)) == 1 })
	leavers := []*participant{arrive(ctx, t, live, "entered", 3, &entArrived), arrive(ctx, t, live, "entered", 3, &entArrived)}
	victims = append(victims, lowest)
	lowest.want(ctx, t, pb.DoubleBarrierEvent_TYPE_ENTERED)
	var killed atomic.Bool
	for _, p := range leavers {
		p.want(ctx, t, pb.DoubleBarrierEvent_TYPE_ENTERED)
		if err := p.s.Send(&pb.DoubleBarrierRequest{Leave: true}); err != nil {
			t.Fatal(err)
		}
	}
	zktest.WaitFor(t, 10*time.Second, "the survivor's leavers gone from the list", func() bool {
		return len(participantsOf(t, entered)) == 1
	})

	for i, p := range leavers {
		select {
		case ev := <-p.events:
			t.Fatalf("leaver %d while the dead broker's participant is present: got %v, want to wait", i, ev)
		default:
		}
	}
	killedAt := time.Now()
	killed.Store(true)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for i, v := range victims {
		if ev, err := v.next(ctx); ev != nil && ev.GetType() == pb.DoubleBarrierEvent_TYPE_ENTERED {
			ev, err = v.next(ctx)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("victim %d after the kill: got %v, %v; want Unavailable", i, ev, err)
			}
		} else if status.Code(err) != codes.Unavailable {
			t.Fatalf("victim %d after the kill: got %v, %v; want Unavailable", i, ev, err)
		}
	}
	for i, p := range leavers {
		p.want(ctx, t, pb.DoubleBarrierEvent_TYPE_LEFT)
		if !killed.Load() {
			t.Fatalf("leaver %d left before the kill", i)
		}
	}
	t.Logf("leavers released %v after the kill (session timeout 4s)", time.Since(killedAt).Round(time.Millisecond))

	zktest.WaitFor(t, 30*time.Second, "the dead participants gone", func() bool { return len(participantsOf(t, filling)) == 1 })
	select {
	case ev := <-waiting.events:
		t.Fatalf("the survivor's participant after the dead left: got %v, want to wait", ev)
	default:
	}
	if ok, _, err := zktest.Conn(t).Exists(filling + "/ready"); err != nil || ok {
		t.Fatalf("filling's ready with one live participant of 4: exists %v, %v; want none", ok, err)
	}
	var more []*participant
	for range 3 {
		more = append(more, arrive(ctx, t, live, "filling", 4, &fillArrived))
	}
	for i, p := range append(more, waiting) {
		p.want(ctx, t, pb.DoubleBarrierEvent_TYPE_ENTERED)
		if got := fillArrived.Load(); got != 6 {
			t.Fatalf("participant %d entered after %d arrivals, want 6 (2 dead)", i, got)
		}
		if err := p.s.CloseSend(); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{filling, entered} {
		zktest.WaitFor(t, 30*time.Second, dir+" reaped", func() bool {
			ok, _, err := zktest.Conn(t).Exists(dir)
			return err == nil && !ok
		})
	}
}

const barrierRules = `# identity  actions        patterns
runner      barrier        jobs.*
boss        barrier.admin  jobs.*
other       lock           jobs.*
`

// Permissions per action: barrier lets an identity wait and enter,
// barrier.admin set and remove (and wait); neither reaches beyond its
// patterns, and other actions give none of it. Sets, removals and
// refusals are in the audit log.
func TestBarrierPermissions(t *testing.T) {
	e := newAuthBroker(t, barrierRules, []string{"runner", "boss", "other"})
	ctx := callCtx(t)
	barrier := func(id string) pb.BarrierClient { return pb.NewBarrierClient(e.conn(t, id)) }
	enter := func(id, name string) (*pb.DoubleBarrierEvent, error) {
		s, err := pb.NewDoubleBarrierClient(e.conn(t, id)).Enter(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.Send(&pb.DoubleBarrierRequest{Name: name, Count: 1}); err != nil {
			return nil, err
		}
		ev, err := s.Recv()
		if err == nil {
			_ = s.CloseSend()
		}
		return ev, err
	}
	runner, boss, other := barrier("runner"), barrier("boss"), barrier("other")

	_, err := runner.Set(ctx, &pb.SetBarrierRequest{Name: "jobs.a"})
	mustCode(t, "Set by runner (barrier)", err, codes.PermissionDenied)
	_, err = runner.Remove(ctx, &pb.RemoveBarrierRequest{Name: "jobs.a"})
	mustCode(t, "Remove by runner (barrier)", err, codes.PermissionDenied)
	_, err = boss.Set(ctx, &pb.SetBarrierRequest{Name: "other.a"})
	mustCode(t, "Set by boss outside its patterns", err, codes.PermissionDenied)
	_, err = other.Wait(ctx, &pb.WaitBarrierRequest{Name: "jobs.a"})
	mustCode(t, "Wait by other (lock)", err, codes.PermissionDenied)
	_, err = enter("other", "jobs.a")
	mustCode(t, "Enter by other (lock)", err, codes.PermissionDenied)
	_, err = enter("runner", "other.a")
	mustCode(t, "Enter by runner outside its patterns", err, codes.PermissionDenied)

	_, err = boss.Set(ctx, &pb.SetBarrierRequest{Name: "jobs.a"})
	mustCode(t, "Set by boss", err, codes.OK)
	sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = runner.Wait(sctx, &pb.WaitBarrierRequest{Name: "jobs.a"})
	cancel()
	mustCode(t, "Wait by runner on a set barrier", err, codes.DeadlineExceeded)
	_, err = boss.Remove(ctx, &pb.RemoveBarrierRequest{Name: "jobs.a"})
	mustCode(t, "Remove by boss", err, codes.OK)
	_, err = runner.Wait(ctx, &pb.WaitBarrierRequest{Name: "jobs.a"})
	mustCode(t, "Wait by runner", err, codes.OK)
	_, err = boss.Wait(ctx, &pb.WaitBarrierRequest{Name: "jobs.a"})
	mustCode(t, "Wait by boss (barrier.admin)", err, codes.OK)
	for _, id := range []string{"runner", "boss"} {
		ev, err := enter(id, "jobs.b")
		if err != nil || ev.GetType() != pb.DoubleBarrierEvent_TYPE_ENTERED {
			t.Fatalf("Enter by %s: got %v, %v; want ENTERED", id, ev, err)
		}
	}
	e.wantAudit(t,
		`action=set barrier=jobs.a .*grpc_code=OK identity=boss`,
		`action=remove barrier=jobs.a .*grpc_code=OK identity=boss`,
		`action=set barrier=jobs.a .*grpc_code=PermissionDenied identity=runner`,
		`action=barrier double_barrier=jobs.a .*grpc_code=PermissionDenied identity=other`)
}

// A participant whose node is deleted while it is entered (as its
// session's end would) is told LOST, and its stream ends with Aborted.
func TestDoubleBarrierParticipantLost(t *testing.T) {
	root := zktest.Root(t)
	tb := newBroker(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var arrived atomic.Int32
	p := arrive(ctx, t, pb.NewDoubleBarrierClient(tb.grpcConn), "solo", 1, &arrived)
	key := p.want(ctx, t, pb.DoubleBarrierEvent_TYPE_ENTERED).GetKey()
	if err := zktest.Conn(t).Delete(root+"/doublebarriers/solo/"+key, -1); err != nil {
		t.Fatal(err)
	}
	p.want(ctx, t, pb.DoubleBarrierEvent_TYPE_LOST)
	if ev, err := p.next(ctx); status.Code(err) != codes.Aborted {
		t.Fatalf("after LOST: got %v, %v; want Aborted", ev, err)
	}
}
