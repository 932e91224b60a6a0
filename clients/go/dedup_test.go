package qbroker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// lossyBroker starts a broker under root whose next lose Publish calls
// are applied, then answered UNAVAILABLE, as when the connection breaks
// after the broker committed and before the reply arrived.
func lossyBroker(t *testing.T, root string, lose *atomic.Int32, calls *atomic.Int32) *testBroker {
	t.Helper()
	lost := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if !strings.HasSuffix(info.FullMethod, "/Publish") {
			return h(ctx, req)
		}
		calls.Add(1)
		resp, err := h(ctx, req)
		if err == nil && lose.Add(-1) >= 0 {
			return nil, status.Error(codes.Unavailable, "connection lost after commit")
		}
		return resp, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: root,
		SweepInterval: 100 * time.Millisecond, SessionTimeout: 4 * time.Second},
		brokertest.Options{ServerOptions: []grpc.ServerOption{grpc.ChainUnaryInterceptor(lost)}})
	if err != nil {
		t.Fatal(err)
	}
	tb := &testBroker{s: s, b: s.Broker, srv: s.GRPC, addr: s.Addr}
	t.Cleanup(tb.stop)
	return tb
}

// A publish whose reply is lost after the broker committed it is retried
// by the client with the same dedup id, on either of two brokers: the
// queue holds the message once, and Publish returns its id. Without a
// dedup id and without WithPublishRetries it is not retried.
func TestPublishRetryAfterLostReply(t *testing.T) {
	ctx := testCtx(t)
	root := zktest.Root(t)
	var lose, calls atomic.Int32
	a := lossyBroker(t, root, &lose, &calls)
	b := startBroker(t, root, "")
	both := a.addr + "," + b.addr
	createQueue(t, dial(t, a.addr), "q", qbroker.QueueOptions{})
	check := func(c *qbroker.Client, n int) []*qbroker.Message {
		t.Helper()
		ms, err := c.Receive(ctx, "q", qbroker.ReceiveOptions{Max: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != n {
			t.Fatalf("queue held %d messages, want %d", len(ms), n)
		}
		return ms
	}

	for _, tc := range []struct {
		name string
		opts []qbroker.Option
		pub  []qbroker.PublishOption
	}{
		{"generated id", []qbroker.Option{qbroker.WithPublishRetries(3)}, nil},
		{"caller's id", nil, []qbroker.PublishOption{qbroker.WithDedupID("order-7")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, a.addr, tc.opts...)
			lose.Store(1)
			calls.Store(0)
			id, err := c.Publish(ctx, "q", []byte(tc.name), tc.pub...)
			if err != nil {
				t.Fatalf("Publish: %v", err)
			}
			if calls.Load() < 2 {
				t.Fatalf("%d Publish calls, want a retry", calls.Load())
			}
			ms := check(c, 1)
			if ms[0].ID != id || string(ms[0].Payload) != tc.name {
				t.Fatalf("queue held %s %q, Publish returned %s", ms[0].ID, ms[0].Payload, id)
			}
		})
	}

	t.Run("batch across brokers", func(t *testing.T) {
		c := dial(t, both, qbroker.WithPublishRetries(5))
		lose.Store(1)
		// The first attempt lands on a (reply lost) or b; either way
		// one copy. The first message gets a new generated id per call.
		msgs := []qbroker.OutMessage{{Payload: []byte("1")}, {Payload: []byte("2"), DedupID: "two"}}
		var ids []string
		for range 4 {
			var err error
			if ids, err = c.PublishBatch(ctx, "q", msgs); err != nil {
				t.Fatal(err)
			}
		}
		ms := check(c, 5)
		if ms[1].ID != ids[1] {
			t.Fatalf("dedup id two: queue holds %s, last answer %s", ms[1].ID, ids[1])
		}
	})

	t.Run("not retried without a dedup id", func(t *testing.T) {
		c := dial(t, a.addr)
		lose.Store(1)
		calls.Store(0)
		_, err := c.Publish(ctx, "q", []byte("once"))
		if !errors.Is(err, qbroker.ErrUnavailable) || calls.Load() != 1 {
			t.Fatalf("Publish: %v after %d calls, want ErrUnavailable after 1", err, calls.Load())
		}
		check(c, 1) // it was published: the caller could not know
	})
}

// PublishReceipts tells repeats apart; a repeat on another broker gets
// the first id.
func TestPublishReceipts(t *testing.T) {
	ctx := testCtx(t)
	root := zktest.Root(t)
	a, b := startBroker(t, root, ""), startBroker(t, root, "")
	ca, cb := dial(t, a.addr), dial(t, b.addr)
	createQueue(t, ca, "q", qbroker.QueueOptions{DedupWindow: 2 * time.Second})
	if info, err := cb.GetQueue(ctx, "q"); err != nil || info.DedupWindow != 2*time.Second {
		t.Fatalf("GetQueue: %+v, %v", info, err)
	}
	first, err := ca.PublishReceipts(ctx, "q", []qbroker.OutMessage{{Payload: []byte("a"), DedupID: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := cb.PublishReceipts(ctx, "q", []qbroker.OutMessage{{Payload: []byte("a"), DedupID: "a"}, {Payload: []byte("b")}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(rs[0]), fmt.Sprint(qbroker.Receipt{ID: first[0].ID, Duplicate: true}); got != want || rs[1].Duplicate {
		t.Fatalf("receipts %v, want %s and a new message", rs, want)
	}
	if _, err := ca.Publish(ctx, "q", []byte("x"), qbroker.WithDedupID("a b")); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("bad dedup id: %v, want ErrInvalidArgument", err)
	}
}

// WithPublishRetries gives every message a dedup id; a delayed message is
// still delayed, and a retry after a lost reply is answered with its
// delayed id: one message, delivered when due.
func TestPublishRetriesDelayed(t *testing.T) {
	ctx := testCtx(t)
	var lose, calls atomic.Int32
	a := lossyBroker(t, zktest.Root(t), &lose, &calls)
	c := dial(t, a.addr, qbroker.WithPublishRetries(3))
	createQueue(t, c, "q", qbroker.QueueOptions{})
	const delay = 2 * time.Second
	lose.Store(1)
	published := time.Now()
	id, err := c.Publish(ctx, "q", []byte("later"), qbroker.WithDelay(delay))
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if calls.Load() < 2 {
		t.Fatalf("%d Publish calls on the lossy broker, want a retry", calls.Load())
	}
	if !zkqueue.IsDelayedID(id) {
		t.Fatalf("Publish answered %q, want a delayed message's id", id)
	}
	ids, err := c.PublishBatch(ctx, "q", []qbroker.OutMessage{{Payload: []byte("at"), DeliverAt: published.Add(delay)}})
	if err != nil || !zkqueue.IsDelayedID(ids[0]) {
		t.Fatalf("PublishBatch: %v, %v; want a delayed message's id", ids, err)
	}
	st, err := c.Stats(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(published) < delay && (st.Delayed != 2 || st.Ready != 0) {
		t.Fatalf("before due: %+v, want 2 delayed, none ready", st)
	}
	var got []string
	for len(got) < 2 {
		ms, err := c.Receive(ctx, "q", qbroker.ReceiveOptions{Max: 10, Wait: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			got = append(got, string(m.Payload))
		}
	}
	if time.Since(published) < delay {
		t.Fatalf("delivered %v after publish, before due", time.Since(published))
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"at", "later"}) {
		t.Fatalf("delivered %v, want [at later], once each", got)
	}
	if st, err := c.Stats(ctx, "q"); err != nil || st.Delayed != 0 || st.Ready != 0 {
		t.Fatalf("after delivery: %+v, %v; want nothing left", st, err)
	}
}
