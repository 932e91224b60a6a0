package natsbridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/internal/ports"
	"github.com/qbroker/qbroker/internal/zktest"
)

func testEvent(queue string, kind events.Kind, n int) events.Event {
	msg := fmt.Sprintf("qn-%010d", n)
	return events.Event{
		ID:            events.MakeID(queue, msg, kind, 1, ""),
		Kind:          kind,
		Queue:         queue,
		MessageID:     msg,
		Priority:      3,
		Size:          100,
		DeliveryCount: 1,
		Time:          time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
	}
}

// TestEventsPerKind checks subject and body of every event kind, the payload
// cap, the Broker default and the per-kind metric.
func TestEventsPerKind(t *testing.T) {
	srv := runServer(t, -1, false)
	sub := subscribe(t, srv, "qbroker.>")
	b, reg := newBridge(t, Config{
		URL:            srv.ClientURL(),
		BrokerID:       "broker-1",
		IncludePayload: true,
		MaxPayload:     16,
	})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	if problems, err := promlint.NewWithMetricFamilies(mfs).Lint(); err != nil || len(problems) > 0 {
		t.Errorf("metrics lint: %v %v", problems, err)
	}

	kinds := []events.Kind{
		events.Published, events.Delivered, events.Acked, events.Nacked,
		events.DeadLettered, events.SyncJoined, events.SyncOpened,
	}
	small := []byte("0123456789abcdef") // exactly at the cap: included
	want := eventsOfKinds(kinds, small)
	over := testEvent("jobs", events.Published, 99)
	over.Payload = []byte("0123456789abcdef!") // one over: omitted
	over.Broker = "broker-2"                   // kept: only an empty Broker is filled
	want = append(want, over)

	for _, e := range want {
		b.Emit(e)
	}
	small[0] = 'X' // Emit copied the payload: the change must not show
	got := receive(t, sub, len(want), 10*time.Second)

	for i, r := range got {
		w := want[i]
		if w.Broker == "" {
			w.Broker = "broker-1"
		}
		wantPayload := []byte("0123456789abcdef")
		if i == len(want)-1 {
			wantPayload = nil
		}
		checkReceived(t, i, r, w, wantPayload)
	}

	closeBridge(t, b)
	if sent, dropped := b.Stats(); sent != uint64(len(want)) || dropped != 0 {
		t.Errorf("Stats() = %d, %d, want %d, 0", sent, dropped, len(want))
	}
	for _, k := range kinds {
		wantN := 1.0
		if k == events.Published {
			wantN = 2
		}
		if got := metricValue(t, reg, "qbroker_events_published_total", "event", string(k)); got != wantN {
			t.Errorf("qbroker_events_published_total{event=%q} = %v, want %v", k, got, wantN)
		}
	}
}

// eventsOfKinds returns an event of each kind in order, on the queue
// "orders.eu", with payload; sync events have a member and no message.
func eventsOfKinds(kinds []events.Kind, payload []byte) []events.Event {
	var out []events.Event
	for i, k := range kinds {
		e := testEvent("orders.eu", k, i)
		e.Payload = payload
		if k == events.SyncJoined || k == events.SyncOpened {
			e.MessageID = ""
			e.Member = "m-1"
			e.ID = events.MakeID(e.Queue, "", k, 0, e.Member)
		}
		out = append(out, e)
	}
	return out
}

// checkReceived fails the test unless r, the i-th event received, is w
// on its subject, with wantPayload (nil: no payload field).
func checkReceived(t *testing.T, i int, r received, w events.Event, wantPayload []byte) {
	t.Helper()
	wantSubject := "qbroker." + SubjectToken(w.Queue) + "." + string(w.Kind)
	if r.subject != wantSubject {
		t.Errorf("event %d: subject %q, want %q", i, r.subject, wantSubject)
	}
	e := r.event
	if !bytes.Equal(e.Payload, wantPayload) {
		t.Errorf("event %d (%s): payload %q, want %q", i, w.Kind, e.Payload, wantPayload)
	}
	if e.ID != w.ID || e.Kind != w.Kind || e.Queue != w.Queue || e.MessageID != w.MessageID ||
		e.Priority != w.Priority || e.Size != w.Size || e.DeliveryCount != w.DeliveryCount ||
		e.Member != w.Member || e.Broker != w.Broker || !e.Time.Equal(w.Time) {
		t.Errorf("event %d: got %+v, want %+v", i, e, w)
	}
	if _, ok := r.raw["payload"]; ok != (wantPayload != nil) {
		t.Errorf("event %d: payload field present %v, want %v", i, ok, wantPayload != nil)
	}
}

// TestPayloadExcluded checks that payloads are left out unless asked for.
func TestPayloadExcluded(t *testing.T) {
	srv := runServer(t, -1, false)
	sub := subscribe(t, srv, "qbroker.>")
	b, _ := newBridge(t, Config{URL: srv.ClientURL(), SubjectPrefix: "qbroker.test"})
	e := testEvent("q", events.Acked, 1)
	e.Payload = []byte("tiny")
	b.Emit(e)
	r := receive(t, sub, 1, 10*time.Second)[0]
	if r.subject != "qbroker.test.q.acked" {
		t.Errorf("subject %q, want %q", r.subject, "qbroker.test.q.acked")
	}
	if _, ok := r.raw["payload"]; ok {
		t.Errorf("payload present without IncludePayload: %v", r.raw["payload"])
	}
	if r.event.Size != 100 {
		t.Errorf("size %d, want 100", r.event.Size)
	}
}

// TestNATSKilledMidLoad kills the server while events are emitted in a
// tight loop: Emit must not block and every event is either sent or counted
// as dropped.
func TestNATSKilledMidLoad(t *testing.T) {
	srv := runServer(t, -1, false)
	b, reg := newBridge(t, Config{
		URL:              srv.ClientURL(),
		ReconnectWait:    50 * time.Millisecond,
		ReconnectBufSize: 64 << 10,
	})
	const total = 200_000
	emitted := 0
	var loopTime time.Duration
	emit := func(n int) {
		start := time.Now()
		for range n {
			b.Emit(testEvent("load", events.Published, emitted))
			emitted++
			if emitted == total/4 {
				go srv.Shutdown() // kill NATS in the middle of the first half
			}
		}
		loopTime += time.Since(start)
	}
	emit(total / 2)
	srv.WaitForShutdown()
	zktest.WaitFor(t, 10*time.Second, "the bridge to see the disconnection", func() bool { return !b.Connected() })
	if got := metricValue(t, reg, "qbroker_nats_connected"); got != 0 {
		t.Errorf("qbroker_nats_connected = %v while NATS is down, want 0", got)
	}
	emit(total / 2) // with NATS known to be down
	t.Logf("emitting %d events took %v", total, loopTime)
	if loopTime > 10*time.Second {
		t.Errorf("emitting %d events took %v, want Emit not to block (bound 10s)", total, loopTime)
	}

	closeBridge(t, b)
	sent, dropped := b.Stats()
	t.Logf("sent %d, dropped %d (buffer_full %v, publish_error %v, closed %v)", sent, dropped,
		metricValue(t, reg, "qbroker_events_dropped_total", "reason", ReasonBufferFull),
		metricValue(t, reg, "qbroker_events_dropped_total", "reason", ReasonPublishError),
		metricValue(t, reg, "qbroker_events_dropped_total", "reason", ReasonClosed))
	if sent+dropped != total {
		t.Errorf("sent %d + dropped %d = %d, want %d", sent, dropped, sent+dropped, total)
	}
	if dropped == 0 {
		t.Error("dropped = 0, want drops with NATS down")
	}
	if got := metricValue(t, reg, "qbroker_events_dropped_total", "reason", ReasonBufferFull); got == 0 {
		t.Error("qbroker_events_dropped_total{reason=buffer_full} = 0, want > 0: events wait in the bounded buffer while NATS is down")
	}
	var metricDropped float64
	for _, reason := range []string{ReasonBufferFull, ReasonPublishError, ReasonClosed} {
		metricDropped += metricValue(t, reg, "qbroker_events_dropped_total", "reason", reason)
	}
	if metricDropped != float64(dropped) {
		t.Errorf("qbroker_events_dropped_total sums to %v, want %d", metricDropped, dropped)
	}
	if got := metricValue(t, reg, "qbroker_events_published_total", "event", "published"); got != float64(sent) {
		t.Errorf("qbroker_events_published_total = %v, want %d", got, sent)
	}
}

// TestReconnect restarts NATS on the same port: events flow again.
func TestReconnect(t *testing.T) {
	srv := runServer(t, -1, false)
	port := serverPort(t, srv)
	sub := subscribe(t, srv, "qbroker.>")
	b, reg := newBridge(t, Config{URL: srv.ClientURL(), ReconnectWait: 50 * time.Millisecond})
	for i := range 10 {
		b.Emit(testEvent("r", events.Published, i))
	}
	receive(t, sub, 10, 10*time.Second)
	if got := metricValue(t, reg, "qbroker_nats_connected"); got != 1 {
		t.Errorf("qbroker_nats_connected = %v, want 1", got)
	}

	srv.Shutdown()
	zktest.WaitFor(t, 10*time.Second, "disconnection", func() bool { return !b.Connected() })

	srv2 := runServer(t, port, false)
	zktest.WaitFor(t, 10*time.Second, "reconnection", b.Connected)
	sub2 := subscribe(t, srv2, "qbroker.>")
	for i := 10; i < 20; i++ {
		b.Emit(testEvent("r", events.Acked, i))
	}
	for _, r := range receive(t, sub2, 10, 10*time.Second) {
		if r.event.Kind != events.Acked {
			t.Errorf("after reconnect got %s event, want acked", r.event.Kind)
		}
	}
	if got := metricValue(t, reg, "qbroker_nats_reconnects_total"); got < 1 {
		t.Errorf("qbroker_nats_reconnects_total = %v, want >= 1", got)
	}
	if got := metricValue(t, reg, "qbroker_nats_connected"); got != 1 {
		t.Errorf("qbroker_nats_connected = %v after reconnect, want 1", got)
	}
	closeBridge(t, b)
	if sent, dropped := b.Stats(); sent != 20 || dropped != 0 {
		t.Errorf("Stats() = %d, %d, want 20, 0", sent, dropped)
	}
}

// TestStartWithNATSDown starts the bridge before NATS (JetStream mode): it
// connects, creates the stream and publishes once the server is up.
func TestStartWithNATSDown(t *testing.T) {
	ps, err := ports.Free(1) // the server starts on it later
	if err != nil {
		t.Fatal(err)
	}
	port := ps[0]

	b, _ := newBridge(t, Config{
		URL:           fmt.Sprintf("nats://127.0.0.1:%d", port),
		ReconnectWait: 50 * time.Millisecond,
		JetStream:     true,
		Stream:        "LATE",
	})
	if b.Connected() {
		t.Fatal("Connected() = true with no server")
	}
	b.Emit(testEvent("late", events.Published, 0)) // must not block nor fail

	srv := runServer(t, port, true)
	zktest.WaitFor(t, 10*time.Second, "connection", b.Connected)
	const n = 20
	for i := 1; i <= n; i++ {
		b.Emit(testEvent("late", events.Published, i))
	}
	zktest.WaitFor(t, 10*time.Second, "acks", func() bool { sent, _ := b.Stats(); return sent >= n })
	closeBridge(t, b)
	sent, dropped := b.Stats()
	if sent+dropped != n+1 {
		t.Errorf("sent %d + dropped %d, want %d", sent, dropped, n+1)
	}
	if msgs := streamMsgs(t, srv, "LATE"); msgs != sent {
		t.Errorf("stream has %d messages, want %d (sent)", msgs, sent)
	}
}

func streamMsgs(t *testing.T, srv interface{ ClientURL() string }, name string) uint64 {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	return info.State.Msgs
}

// TestJetStreamDedup re-emits the same event: the stream stores it once.
func TestJetStreamDedup(t *testing.T) {
	srv := runServer(t, -1, true)
	b, _ := newBridge(t, Config{
		URL:             srv.ClientURL(),
		JetStream:       true,
		Stream:          "EVENTS",
		DuplicateWindow: time.Minute,
	})
	waitSent := func(n uint64) {
		zktest.WaitFor(t, 10*time.Second, fmt.Sprintf("%d acks", n), func() bool { sent, _ := b.Stats(); return sent >= n })
	}

	e := testEvent("orders", events.Delivered, 1)
	b.Emit(e)
	e.Broker = "another-broker" // the same event re-emitted elsewhere: same ID
	b.Emit(e)
	waitSent(2)
	if got := streamMsgs(t, srv, "EVENTS"); got != 1 {
		t.Errorf("same ID twice: stream has %d messages, want 1", got)
	}

	e2 := testEvent("orders", events.Delivered, 2)
	b.Emit(e2)
	waitSent(3)
	if got := streamMsgs(t, srv, "EVENTS"); got != 2 {
		t.Errorf("after a different ID: stream has %d messages, want 2", got)
	}

	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if len(cfg.Subjects) != 1 || cfg.Subjects[0] != "qbroker.>" || cfg.Duplicates != time.Minute {
		t.Errorf("stream subjects %v, duplicates %v, want [qbroker.>], 1m", cfg.Subjects, cfg.Duplicates)
	}
	m, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get(jetstream.MsgIDHeader); got != e.ID {
		t.Errorf("Nats-Msg-Id = %q, want %q", got, e.ID)
	}
	if m.Subject != "qbroker.orders.delivered" {
		t.Errorf("stored subject %q, want qbroker.orders.delivered", m.Subject)
	}
	closeBridge(t, b)
	if sent, dropped := b.Stats(); sent != 3 || dropped != 0 {
		t.Errorf("Stats() = %d, %d, want 3, 0", sent, dropped)
	}
}

// TestCloseDrains emits a burst and closes at once: every event emitted
// before Close is delivered.
func TestCloseDrains(t *testing.T) {
	const n = 5000
	t.Run("core", func(t *testing.T) {
		srv := runServer(t, -1, false)
		sub := subscribe(t, srv, "qbroker.>")
		b, _ := newBridge(t, Config{URL: srv.ClientURL()})
		for i := range n {
			b.Emit(testEvent("drain", events.Published, i))
		}
		closeBridge(t, b)
		if sent, dropped := b.Stats(); sent != n || dropped != 0 {
			t.Fatalf("Stats() = %d, %d, want %d, 0", sent, dropped, n)
		}
		got := receive(t, sub, n, 10*time.Second)
		for i, r := range got {
			if want := fmt.Sprintf("qn-%010d", i); r.event.MessageID != want {
				t.Fatalf("message %d: id %s, want %s (in order)", i, r.event.MessageID, want)
			}
		}
	})
	t.Run("jetstream", func(t *testing.T) {
		srv := runServer(t, -1, true)
		b, _ := newBridge(t, Config{URL: srv.ClientURL(), JetStream: true})
		zktest.WaitFor(t, 10*time.Second, "connection", b.Connected)
		for i := range n {
			b.Emit(testEvent("drain", events.Published, i))
		}
		closeBridge(t, b)
		if sent, dropped := b.Stats(); sent != n || dropped != 0 {
			t.Fatalf("Stats() = %d, %d, want %d, 0", sent, dropped, n)
		}
		if got := streamMsgs(t, srv, DefaultStream); got != n {
			t.Errorf("stream has %d messages, want %d", got, n)
		}
	})
}

// TestEmitAfterClose: events after Close are counted as dropped (closed), a
// second Close reports ErrClosed, and a cancelled Close still accounts for
// every event.
func TestEmitAfterClose(t *testing.T) {
	srv := runServer(t, -1, false)
	b, reg := newBridge(t, Config{URL: srv.ClientURL()})
	b.Emit(testEvent("c", events.Acked, 0))
	closeBridge(t, b)
	b.Emit(testEvent("c", events.Acked, 1))
	if sent, dropped := b.Stats(); sent != 1 || dropped != 1 {
		t.Errorf("Stats() = %d, %d, want 1, 1", sent, dropped)
	}
	if got := metricValue(t, reg, "qbroker_events_dropped_total", "reason", ReasonClosed); got != 1 {
		t.Errorf("dropped{closed} = %v, want 1", got)
	}
	if err := b.Close(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close = %v, want ErrClosed", err)
	}
}

func TestCloseCancelled(t *testing.T) {
	srv := runServer(t, -1, false)
	b, _ := newBridge(t, Config{URL: srv.ClientURL()})
	const n = DefaultBufferSize
	for i := range n {
		b.Emit(testEvent("c", events.Acked, i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Close(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Close(cancelled) = %v, want nil or context.Canceled", err)
	}
	if sent, dropped := b.Stats(); sent+dropped != n {
		t.Errorf("sent %d + dropped %d, want %d", sent, dropped, n)
	}
}

func TestOneBridgePerRegistry(t *testing.T) {
	srv := runServer(t, -1, false)
	reg := prometheus.NewRegistry()
	b, err := New(Config{URL: srv.ClientURL(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer closeBridge(t, b)
	if b2, err := New(Config{URL: srv.ClientURL(), Registerer: reg}); err == nil {
		closeBridge(t, b2)
		t.Fatal("second New on the same registry succeeded, want an error")
	}
}

// BenchmarkEmit measures the caller's cost of Emit with a live server.
func BenchmarkEmit(b *testing.B) {
	srv := runServer(b, -1, false)
	br, err := New(Config{URL: srv.ClientURL(), BufferSize: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	e := testEvent("bench", events.Published, 1)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			br.Emit(e)
		}
	})
	b.StopTimer()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := br.Close(ctx); err != nil {
		b.Fatal(err)
	}
	sent, dropped := br.Stats()
	b.ReportMetric(float64(dropped)/float64(sent+dropped), "dropped/op")
}
