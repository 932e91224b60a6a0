package broker_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/internal/natsbridge"
	"github.com/qbroker/qbroker/internal/zktest"
)

// scrape fetches url and parses the Prometheus text format.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value returns the value of the series of name whose labels include
// want, summed over the rest; -1 when there is none.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f, ok := fams[name]
	if !ok {
		return -1
	}
	sum, found := 0.0, false
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	if !found {
		return -1
	}
	return sum
}

// After a scripted workload the broker's /metrics counters equal what was
// done, and queue labels beyond the cap share "_other".
func TestMetricsAfterWorkload(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := newBroker(t, zktest.Root(t), func(c *broker.Config) {
		c.Registerer = reg
		c.MaxQueueLabels = 2
		c.StatsInterval = 100 * time.Millisecond
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: time.Second}
	go func() { _ = hs.Serve(lis) }()
	t.Cleanup(func() { hs.Close() })
	url := "http://" + lis.Addr().String() + "/metrics"
	ctx := context.Background()

	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "m", MaxDeliveries: 2, DeadLetter: true})
	publishN(t, b.client, "m", 10)
	if got := len(receive(t, b.client, &pb.ReceiveRequest{Queue: "m", MaxMessages: 4})); got != 4 {
		t.Fatalf("received %d, want 4", got)
	}
	leased := receive(t, b.client, &pb.ReceiveRequest{Queue: "m", Mode: alo, MaxMessages: 3})
	for _, m := range leased[:2] {
		if _, err := b.client.Ack(ctx, &pb.AckRequest{AckToken: m.GetAckToken()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: leased[2].GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	again := receive(t, b.client, &pb.ReceiveRequest{Queue: "m", Mode: alo})
	if len(again) != 1 || again[0].GetDeliveryCount() != 2 {
		t.Fatalf("redelivery: got %v", again)
	}
	if _, err := b.client.Nack(ctx, &pb.NackRequest{AckToken: again[0].GetAckToken()}); err != nil {
		t.Fatal(err) // second delivery of max 2: dead-lettered
	}
	// Two more queues: the second is beyond the label cap of 2.
	for _, q := range []string{"n", "o"} {
		createQueue(t, b.client, &pb.CreateQueueRequest{Name: q})
		publishN(t, b.client, q, 1)
	}

	fams := scrape(t, url)
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"qbroker_messages_published_total", map[string]string{"queue": "m"}, 10},
		{"qbroker_messages_delivered_total", map[string]string{"queue": "m", "mode": "at_most_once"}, 4},
		{"qbroker_messages_delivered_total", map[string]string{"queue": "m", "mode": "at_least_once"}, 4},
		{"qbroker_messages_acked_total", map[string]string{"queue": "m"}, 2},
		{"qbroker_messages_nacked_total", map[string]string{"queue": "m"}, 2},
		{"qbroker_messages_redelivered_total", map[string]string{"queue": "m"}, 1},
		{"qbroker_messages_dead_lettered_total", map[string]string{"queue": "m"}, 1},
		{"qbroker_claim_conflicts_total", map[string]string{"queue": "m"}, 0}, // one consumer: no races
		{"qbroker_messages_published_total", map[string]string{"queue": "n"}, 1},
		{"qbroker_messages_published_total", map[string]string{"queue": "_other"}, 1},
		{"qbroker_messages_published_total", map[string]string{"queue": "o"}, -1},
		// Created at 0 with the queue's label, so rate sees the first.
		{"qbroker_messages_acked_total", map[string]string{"queue": "n"}, 0},
		{"qbroker_messages_dead_lettered_total", map[string]string{"queue": "n"}, 0},
		{"qbroker_messages_delivered_total", map[string]string{"queue": "n", "mode": "at_least_once"}, 0},
		{"qbroker_zk_session_state", nil, 1},
		{"qbroker_build_info", nil, 1},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "Publish", "grpc_code": "OK"}, 3},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "Nack", "grpc_code": "OK"}, 2},
	}
	for _, c := range checks {
		if got := value(fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := value(fams, "qbroker_zk_request_duration_seconds", map[string]string{"op": "multi", "result": "ok"}); got < 5 {
		t.Errorf("zk multi requests observed: %v, want >= 5", got)
	}
	// Every write through group commit is observed, whatever multi it
	// shared: the publishes, claims and acks above are more than 5.
	if got := value(fams, "qbroker_zk_commit_seconds", map[string]string{"result": "ok"}); got < 5 {
		t.Errorf("writes through group commit observed: %v, want >= 5", got)
	}
	if got := value(fams, "qbroker_leader", nil); got != 1 {
		t.Errorf("qbroker_leader = %v, want 1 (the only broker leads)", got)
	}
	// The queue gauges, refreshed every StatsInterval: 3 ready (10 less 4
	// at most once, 2 acked, 1 dead), 1 dead letter.
	zktest.WaitFor(t, 30*time.Second, "the queue gauges", func() bool {
		fams := scrape(t, url)
		return value(fams, "qbroker_queue_dead", map[string]string{"queue": "m"}) == 1 &&
			value(fams, "qbroker_queue_depth", map[string]string{"queue": "m"}) == 3 &&
			value(fams, "qbroker_queue_dead", map[string]string{"queue": "n"}) == 0
	})
}

// The NATS bridge carries every kind of event with the right fields; when
// NATS dies mid-load the queue path is unaffected and drops are counted.
func TestEventsToNATS(t *testing.T) {
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(ns.Shutdown)
	reg := prometheus.NewRegistry()
	bridge, err := natsbridge.New(natsbridge.Config{URL: ns.ClientURL(), Registerer: reg, BrokerID: "b1", IncludePayload: true, MaxPayload: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bridge.Close(context.Background()) })
	got := subscribeEvents(t, ns.ClientURL())

	b := newBroker(t, zktest.Root(t), func(c *broker.Config) { c.Events = bridge; c.ID = "b1" })
	ms := causeEveryEvent(t, b.client)
	want := map[string]int{
		"qbroker.ev.published": 2, "qbroker.ev.delivered": 2, "qbroker.ev.acked": 1,
		"qbroker.ev.nacked": 1, "qbroker.ev.dead_lettered": 1, "qbroker.grp.sync_joined": 2,
	}
	seen := map[string]int{}
	deadline := time.After(10 * time.Second)
	for !covers(seen, want) || seen["qbroker.grp.sync_opened"] == 0 {
		select {
		case m := <-got:
			seen[m.Subject]++
			checkEvent(t, m, ms)
		case <-deadline:
			t.Fatalf("events seen %v, want at least %v and sync_opened", seen, want)
		}
	}

	// NATS dies mid-load: the broker keeps moving messages; the bridge
	// counts what it could not send.
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "load"})
	publishN(t, b.client, "load", 500)
	ns.Shutdown()
	publishN(t, b.client, "load", 500)
	n := 0
	for n < 1000 {
		ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "load", MaxMessages: 100})
		if len(ms) == 0 {
			t.Fatalf("queue ran dry after %d of 1000 messages", n)
		}
		n += len(ms)
	}
	if err := bridge.Close(context.Background()); err != nil {
		t.Logf("bridge close: %v", err)
	}
	sent, dropped := bridge.Stats()
	t.Logf("bridge sent %d, dropped %d", sent, dropped)
	if dropped == 0 {
		t.Error("NATS was down for 1,000 publishes and deliveries but no event was counted as dropped")
	}
	if metricDrops := counterSum(t, reg, "qbroker_events_dropped_total"); metricDrops != float64(dropped) {
		t.Errorf("qbroker_events_dropped_total = %v, bridge reports %d", metricDrops, dropped)
	}
}

// subscribeEvents subscribes to every qbroker event on the NATS server at
// url until the test ends.
func subscribeEvents(t *testing.T, url string) <-chan *nats.Msg {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	got := make(chan *nats.Msg, 1000)
	sub, err := nc.ChanSubscribe("qbroker.>", got)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return got
}

// causeEveryEvent makes the broker emit each kind of event: two messages
// published to "ev" and delivered at least once, one acked and one nacked
// (max deliveries 1: dead-lettered), two members joining the sync queue
// "grp", which opens. It returns the two messages.
func causeEveryEvent(t *testing.T, c pb.QueueClient) []*pb.Message {
	t.Helper()
	ctx := context.Background()
	createQueue(t, c, &pb.CreateQueueRequest{Name: "ev", MaxDeliveries: 1, DeadLetter: true})
	if _, err := c.Publish(ctx, &pb.PublishRequest{Queue: "ev", Messages: []*pb.OutMessage{{Payload: []byte("one")}, {Payload: []byte("two")}}}); err != nil {
		t.Fatal(err)
	}
	ms := receive(t, c, &pb.ReceiveRequest{Queue: "ev", Mode: alo, MaxMessages: 2})
	if _, err := c.Ack(ctx, &pb.AckRequest{AckToken: ms[0].GetAckToken()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Nack(ctx, &pb.NackRequest{AckToken: ms[1].GetAckToken()}); err != nil {
		t.Fatal(err) // max deliveries 1: dead-lettered
	}
	createQueue(t, c, &pb.CreateQueueRequest{Name: "grp", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 2})
	m1 := join(t, c, "grp", "a")
	m1.next(t)
	m2 := join(t, c, "grp", "b")
	for ev := m2.next(t); ev.GetState() != pb.SyncEvent_STATE_OPEN; ev = m2.next(t) {
	}
	return ms
}

// checkEvent fails the test if the event in m lacks a field, or, for the
// queue "ev", is not about one of ms (ms[0] acked on first delivery).
func checkEvent(t *testing.T, m *nats.Msg, ms []*pb.Message) {
	t.Helper()
	var e events.Event
	if err := json.Unmarshal(m.Data, &e); err != nil {
		t.Fatalf("event body %q: %v", m.Data, err)
	}
	parts := strings.Split(m.Subject, ".")
	if e.Queue != parts[1] || string(e.Kind) != parts[2] || e.Broker != "b1" || e.Time.IsZero() || e.ID == "" {
		t.Errorf("event on %s has fields %+v", m.Subject, e)
	}
	if e.Queue == "ev" && (e.MessageID != ms[0].GetId() && e.MessageID != ms[1].GetId() || e.Size != 3) {
		t.Errorf("message event %+v: want one of the published ids, size 3", e)
	}
	if e.Kind == events.Published && string(e.Payload) != "one" && string(e.Payload) != "two" {
		t.Errorf("published event without its payload: %+v", e)
	}
	if e.Kind == events.Acked && (e.MessageID != ms[0].GetId() || e.DeliveryCount != 1) {
		t.Errorf("acked event %+v, want %s with delivery count 1", e, ms[0].GetId())
	}
	if e.Kind == events.SyncJoined && e.Member == "" {
		t.Errorf("sync_joined without member: %+v", e)
	}
}

func covers(seen, want map[string]int) bool {
	for k, v := range want {
		if seen[k] < v {
			return false
		}
	}
	return true
}

// A fresh broker exports every refusal reason at 0, so that a rate over
// them sees the first refusal, and its ZooKeeper data budget beside the
// data it counts.
func TestMetricsFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	newBroker(t, zktest.Root(t), func(c *broker.Config) {
		c.Registerer = reg
		c.ZKDataBudget = 64 << 20
	})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	for name, reasons := range map[string][]string{
		"qbroker_streams_refused_total":     {"max_streams", "no_subscribe"},
		"qbroker_connections_refused_total": {"max_conns", "per_ip", "evicted_unproven", "handshake_timeout"},
	} {
		for _, r := range reasons {
			if got := value(byName, name, map[string]string{"reason": r}); got != 0 {
				t.Errorf("%s{reason=%q} = %v before any refusal, want a series at 0", name, r, got)
			}
		}
	}
	if got := value(byName, "qbroker_zk_data_budget_bytes", nil); got != 64<<20 {
		t.Errorf("qbroker_zk_data_budget_bytes = %v, want the configured 64 MiB", got)
	}
}

// The gRPC server series keep the names, labels and counting rules of
// go-grpc-middleware's Prometheus provider: every method's series exist
// from the start; a unary call is one message received and, when it
// succeeds, one sent; a stream counts each message.
func TestGRPCServerMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := newBroker(t, zktest.Root(t), func(c *broker.Config) { c.Registerer = reg })
	gather := func() map[string]*dto.MetricFamily {
		fs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		fams := map[string]*dto.MetricFamily{}
		for _, f := range fs {
			fams[f.GetName()] = f
		}
		return fams
	}
	svc := pb.Queue_ServiceDesc.ServiceName
	publish := map[string]string{"grpc_type": "unary", "grpc_service": svc, "grpc_method": "Publish"}
	consume := map[string]string{"grpc_type": "bidi_stream", "grpc_service": svc, "grpc_method": "Consume"}
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	if got := value(gather(), "grpc_server_handled_total", with(publish, "grpc_code", "Unavailable")); got != 0 {
		t.Fatalf("a method's series before its first call: got %v, want 0", got)
	}

	ctx := context.Background()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "g"})
	for range 2 {
		if _, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: "g", Messages: []*pb.OutMessage{{Payload: []byte("x")}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.client.Publish(ctx, &pb.PublishRequest{Queue: "missing", Messages: []*pb.OutMessage{{Payload: []byte("x")}}}); err == nil {
		t.Fatal("publish into a missing queue succeeded")
	}
	stream, err := b.client.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "g", Mode: alo}}); err != nil {
		t.Fatal(err)
	}
	d, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Settle: []*pb.Settle{{AckToken: d.GetMessage().GetAckToken()}}}); err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err == nil {
		t.Fatal("a second delivery with prefetch 1 and no credit given back")
	}
	zktest.WaitFor(t, 10*time.Second, "the Consume stream's end counted", func() bool {
		return value(gather(), "grpc_server_handled_total", with(consume, "grpc_code", "OK")) == 1
	})

	fams := gather()
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"grpc_server_started_total", publish, 3},
		{"grpc_server_handled_total", with(publish, "grpc_code", "OK"), 2},
		{"grpc_server_handled_total", with(publish, "grpc_code", "NotFound"), 1},
		{"grpc_server_handling_seconds", publish, 3},
		{"grpc_server_msg_received_total", publish, 3},
		{"grpc_server_msg_sent_total", publish, 2},
		{"grpc_server_started_total", consume, 1},
		{"grpc_server_msg_received_total", consume, 2},
		{"grpc_server_msg_sent_total", consume, 1},
		{"grpc_server_handling_seconds", consume, 1},
	}
	for _, c := range checks {
		if got := value(fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
