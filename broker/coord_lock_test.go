package broker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

// lockGranted opens a Lock stream on c for name and waits for its grant.
func lockGranted(ctx context.Context, c pb.LockClient, name, value string) (pb.Lock_LockClient, *pb.LockEvent, error) {
	s, err := c.Lock(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := s.Send(&pb.LockRequest{Name: name, Value: []byte(value)}); err != nil {
		return nil, nil, err
	}
	ev, err := s.Recv()
	if err != nil {
		return nil, nil, err
	}
	if ev.GetType() != pb.LockEvent_TYPE_GRANTED || ev.GetToken() == 0 || ev.GetKey() == "" {
		return nil, nil, fmt.Errorf("first event %v, want GRANTED with key and token", ev)
	}
	return s, ev, nil
}

// unlockStream sends unlock and waits for the stream to end with OK.
func unlockStream(s pb.Lock_LockClient) error {
	if err := s.Send(&pb.LockRequest{Unlock: true}); err != nil {
		return err
	}
	if ev, err := s.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("after unlock: got %v, %v; want the stream's end", ev, err)
	}
	return nil
}

// Eight clients, four on each of two brokers (each with its own
// connection), take the lock 25 times each and increment a counter node
// under it with a versioned write: never two holders at once (a marker),
// tokens grow with every grant, no write is refused, and the final value
// is exact.
func TestLockMutualExclusionOverGRPC(t *testing.T) {
	const clients, rounds = 8, 25
	root := zktest.Root(t)
	brokers := []*testBroker{newBroker(t, root), newBroker(t, root)}
	counter := root + "/counter"
	if _, err := zktest.Conn(t).Create(counter, []byte("0"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var holders atomic.Int32
	var lastToken atomic.Int64
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		zc := zktest.Conn(t)
		cc, err := grpc.NewClient(brokers[i%2].addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		c := pb.NewLockClient(cc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				if err := incrementUnderLock(ctx, c, zc, counter, &holders, &lastToken); err != nil {
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
	data, _, err := zktest.Conn(t).Get(counter)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != strconv.Itoa(clients*rounds) {
		t.Fatalf("counter = %s, want %d", data, clients*rounds)
	}
}

func incrementUnderLock(ctx context.Context, c pb.LockClient, zc *zk.Conn, counter string,
	holders *atomic.Int32, lastToken *atomic.Int64) error {
	s, ev, err := lockGranted(ctx, c, "counter", "")
	if err != nil {
		return err
	}
	if n := holders.Add(1); n != 1 {
		return fmt.Errorf("%d holders at once", n)
	}
	if prev := lastToken.Swap(ev.GetToken()); ev.GetToken() <= prev {
		return fmt.Errorf("token %d after %d", ev.GetToken(), prev)
	}
	data, st, err := zc.Get(counter)
	if err != nil {
		return err
	}
	n, _ := strconv.Atoi(string(data))
	if _, err := zc.Set(counter, []byte(strconv.Itoa(n+1)), st.Version); err != nil {
		return fmt.Errorf("versioned write of the counter: %w", err)
	}
	holders.Add(-1)
	return unlockStream(s)
}

// Revoke reaches the holder through another broker, Unlock by key and
// token from another broker releases it (the holder gets LOST and
// Aborted) and the waiter is granted; wrong tokens, released grants and
// an unheld lock are refused.
func TestLockRevokeAndUnlockByKey(t *testing.T) {
	root := zktest.Root(t)
	b1, b2 := newBroker(t, root), newBroker(t, root)
	c1, c2 := pb.NewLockClient(b1.grpcConn), pb.NewLockClient(b2.grpcConn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c2.Revoke(ctx, &pb.RevokeRequest{Name: "db"})
	wantCode(t, "Revoke of an unheld lock", err, codes.FailedPrecondition)

	holder, g, err := lockGranted(ctx, c1, "db", "worker-1")
	if err != nil {
		t.Fatal(err)
	}
	r, err := c2.Revoke(ctx, &pb.RevokeRequest{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	if h := r.GetHolder(); h.GetKey() != g.GetKey() || h.GetToken() != g.GetToken() || string(h.GetValue()) != "worker-1" {
		t.Fatalf("Revoke returned %v, want %v with value worker-1", h, g)
	}
	if ev, err := holder.Recv(); err != nil || ev.GetType() != pb.LockEvent_TYPE_REVOKE_REQUESTED {
		t.Fatalf("holder after Revoke: got %v, %v; want REVOKE_REQUESTED", ev, err)
	}

	waiter, err := c2.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := waiter.Send(&pb.LockRequest{Name: "db"}); err != nil {
		t.Fatal(err)
	}
	_, err = c2.Unlock(ctx, &pb.UnlockRequest{Name: "db", Key: g.GetKey(), Token: g.GetToken() + 1})
	wantCode(t, "Unlock with another token", err, codes.FailedPrecondition)
	if _, err := c2.Unlock(ctx, &pb.UnlockRequest{Name: "db", Key: g.GetKey(), Token: g.GetToken()}); err != nil {
		t.Fatal(err)
	}
	if ev, err := holder.Recv(); err != nil || ev.GetType() != pb.LockEvent_TYPE_LOST {
		t.Fatalf("holder after Unlock by key: got %v, %v; want LOST", ev, err)
	}
	_, err = holder.Recv()
	wantCode(t, "the holder's stream after LOST", err, codes.Aborted)
	ev, err := waiter.Recv()
	if err != nil || ev.GetType() != pb.LockEvent_TYPE_GRANTED || ev.GetToken() <= g.GetToken() {
		t.Fatalf("waiter: got %v, %v; want GRANTED with a token above %d", ev, err, g.GetToken())
	}
	_, err = c1.Unlock(ctx, &pb.UnlockRequest{Name: "db", Key: g.GetKey(), Token: g.GetToken()})
	wantCode(t, "Unlock of a released grant", err, codes.FailedPrecondition)
	if err := unlockStream(waiter); err != nil {
		t.Fatal(err)
	}
}

// A waiter that leaves (cancels its stream) or sends unlock before its
// grant leaves no node behind, and the lock passes on.
func TestLockWaiterLeaves(t *testing.T) {
	root := zktest.Root(t)
	tb := newBroker(t, root)
	c := pb.NewLockClient(tb.grpcConn)
	zc := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder, _, err := lockGranted(ctx, c, "l", "")
	if err != nil {
		t.Fatal(err)
	}
	nodes := func() int {
		kids, _, err := zc.Children(root + "/locks/l")
		if err != nil {
			return -1
		}
		return len(kids)
	}
	wctx, leave := context.WithCancel(ctx)
	left, err := c.Lock(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := left.Send(&pb.LockRequest{Name: "l"}); err != nil {
		t.Fatal(err)
	}
	unlocked, err := c.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := unlocked.Send(&pb.LockRequest{Name: "l"}); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "three contenders' nodes", func() bool { return nodes() == 3 })
	leave()
	if err := unlockStream(unlocked); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "the waiters' nodes to go", func() bool { return nodes() == 1 })
	if err := unlockStream(holder); err != nil {
		t.Fatal(err)
	}
	next, _, err := lockGranted(ctx, c, "l", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := unlockStream(next); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "no node left", func() bool { return nodes() == 0 })
}

// Bad names, keys, tokens and values get InvalidArgument and create
// nothing.
func TestLockBadInput(t *testing.T) {
	root := zktest.Root(t)
	tb := newBroker(t, root)
	c := pb.NewLockClient(tb.grpcConn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range []string{"", "..", "a/b", strings.Repeat("x", 201)} {
		s, err := c.Lock(ctx)
		if err == nil {
			err = s.Send(&pb.LockRequest{Name: name})
		}
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, fmt.Sprintf("Lock(%q)", name), err, codes.InvalidArgument)
		_, err = c.Revoke(ctx, &pb.RevokeRequest{Name: name})
		wantCode(t, fmt.Sprintf("Revoke(%q)", name), err, codes.InvalidArgument)
		_, err = c.Unlock(ctx, &pb.UnlockRequest{Name: name, Key: "lock-0123456789abcdef-0000000001", Token: 1})
		wantCode(t, fmt.Sprintf("Unlock(%q)", name), err, codes.InvalidArgument)
	}
	for _, key := range []string{"", "..", "n-0000000001", "lock-x/y", "lock-nonsense"} {
		_, err := c.Unlock(ctx, &pb.UnlockRequest{Name: "l", Key: key, Token: 1})
		wantCode(t, fmt.Sprintf("Unlock key %q", key), err, codes.InvalidArgument)
	}
	_, err := c.Unlock(ctx, &pb.UnlockRequest{Name: "l", Key: "lock-0123456789abcdef-0000000001"})
	wantCode(t, "Unlock without a token", err, codes.InvalidArgument)
	_, err = c.Unlock(ctx, &pb.UnlockRequest{Name: "l", Key: "lock-0123456789abcdef-0000000001", Token: 5})
	wantCode(t, "Unlock of an unknown key", err, codes.FailedPrecondition)
	s, err := c.Lock(ctx)
	if err == nil {
		err = s.Send(&pb.LockRequest{Name: "l", Value: make([]byte, 64<<10+1)})
	}
	if err == nil {
		_, err = s.Recv()
	}
	wantCode(t, "Lock with a value over 64 KiB", err, codes.InvalidArgument)
	kids, _, err := zktest.Conn(t).Children(root + "/locks")
	if err != nil || len(kids) != 0 {
		t.Fatalf("locks after bad input: %v, %v; want none", kids, err)
	}
}

// A broker process killed (SIGKILL) while its client holds a lock: the
// client's stream fails at once, and the lock passes to a waiter on
// another broker when the dead broker's session times out.
func TestKilledBrokerReleasesLock(t *testing.T) {
	root := zktest.Root(t)
	survivor := newBroker(t, root)
	cmd, conn := startQbrokerProcess(t, root, "--session-timeout", "4s")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	held, g, err := lockGranted(ctx, pb.NewLockClient(conn), "job", "victim")
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := pb.NewLockClient(survivor.grpcConn).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := waiter.Send(&pb.LockRequest{Name: "job", Value: []byte("survivor")}); err != nil {
		t.Fatal(err)
	}
	zc := zktest.Conn(t)
	zktest.WaitFor(t, 30*time.Second, "the waiter's node", func() bool {
		kids, _, err := zc.Children(root + "/locks/job")
		return err == nil && len(kids) == 2
	})
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	ev, err := held.Recv()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("the victim's client after the kill: got %v, %v; want Unavailable", ev, err)
	}
	ev, err = waiter.Recv()
	if err != nil || ev.GetType() != pb.LockEvent_TYPE_GRANTED || ev.GetToken() <= g.GetToken() {
		t.Fatalf("waiter: got %v, %v; want GRANTED with a token above %d", ev, err, g.GetToken())
	}
	t.Logf("lock passed on %v after the kill (session timeout 4s)", time.Since(killed).Round(time.Millisecond))
	if err := unlockStream(waiter); err != nil {
		t.Fatal(err)
	}
}
