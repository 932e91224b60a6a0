package broker_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// lockStream opens a Lock stream for name with a lock-delay; the grant
// comes on the stream.
func lockStream(t *testing.T, ctx context.Context, c pb.LockClient, name string, delay time.Duration) pb.Lock_LockClient {
	t.Helper()
	s, err := c.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&pb.LockRequest{Name: name, LockDelay: durationpb.New(delay)}); err != nil {
		t.Fatal(err)
	}
	return s
}

func granted(t *testing.T, s pb.Lock_LockClient, what string) *pb.LockEvent {
	t.Helper()
	ev, err := s.Recv()
	if err != nil || ev.GetType() != pb.LockEvent_TYPE_GRANTED {
		t.Fatalf("%s: got %v, %v; want GRANTED", what, ev, err)
	}
	return ev
}

func childCount(conn *zk.Conn, p string) int {
	kids, _, err := conn.Children(p)
	if err != nil {
		return -1
	}
	return len(kids)
}

// Over gRPC: a holder whose stream ends without unlock (its client
// cancelled or vanished) leaves the lock unavailable for its lock_delay,
// and the next waiter gets it after; an unlock frees a lock with a delay
// at once; bad delays are refused naming the field; no node is left.
func TestLockDelayOverGRPC(t *testing.T) {
	const delay = 2 * time.Second
	root := zktest.Root(t)
	tb := newBroker(t, root)
	c := pb.NewLockClient(tb.grpcConn)
	zc := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	hctx, vanish := context.WithCancel(ctx)
	holder := lockStream(t, hctx, c, "l", delay)
	granted(t, holder, "holder")
	waiter := lockStream(t, ctx, c, "l", 0)
	zktest.WaitFor(t, 30*time.Second, "the waiter's node", func() bool { return childCount(zc, root+"/locks/l") == 3 })
	left := time.Now()
	vanish()
	granted(t, waiter, "waiter after the holder's delay")
	if waited := time.Since(left); waited < delay {
		t.Fatalf("waiter granted %v after the holder left, want at least the delay %v", waited, delay)
	}

	// An explicit unlock of a holder with a minute's delay frees the
	// lock at once.
	next := lockStream(t, ctx, c, "l", time.Minute)
	zktest.WaitFor(t, 30*time.Second, "the next waiter's node", func() bool { return childCount(zc, root+"/locks/l") == 2 })
	if err := unlockStream(waiter); err != nil {
		t.Fatal(err)
	}
	granted(t, next, "next after unlock")
	if err := unlockStream(next); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "no node left", func() bool { return childCount(zc, root+"/locks/l") == 0 })

	for _, d := range []*durationpb.Duration{
		durationpb.New(-time.Second), durationpb.New(time.Minute + time.Millisecond), {Seconds: 1, Nanos: -1},
	} {
		s, err := c.Lock(ctx)
		if err == nil {
			err = s.Send(&pb.LockRequest{Name: "bad", LockDelay: d})
		}
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, "Lock with lock_delay "+d.String(), err, codes.InvalidArgument)
		if !strings.Contains(status.Convert(err).Message(), "lock_delay") {
			t.Errorf("Lock with lock_delay %v: %v, want the field named", d, err)
		}
	}
	if n := childCount(zc, root+"/locks/bad"); n != -1 {
		t.Fatalf("a refused lock made its node (%d children)", n)
	}
}

// Over gRPC, with two brokers: a leader whose Campaign stream ends without
// Resign leaves the election without a leader for its lock_delay; Resign
// by key frees an election with a delay at once; bad delays are refused
// naming the field; no node is left.
func TestElectionDelayOverGRPC(t *testing.T) {
	const delay = 2 * time.Second
	root := zktest.Root(t)
	b1, b2 := newBroker(t, root), newBroker(t, root)
	e1, e2 := electionClient(b1), electionClient(b2)
	zc := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	campaign := func(ctx context.Context, c pb.ElectionClient, value string, d time.Duration) pb.Election_CampaignClient {
		t.Helper()
		s, err := c.Campaign(ctx, &pb.CampaignRequest{Name: "e", Value: []byte(value), LockDelay: durationpb.New(d)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	leading := func(s pb.Election_CampaignClient, what string) *pb.LeaderEvent {
		t.Helper()
		ev, err := s.Recv()
		if err != nil || ev.GetType() != pb.LeaderEvent_TYPE_LEADING {
			t.Fatalf("%s: got %v, %v; want LEADING", what, ev, err)
		}
		return ev
	}
	lctx, vanish := context.WithCancel(ctx)
	leader := campaign(lctx, e1, "a", delay)
	a := leading(leader, "a")
	second := campaign(ctx, e2, "b", time.Minute)
	zktest.WaitFor(t, 30*time.Second, "b's candidate node", func() bool { return childCount(zc, root+"/elections/e") == 3 })
	left := time.Now()
	vanish()
	b := leading(second, "b after a's delay")
	if waited := time.Since(left); waited < delay {
		t.Fatalf("b led %v after a left, want at least the delay %v", waited, delay)
	}
	if b.GetToken() <= a.GetToken() {
		t.Fatalf("token %d after %d: want greater", b.GetToken(), a.GetToken())
	}

	third := campaign(ctx, e1, "c", 0)
	zktest.WaitFor(t, 30*time.Second, "c's candidate node", func() bool { return childCount(zc, root+"/elections/e") == 3 })
	if _, err := e1.Resign(ctx, &pb.ResignRequest{Name: "e", Key: b.GetKey()}); err != nil {
		t.Fatal(err)
	}
	leading(third, "c after b's resignation")
	if ev, err := second.Recv(); ev.GetType() != pb.LeaderEvent_TYPE_LOST {
		t.Fatalf("b after Resign: got %v, %v; want LOST", ev, err)
	}
	cancel() // c has no delay: its stream's end frees the election at once
	zktest.WaitFor(t, 30*time.Second, "no node left", func() bool { return childCount(zc, root+"/elections/e") == 0 })

	bctx, bcancel := context.WithTimeout(context.Background(), time.Minute)
	defer bcancel()
	for _, d := range []*durationpb.Duration{durationpb.New(-time.Second), durationpb.New(2 * time.Minute)} {
		s, err := e1.Campaign(bctx, &pb.CampaignRequest{Name: "bad", LockDelay: d})
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, "Campaign with lock_delay "+d.String(), err, codes.InvalidArgument)
		if !strings.Contains(status.Convert(err).Message(), "lock_delay") {
			t.Errorf("Campaign with lock_delay %v: %v, want the field named", d, err)
		}
	}
}

// A broker process killed (SIGKILL) while its client holds a lock with a
// lock_delay: the lock's node goes when the dead broker's session times
// out, and the waiter on another broker gets the lock only once the
// delay has passed since then.
func TestLockDelayKilledBroker(t *testing.T) {
	const delay = 2 * time.Second
	root := zktest.Root(t)
	survivor := newBroker(t, root)
	cmd, conn := startQbrokerProcess(t, root, "--session-timeout", "4s")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	held := lockStream(t, ctx, pb.NewLockClient(conn), "job", delay)
	g := granted(t, held, "the victim's client")
	waiter := lockStream(t, ctx, pb.NewLockClient(survivor.grpcConn), "job", 0)
	zc := zktest.Conn(t)
	zktest.WaitFor(t, 30*time.Second, "the waiter's node", func() bool { return childCount(zc, root+"/locks/job") == 3 })
	ok, _, w, err := zc.ExistsW(root + "/locks/job/" + g.GetKey())
	if err != nil || !ok {
		t.Fatalf("watch the holder's node: %v %v", ok, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	select {
	case <-w:
	case <-time.After(time.Minute):
		t.Fatal("the holder's node outlived its broker's session")
	}
	gone := time.Now()
	ev := granted(t, waiter, "the waiter after the delay")
	// The survivor's clock starts when it notes the loss, after the
	// watch that timed gone fired: allow for that event's delivery.
	waited := time.Since(gone)
	if waited < delay-200*time.Millisecond {
		t.Fatalf("waiter granted %v after the holder's node went, want at least the delay %v", waited, delay)
	}
	t.Logf("waiter granted %v after the killed broker's holder node went (delay %v)", waited.Round(time.Millisecond), delay)
	if ev.GetToken() <= g.GetToken() {
		t.Fatalf("token %d after %d: want greater", ev.GetToken(), g.GetToken())
	}
	if err := unlockStream(waiter); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "no node left", func() bool { return childCount(zc, root+"/locks/job") == 0 })
}

// With nobody contending, the leader's upkeep ends a lost holder's
// lock-delay: its marker goes once the delay has passed, then the idle
// name is reaped.
func TestLockDelayMarkerSwept(t *testing.T) {
	t.Cleanup(broker.SetCoordReapInterval(200 * time.Millisecond))
	root := zktest.Root(t)
	tb := newBroker(t, root)
	zc := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hctx, vanish := context.WithCancel(ctx)
	holder := lockStream(t, hctx, pb.NewLockClient(tb.grpcConn), "l", time.Second)
	granted(t, holder, "holder")
	vanish()
	zktest.WaitFor(t, 30*time.Second, "the holder's node to go, its marker left", func() bool {
		kids, _, err := zc.Children(root + "/locks/l")
		return err == nil && len(kids) == 1 && strings.HasPrefix(kids[0], "delay-")
	})
	zktest.WaitFor(t, 30*time.Second, "the marker swept and the name reaped", func() bool {
		return childCount(zc, root+"/locks") == 0
	})
}

// Over gRPC too, tokens of locks and leaderships compare in one space
// (creation zxids): a lock granted after a leadership began has a greater
// token, a leadership won after that lock a greater one still, whichever
// broker serves them.
func TestTokensOneSpaceOverGRPC(t *testing.T) {
	root := zktest.Root(t)
	b1, b2 := newBroker(t, root), newBroker(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var last int64
	for i, tb := range []*testBroker{b1, b2, b1} {
		cctx, resign := context.WithCancel(ctx)
		s, err := electionClient(tb).Campaign(cctx, &pb.CampaignRequest{Name: "e"})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := s.Recv()
		if err != nil || ev.GetType() != pb.LeaderEvent_TYPE_LEADING {
			t.Fatalf("round %d: campaign: %v, %v", i, ev, err)
		}
		if ev.GetToken() <= last {
			t.Fatalf("round %d: leadership's token %d after a lock's %d: want greater", i, ev.GetToken(), last)
		}
		other := b2
		if tb == b2 {
			other = b1
		}
		l, g, err := lockGranted(ctx, pb.NewLockClient(other.grpcConn), "l", "")
		if err != nil {
			t.Fatal(err)
		}
		if g.GetToken() <= ev.GetToken() {
			t.Fatalf("round %d: lock's token %d after a leadership's %d: want greater", i, g.GetToken(), ev.GetToken())
		}
		last = g.GetToken()
		if err := unlockStream(l); err != nil {
			t.Fatal(err)
		}
		if _, err := electionClient(other).Resign(ctx, &pb.ResignRequest{Name: "e", Key: ev.GetKey()}); err != nil {
			t.Fatal(err)
		}
		resign()
	}
}
