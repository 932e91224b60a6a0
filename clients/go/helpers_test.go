package qbroker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/zktest"
)

// testBroker is an in-process broker on a real 127.0.0.1 listener.
type testBroker struct {
	s    *brokertest.Server
	b    *broker.Broker
	srv  *grpc.Server
	addr string
}

// startBroker starts a broker under root on addr ("" picks a free port),
// stopped when the test ends.
func startBroker(t testing.TB, root, addr string) *testBroker {
	t.Helper()
	tb, err := newBroker(zktest.Addr(t), root, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tb.stop)
	return tb
}

func newBroker(zkAddr, root, addr string) (*testBroker, error) {
	return serveBroker(broker.Config{
		ZooKeeper:      []string{zkAddr},
		Root:           root,
		SweepInterval:  100 * time.Millisecond,
		SessionTimeout: 4 * time.Second,
	}, addr)
}

// serveBroker starts a broker with cfg on addr ("" picks a free port);
// the caller stops it.
func serveBroker(cfg broker.Config, addr string) (*testBroker, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, cfg, brokertest.Options{Addr: addr})
	if err != nil {
		return nil, err
	}
	return &testBroker{s: s, b: s.Broker, srv: s.GRPC, addr: s.Addr}, nil
}

// stop shuts the broker down the way `qbroker serve` does. Only the first
// call does anything.
func (tb *testBroker) stop() { tb.s.Stop() }

// dial returns a client closed when the test ends.
func dial(t testing.TB, addr string, opts ...qbroker.Option) *qbroker.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts = append([]qbroker.Option{qbroker.WithCallTimeout(10 * time.Second), qbroker.WithReconnectBackoff(50*time.Millisecond, time.Second)}, opts...)
	c, err := qbroker.Dial(ctx, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// setup starts a broker with a fresh root and returns a client of it.
func setup(t testing.TB) (*testBroker, *qbroker.Client) {
	t.Helper()
	tb := startBroker(t, zktest.Root(t), "")
	return tb, dial(t, tb.addr)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func createQueue(t testing.TB, c *qbroker.Client, name string, o qbroker.QueueOptions) {
	t.Helper()
	if _, err := c.CreateQueue(testCtx(t), name, o); err != nil {
		t.Fatalf("CreateQueue(%s): %v", name, err)
	}
}

// next takes the consumer's next message within 10s.
func next(t testing.TB, k *qbroker.Consumer) *qbroker.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := k.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v (consumer err %v)", err, k.Err())
	}
	return m
}

// eventually polls cond every 20ms for up to 10s.
func eventually(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func randomRoot() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "/example-" + hex.EncodeToString(b[:])
}
