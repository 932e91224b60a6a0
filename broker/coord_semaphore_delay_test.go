package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

// semGranted waits for the GRANTED event of an Acquire stream.
func semGranted(t *testing.T, s pb.Semaphore_AcquireClient, what string) *pb.SemaphoreEvent {
	t.Helper()
	ev, err := s.Recv()
	if err != nil || ev.GetType() != pb.SemaphoreEvent_TYPE_GRANTED {
		t.Fatalf("%s: got %v, %v; want GRANTED", what, ev, err)
	}
	return ev
}

func semStream(t *testing.T, ctx context.Context, c pb.SemaphoreClient, name string, limit int32, delay time.Duration) pb.Semaphore_AcquireClient {
	t.Helper()
	s, err := acquireReq(ctx, c, &pb.SemaphoreAcquireRequest{Name: name, Limit: limit, LockDelay: durationpb.New(delay)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Over gRPC: the holder of the last permit whose stream ends without a
// release (its client cancelled or vanished) keeps that permit
// unavailable for its lock_delay, and the waiter gets it after; a release
// frees permits with a delay at once; no node is left.
func TestSemaphoreDelayOverGRPC(t *testing.T) {
	const delay = 2 * time.Second
	root := zktest.Root(t)
	tb := newBroker(t, root)
	c := pb.NewSemaphoreClient(tb.grpcConn)
	zc := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := root + "/semaphores/s"

	first := semStream(t, ctx, c, "s", 2, 0)
	semGranted(t, first, "first")
	hctx, vanish := context.WithCancel(ctx)
	holder := semStream(t, hctx, c, "s", 2, delay)
	semGranted(t, holder, "holder of the last permit")
	waiter := semStream(t, ctx, c, "s", 2, 0)
	zktest.WaitFor(t, 30*time.Second, "the waiter's node", func() bool { return childCount(zc, p+"/queue") == 1 })
	left := time.Now()
	vanish()
	semGranted(t, waiter, "waiter after the holder's delay")
	if waited := time.Since(left); waited < delay {
		t.Fatalf("waiter granted %v after the holder left, want at least the delay %v", waited, delay)
	}

	// An explicit release of a holder with a minute's delay frees its
	// permit at once.
	next := semStream(t, ctx, c, "s", 2, time.Minute)
	zktest.WaitFor(t, 30*time.Second, "the next waiter's node", func() bool { return childCount(zc, p+"/queue") == 1 })
	if err := releaseStream(waiter); err != nil {
		t.Fatal(err)
	}
	semGranted(t, next, "next after release")
	for _, s := range []pb.Semaphore_AcquireClient{next, first} {
		if err := releaseStream(s); err != nil {
			t.Fatal(err)
		}
	}
	zktest.WaitFor(t, 30*time.Second, "no node left", func() bool {
		return childCount(zc, p+"/leases") == 0 && childCount(zc, p+"/queue") == 0
	})
}

// With nobody contending, the leader's upkeep ends a lost lease's
// lock-delay: its marker goes once the delay has passed, then the idle
// semaphore is reaped.
func TestSemaphoreDelayMarkerSwept(t *testing.T) {
	t.Cleanup(broker.SetCoordReapInterval(200 * time.Millisecond))
	root := zktest.Root(t)
	tb := newBroker(t, root)
	zc := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hctx, vanish := context.WithCancel(ctx)
	holder := semStream(t, hctx, pb.NewSemaphoreClient(tb.grpcConn), "s", 1, time.Second)
	semGranted(t, holder, "holder")
	vanish()
	zktest.WaitFor(t, 30*time.Second, "the holder's lease to go, its marker left", func() bool {
		kids, _, err := zc.Children(root + "/semaphores/s/leases")
		return err == nil && len(kids) == 1 && strings.HasPrefix(kids[0], "delay-lease-")
	})
	zktest.WaitFor(t, 30*time.Second, "the marker swept and the semaphore reaped", func() bool {
		return childCount(zc, root+"/semaphores") == 0
	})
}
