package qbroker_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/zktest"
)

// Publish 20 messages, consume them in order over a stream, ack them in
// at-least-once mode: the queue ends empty with nothing in flight.
func TestRoundTrip(t *testing.T) {
	_, c := setup(t)
	for _, mode := range []qbroker.DeliveryMode{qbroker.AtMostOnce, qbroker.AtLeastOnce} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testCtx(t)
			q := "rt-" + mode.String()
			createQueue(t, c, q, qbroker.QueueOptions{})
			var want []string
			for i := range 10 {
				p := fmt.Sprintf("m%02d", i)
				if _, err := c.Publish(ctx, q, []byte(p)); err != nil {
					t.Fatal(err)
				}
				want = append(want, p)
			}
			var batch []qbroker.OutMessage
			for i := 10; i < 20; i++ {
				p := fmt.Sprintf("m%02d", i)
				batch = append(batch, qbroker.OutMessage{Payload: []byte(p)})
				want = append(want, p)
			}
			ids, err := c.PublishBatch(ctx, q, batch)
			if err != nil || len(ids) != 10 {
				t.Fatalf("PublishBatch: got %d ids, %v; want 10", len(ids), err)
			}

			k, err := c.Consume(ctx, q, qbroker.ConsumeOptions{Mode: mode, Prefetch: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			var got []string
			for range want {
				m := next(t, k)
				got = append(got, string(m.Payload))
				if m.Queue != q || m.ID == "" || m.DeliveryCount != 1 || m.PublishedAt.IsZero() {
					t.Errorf("message %+v: want queue %s, an id, delivery count 1, a publish time", m, q)
				}
				if mode == qbroker.AtLeastOnce {
					if m.LeaseDeadline.Before(time.Now()) {
						t.Errorf("lease deadline %v: want in the future", m.LeaseDeadline)
					}
					if err := m.Ack(ctx); err != nil {
						t.Fatal(err)
					}
				} else if err := m.Ack(ctx); !errors.Is(err, qbroker.ErrNoLease) {
					t.Errorf("Ack at most once: got %v, want ErrNoLease", err)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
			eventually(t, "queue drained", func() (bool, error) {
				st, err := c.Stats(ctx, q)
				return st.Ready == 0 && st.InFlight == 0 && st.Consumers == 1, err
			})
			if err := k.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if _, err := k.Next(ctx); !errors.Is(err, qbroker.ErrClosed) {
				t.Errorf("Next after Close: got %v, want ErrClosed", err)
			}
		})
	}
}

// Nack over the stream redelivers with a higher delivery count; a
// consumer's settlement after its stream ended falls back to the RPC.
func TestConsumeNack(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	createQueue(t, c, "nack", qbroker.QueueOptions{})
	if _, err := c.Publish(ctx, "nack", []byte("x")); err != nil {
		t.Fatal(err)
	}
	k, err := c.Consume(ctx, "nack", qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	m := next(t, k)
	if err := m.Nack(ctx, 0); err != nil {
		t.Fatal(err)
	}
	m = next(t, k)
	if m.DeliveryCount != 2 || string(m.Payload) != "x" {
		t.Fatalf("redelivery: got count %d payload %q, want 2 %q", m.DeliveryCount, m.Payload, "x")
	}
	if _, err := m.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := m.Nack(ctx, -time.Second); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Errorf("Nack(-1s): got %v, want ErrInvalidArgument", err)
	}
	if err := m.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	// Acked on the stream: a second ack goes to the broker, which no
	// longer knows the lease.
	eventually(t, "ack applied", func() (bool, error) {
		st, err := c.Stats(ctx, "nack")
		return st.InFlight == 0, err
	})
	if err := m.Ack(ctx); !errors.Is(err, qbroker.ErrFailedPrecondition) {
		t.Errorf("second Ack: got %v, want ErrFailedPrecondition", err)
	}
}

// Receive in both modes; Nack, Extend and Ack over RPCs; a long poll that
// runs out returns nothing.
func TestReceive(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	createQueue(t, c, "recv", qbroker.QueueOptions{Kind: qbroker.KindPriority})
	for i, p := range []int{5, 1, 3} {
		if _, err := c.Publish(ctx, "recv", []byte(fmt.Sprint(i)), qbroker.WithPriority(p)); err != nil {
			t.Fatal(err)
		}
	}
	ms, err := c.Receive(ctx, "recv", qbroker.ReceiveOptions{Max: 2, Mode: qbroker.AtLeastOnce, Visibility: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Priority != 1 || ms[1].Priority != 3 {
		t.Fatalf("got %d messages %v, want priorities 1 and 3", len(ms), ms)
	}
	deadline, err := ms[0].Extend(ctx, 2*time.Minute)
	if err != nil || time.Until(deadline) < time.Minute {
		t.Errorf("Extend: got %v, %v; want a deadline ~2m ahead", deadline, err)
	}
	if err := ms[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ms[1].Nack(ctx, 0); err != nil {
		t.Fatal(err)
	}
	ms, err = c.Receive(ctx, "recv", qbroker.ReceiveOptions{Max: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Priority != 3 || ms[0].DeliveryCount != 2 || ms[1].Priority != 5 {
		t.Fatalf("got %v, want priority 3 (2nd delivery) then 5", ms)
	}
	start := time.Now()
	ms, err = c.Receive(ctx, "recv", qbroker.ReceiveOptions{Wait: 200 * time.Millisecond})
	if err != nil || len(ms) != 0 {
		t.Fatalf("empty long poll: got %v, %v; want nothing", ms, err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("long poll returned after %v, want ~200ms", d)
	}
}

// Broker statuses come back as sentinels usable with errors.Is, and as
// gRPC statuses.
func TestErrors(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	createQueue(t, c, "fifo", qbroker.QueueOptions{})
	if _, err := c.Publish(ctx, "fifo", []byte("x")); err != nil {
		t.Fatal(err)
	}
	ms, err := c.Receive(ctx, "fifo", qbroker.ReceiveOptions{Mode: qbroker.AtLeastOnce})
	if err != nil || len(ms) != 1 {
		t.Fatalf("Receive: %v, %v", ms, err)
	}
	// A well-formed token of a lease that does not exist: the lease
	// name's last nonce digit changed.
	tok := qbroker.AckToken(ms[0])
	parts := strings.SplitN(tok, "/", 3)
	lease := parts[1]
	parts[1] = lease[:len(lease)-1] + map[bool]string{true: "0", false: "1"}[lease[len(lease)-1] != '0']
	bogus := strings.Join(parts, "/")

	_, errGet := c.GetQueue(ctx, "nope")
	_, errConsume := c.Consume(ctx, "nope", qbroker.ConsumeOptions{})
	_, errPublish := c.Publish(ctx, "nope", []byte("x"))
	_, errName := c.CreateQueue(ctx, "bad/name", qbroker.QueueOptions{})
	_, errExists := c.CreateQueue(ctx, "fifo", qbroker.QueueOptions{MaxDeliveries: 3})
	_, errKind := c.Publish(ctx, "fifo", []byte("x"), qbroker.WithPriority(1))
	_, errPrefetch := c.Consume(ctx, "fifo", qbroker.ConsumeOptions{Prefetch: 5000})
	errBogus := qbroker.WithAckToken(ms[0], bogus).Ack(ctx)
	errMalformed := qbroker.WithAckToken(ms[0], "garbage").Ack(ctx)
	errAck := ms[0].Ack(ctx)
	errAgain := ms[0].Ack(ctx)
	expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, errDeadline := c.Stats(expired, "fifo")

	for _, tc := range []struct {
		name string
		err  error
		want error
		code codes.Code
	}{
		{"GetQueue unknown", errGet, qbroker.ErrNotFound, codes.NotFound},
		{"Consume unknown", errConsume, qbroker.ErrNotFound, codes.NotFound},
		{"Publish unknown", errPublish, qbroker.ErrNotFound, codes.NotFound},
		{"CreateQueue bad name", errName, qbroker.ErrInvalidArgument, codes.InvalidArgument},
		{"CreateQueue other config", errExists, qbroker.ErrAlreadyExists, codes.AlreadyExists},
		{"priority on FIFO", errKind, qbroker.ErrFailedPrecondition, codes.FailedPrecondition},
		{"prefetch too large", errPrefetch, qbroker.ErrInvalidArgument, codes.Unknown},
		{"Ack bogus token", errBogus, qbroker.ErrFailedPrecondition, codes.FailedPrecondition},
		{"Ack malformed token", errMalformed, qbroker.ErrInvalidArgument, codes.InvalidArgument},
		{"Ack", errAck, nil, codes.OK},
		{"Ack twice", errAgain, qbroker.ErrFailedPrecondition, codes.FailedPrecondition},
		{"expired context", errDeadline, context.DeadlineExceeded, codes.DeadlineExceeded},
	} {
		if !errors.Is(tc.err, tc.want) || (tc.want == nil) != (tc.err == nil) {
			t.Errorf("%s: got %v, want errors.Is %v", tc.name, tc.err, tc.want)
		}
		if got := status.Code(tc.err); got != tc.code {
			t.Errorf("%s: got code %v, want %v", tc.name, got, tc.code)
		}
	}
	var e *qbroker.Error
	if !errors.As(errGet, &e) || e.Code != codes.NotFound || e.Message == "" {
		t.Errorf("errors.As(%v): got %+v, want *Error with code NotFound and a message", errGet, e)
	}
}

// Queue administration and dead letters.
func TestAdmin(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	opts := qbroker.QueueOptions{VisibilityTimeout: 5 * time.Second, MaxDeliveries: 1, DeadLetter: true}
	info, err := c.CreateQueue(ctx, "a.jobs", opts)
	if err != nil {
		t.Fatal(err)
	}
	want := qbroker.QueueInfo{Name: "a.jobs", Kind: qbroker.KindFIFO, VisibilityTimeout: 5 * time.Second, MaxDeliveries: 1, DeadLetter: true,
		DedupWindow: 5 * time.Minute, CreatedAt: info.CreatedAt}
	if !reflect.DeepEqual(info, want) || info.CreatedAt.IsZero() {
		t.Errorf("CreateQueue: got %+v, want %+v", info, want)
	}
	if again, err := c.CreateQueue(ctx, "a.jobs", opts); err != nil || !reflect.DeepEqual(again, info) {
		t.Errorf("CreateQueue again: got %+v, %v; want %+v", again, err, info)
	}
	createQueue(t, c, "a.sync", qbroker.QueueOptions{Kind: qbroker.KindSync, SyncMembers: 2})
	createQueue(t, c, "b", qbroker.QueueOptions{})
	qs, err := c.ListQueues(ctx, "a.")
	if err != nil || len(qs) != 2 || qs[0].Name != "a.jobs" || qs[1].Name != "a.sync" || qs[1].Kind != qbroker.KindSync || qs[1].SyncMembers != 2 {
		t.Fatalf("ListQueues(a.): got %+v, %v", qs, err)
	}

	if _, err := c.PublishBatch(ctx, "a.jobs", []qbroker.OutMessage{{Payload: []byte("1")}, {Payload: []byte("2")}, {Payload: []byte("3")}}); err != nil {
		t.Fatal(err)
	}
	ms, err := c.Receive(ctx, "a.jobs", qbroker.ReceiveOptions{Mode: qbroker.AtLeastOnce})
	if err != nil || len(ms) != 1 {
		t.Fatalf("Receive: %v, %v", ms, err)
	}
	st, err := c.Stats(ctx, "a.jobs")
	if err != nil || st.Ready != 2 || st.InFlight != 1 || st.OldestAge <= 0 {
		t.Errorf("Stats: got %+v, %v; want 2 ready, 1 in flight, an age", st, err)
	}
	if err := ms[0].Nack(ctx, 0); err != nil { // past max deliveries: dead
		t.Fatal(err)
	}
	dead, err := c.DeadLetters(ctx, "a.jobs", 0)
	if err != nil || len(dead) != 1 || string(dead[0].Payload) != "1" {
		t.Fatalf("DeadLetters: got %v, %v; want message 1", dead, err)
	}
	if n, err := c.Purge(ctx, "a.jobs"); err != nil || n != 2 {
		t.Errorf("Purge: got %d, %v; want 2", n, err)
	}
	if n, err := c.Redrive(ctx, "a.jobs", dead[0].ID); err != nil || n != 1 {
		t.Errorf("Redrive: got %d, %v; want 1", n, err)
	}
	st, err = c.Stats(ctx, "a.jobs")
	if err != nil || st.Ready != 1 || st.Dead != 0 {
		t.Errorf("Stats after redrive: got %+v, %v; want 1 ready, no dead", st, err)
	}
	if err := c.DeleteQueue(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stats(ctx, "b"); !errors.Is(err, qbroker.ErrNotFound) {
		t.Errorf("Stats of a deleted queue: got %v, want ErrNotFound", err)
	}
}

// Ping answers nil while the broker serves, ErrUnavailable while it
// reports NOT_SERVING (as it does without a ZooKeeper session) and once
// it is gone.
func TestPing(t *testing.T) {
	tb, c := setup(t)
	ctx := testCtx(t)
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	tb.b.Health().SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	if err := c.Ping(ctx); !errors.Is(err, qbroker.ErrUnavailable) || !strings.Contains(err.Error(), "NOT_SERVING") {
		t.Fatalf("Ping of a broker not serving: got %v, want ErrUnavailable naming NOT_SERVING", err)
	}
	tb.stop()
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := c.Ping(short); !errors.Is(err, qbroker.ErrUnavailable) {
		t.Fatalf("Ping of a stopped broker: got %v, want ErrUnavailable", err)
	}
}

// Max bounds the credit: at most once, a consumer limited to 3 messages
// with a prefetch of 10 takes exactly 3 and leaves the rest in the queue.
func TestConsumeMax(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	createQueue(t, c, "max", qbroker.QueueOptions{})
	for i := range 5 {
		if _, err := c.Publish(ctx, "max", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []qbroker.DeliveryMode{qbroker.AtMostOnce, qbroker.AtLeastOnce} {
		k, err := c.Consume(ctx, "max", qbroker.ConsumeOptions{Mode: mode, Prefetch: 10, Max: 2})
		if err != nil {
			t.Fatal(err)
		}
		var n int
		for m := range k.Messages() {
			n++
			if err := m.Ack(ctx); err != nil && mode == qbroker.AtLeastOnce {
				t.Fatal(err)
			}
		}
		<-k.Done() // at least once, after the last ack
		if n != 2 || k.Err() != nil {
			t.Errorf("%v: got %d messages, err %v; want 2, nil", mode, n, k.Err())
		}
	}
	eventually(t, "one message left", func() (bool, error) {
		st, err := c.Stats(ctx, "max")
		return st.Ready == 1 && st.InFlight == 0, err
	})
}

// At most once, a consumer with a large prefetch gives credit back in
// grants of several messages: it still receives every message, in order,
// also those published after it went idle with a grant not yet sent.
func TestConsumeGathersCredit(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	createQueue(t, c, "gather", qbroker.QueueOptions{})
	k, err := c.Consume(ctx, "gather", qbroker.ConsumeOptions{Prefetch: 40})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	n := 0
	for _, count := range []int{101, 7, 1, 45} {
		var batch []qbroker.OutMessage
		for i := n; i < n+count; i++ {
			batch = append(batch, qbroker.OutMessage{Payload: []byte(fmt.Sprintf("m%04d", i))})
		}
		if _, err := c.PublishBatch(ctx, "gather", batch); err != nil {
			t.Fatal(err)
		}
		for i := n; i < n+count; i++ {
			m := next(t, k)
			if got, want := string(m.Payload), fmt.Sprintf("m%04d", i); got != want {
				t.Fatalf("got %s, want %s", got, want)
			}
		}
		n += count
	}
	st, err := c.Stats(ctx, "gather")
	if err != nil || st.Ready != 0 {
		t.Fatalf("Stats: ready %d, %v; want 0", st.Ready, err)
	}
}

// At least once, a consumer gathers its acks, with the credit they give
// back, into few stream requests: on a plain and on a packed queue (where
// the broker applies the acks of one pack lease together), every message
// is delivered once, in order, through batches larger and smaller than
// the prefetch, and every ack is applied, including the last ones, sent
// when the application had nothing left to take.
func TestConsumeGathersSettlements(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	for _, packed := range []bool{false, true} {
		queue := fmt.Sprintf("settle-%v", packed)
		createQueue(t, c, queue, qbroker.QueueOptions{Packed: packed})
		k, err := c.Consume(ctx, queue, qbroker.ConsumeOptions{Prefetch: 40, Mode: qbroker.AtLeastOnce})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, count := range []int{101, 7, 1, 45} {
			var batch []qbroker.OutMessage
			for i := n; i < n+count; i++ {
				batch = append(batch, qbroker.OutMessage{Payload: []byte(fmt.Sprintf("m%04d", i))})
			}
			if _, err := c.PublishBatch(ctx, queue, batch); err != nil {
				t.Fatal(err)
			}
			for i := n; i < n+count; i++ {
				m := next(t, k)
				if got, want := string(m.Payload), fmt.Sprintf("m%04d", i); got != want || m.DeliveryCount != 1 {
					t.Fatalf("packed %v: got %s (delivery %d), want %s once", packed, got, m.DeliveryCount, want)
				}
				if err := m.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
			n += count
			// The last acks went without waiting for a quarter of the
			// prefetch: the queue empties while the stream stays open.
			eventually(t, "every ack applied", func() (bool, error) {
				st, err := c.Stats(ctx, queue)
				return st.Ready == 0 && st.InFlight == 0, err
			})
		}
		if err := k.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// The consumer ends with its context, with the context's error.
func TestConsumeContext(t *testing.T) {
	_, c := setup(t)
	createQueue(t, c, "ctx", qbroker.QueueOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	k, err := c.Consume(ctx, "ctx", qbroker.ConsumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-k.Done()
	if err := k.Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("Err: got %v, want context.Canceled", err)
	}
	if err := k.Close(); !errors.Is(err, context.Canceled) {
		t.Errorf("Close: got %v, want context.Canceled", err)
	}
}

// Closing the client ends its consumers, with the connection's error.
func TestClientCloseEndsConsumer(t *testing.T) {
	tb, _ := setup(t)
	c := dial(t, tb.addr)
	createQueue(t, c, "q", qbroker.QueueOptions{})
	k, err := c.Consume(testCtx(t), "q", qbroker.ConsumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	select {
	case <-k.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("consumer still running 10s after its client closed")
	}
	if k.Err() == nil {
		t.Error("Err: got nil, want the closed connection's error")
	}
}

// Restart the only broker on the same address: the consumer re-subscribes
// and receives what is published to the new broker.
func TestConsumeSurvivesBrokerRestart(t *testing.T) {
	for _, tc := range []struct {
		mode qbroker.DeliveryMode
		hard bool
	}{{qbroker.AtMostOnce, false}, {qbroker.AtLeastOnce, false}, {qbroker.AtMostOnce, true}, {qbroker.AtLeastOnce, true}} {
		mode := tc.mode
		name := mode.String() + map[bool]string{false: "/graceful", true: "/hard"}[tc.hard]
		t.Run(name, func(t *testing.T) {
			root := zktest.Root(t)
			a := startBroker(t, root, "")
			c := dial(t, a.addr)
			ctx := testCtx(t)
			createQueue(t, c, "q", qbroker.QueueOptions{})
			k, err := c.Consume(ctx, "q", qbroker.ConsumeOptions{Mode: mode, Prefetch: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			roundTrip := func(c *qbroker.Client, payload string) {
				t.Helper()
				if _, err := c.Publish(ctx, "q", []byte(payload)); err != nil {
					t.Fatal(err)
				}
				m := next(t, k)
				if string(m.Payload) != payload {
					t.Fatalf("got %q, want %q", m.Payload, payload)
				}
				if mode == qbroker.AtLeastOnce {
					if err := m.Ack(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			roundTrip(c, "before")
			// A settlement on the stream is not confirmed: wait until it
			// was applied, or the stopping broker releases the lease.
			eventually(t, "ack applied", func() (bool, error) {
				st, err := c.Stats(ctx, "q")
				return st.InFlight == 0, err
			})

			if tc.hard {
				a.srv.Stop() // connections cut, no goodbye
			}
			a.stop()
			b := startBroker(t, root, a.addr)
			pub := dial(t, b.addr, qbroker.WithWaitConnected())
			for i := range 3 {
				roundTrip(pub, fmt.Sprint("after-", i))
			}
			if k.Err() != nil {
				t.Errorf("Err: %v", k.Err())
			}
		})
	}
}

// With two brokers, a consumer fails over to whichever is up.
func TestConsumeFailsOver(t *testing.T) {
	root := zktest.Root(t)
	a, b := startBroker(t, root, ""), startBroker(t, root, "")
	c := dial(t, a.addr+","+b.addr)
	ctx := testCtx(t)
	createQueue(t, c, "q", qbroker.QueueOptions{})
	k, err := c.Consume(ctx, "q", qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	via := func(tb *testBroker, payload string) {
		t.Helper()
		pub := dial(t, tb.addr, qbroker.WithWaitConnected())
		if _, err := pub.Publish(ctx, "q", []byte(payload)); err != nil {
			t.Fatal(err)
		}
		m := next(t, k)
		if string(m.Payload) != payload {
			t.Fatalf("got %q, want %q", m.Payload, payload)
		}
		if err := m.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, "ack applied", func() (bool, error) {
			st, err := pub.Stats(ctx, "q")
			return st.InFlight == 0, err
		})
	}
	via(a, "1")
	a.stop()
	via(b, "2") // the stream was on a, or on b all along
	a = startBroker(t, root, a.addr)
	b.stop()
	via(a, "3") // now it must have moved
}

// Closing everything leaves no goroutine behind.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	ignore := append(zktest.IgnoreGoroutines(), goleak.IgnoreCurrent())
	tb := startBroker(t, zktest.Root(t), "")
	c := dial(t, tb.addr)
	ctx := testCtx(t)
	createQueue(t, c, "q", qbroker.QueueOptions{})
	if _, err := c.Publish(ctx, "q", []byte("x")); err != nil {
		t.Fatal(err)
	}
	var ks []*qbroker.Consumer
	for _, mode := range []qbroker.DeliveryMode{qbroker.AtMostOnce, qbroker.AtLeastOnce} {
		k, err := c.Consume(ctx, "q", qbroker.ConsumeOptions{Mode: mode, Prefetch: 3})
		if err != nil {
			t.Fatal(err)
		}
		if len(ks) == 0 {
			next(t, k) // a stream that delivered, and one that waits
		}
		ks = append(ks, k)
	}
	createQueue(t, c, "group", qbroker.QueueOptions{Kind: qbroker.KindSync, SyncMembers: 2})
	m, err := c.JoinSync(ctx, "group", "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Leave(); err != nil {
		t.Errorf("Leave: %v", err)
	}
	for _, k := range ks {
		if err := k.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	c.Close()
	tb.stop()
	goleak.VerifyNone(t, ignore...)
}

func TestDialErrors(t *testing.T) {
	ctx := testCtx(t)
	for _, addr := range []string{"", " , ", "dns:///x:1,127.0.0.1:1"} {
		if _, err := qbroker.Dial(ctx, addr); !errors.Is(err, qbroker.ErrInvalidArgument) {
			t.Errorf("Dial(%q): got %v, want ErrInvalidArgument", addr, err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	// Port 1 on localhost: nothing listens.
	if _, err := qbroker.Dial(short, "127.0.0.1:1", qbroker.WithWaitConnected()); !errors.Is(err, qbroker.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial with nothing listening: got %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	c, err := qbroker.Dial(ctx, "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Publish(ctx, "q", []byte("x")); !errors.Is(err, qbroker.ErrUnavailable) {
		t.Errorf("Publish with nothing listening: got %v, want ErrUnavailable", err)
	}
}

// Close ends the stream gracefully: an ack sent on the stream just before
// is applied, not lost to the lease release at stream end.
func TestCloseAppliesSettlements(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	createQueue(t, c, "q", qbroker.QueueOptions{})
	const n = 10
	for i := range n {
		if _, err := c.Publish(ctx, "q", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		k, err := c.Consume(ctx, "q", qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce})
		if err != nil {
			t.Fatal(err)
		}
		// The ack grants credit for the next message, which Close
		// releases: it comes again with a higher delivery count. The
		// acked one never does.
		m := next(t, k)
		if string(m.Payload) != fmt.Sprint(i) {
			t.Fatalf("got %q, want %d", m.Payload, i)
		}
		if err := m.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if err := k.Close(); err != nil {
			t.Fatal(err)
		}
	}
	st, err := c.Stats(ctx, "q")
	if err != nil || st.Ready != 0 || st.InFlight != 0 {
		t.Errorf("Stats: got %+v, %v; want nothing ready or in flight", st, err)
	}
}
