package broker_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// markDeleting stages a DeleteQueue that marked queue name for deletion
// (its first step) and went no further; it returns the marked version.
func markDeleting(t *testing.T, conn *zk.Conn, root, name string) int32 {
	t.Helper()
	p := root + "/queues/" + name
	data, st, err := conn.Get(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["deleting"] = true
	data, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	st, err = conn.Set(p, data, st.Version)
	if err != nil {
		t.Fatal(err)
	}
	return st.Version
}

// queueCalls makes every call that names a queue and returns each one's
// error (nil when it succeeded).
func queueCalls(ctx context.Context, c pb.QueueClient, name, token string) map[string]error {
	errs := map[string]error{}
	_, errs["GetQueue"] = c.GetQueue(ctx, &pb.GetQueueRequest{Name: name})
	_, errs["Stats"] = c.Stats(ctx, &pb.StatsRequest{Name: name})
	_, errs["Publish"] = c.Publish(ctx, &pb.PublishRequest{Queue: name, Messages: []*pb.OutMessage{{Payload: []byte("x")}}})
	_, errs["Receive"] = c.Receive(ctx, &pb.ReceiveRequest{Queue: name, Mode: alo})
	_, errs["Purge"] = c.Purge(ctx, &pb.PurgeRequest{Name: name})
	_, errs["ListDeadLetters"] = c.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{Queue: name})
	_, errs["Redrive"] = c.Redrive(ctx, &pb.RedriveRequest{Queue: name})
	if token != "" {
		_, errs["Ack"] = c.Ack(ctx, &pb.AckRequest{AckToken: token})
		_, errs["ExtendLease"] = c.ExtendLease(ctx, &pb.ExtendLeaseRequest{AckToken: token})
	}
	stream, err := c.Consume(ctx)
	if err == nil {
		err = stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: name}})
	}
	if err == nil {
		_, err = stream.Recv()
	}
	errs["Consume"] = err
	return errs
}

func listed(t *testing.T, c pb.QueueClient, name string) bool {
	t.Helper()
	resp, err := c.ListQueues(context.Background(), &pb.ListQueuesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(resp.GetQueues(), func(q *pb.QueueInfo) bool { return q.GetName() == name })
}

// A queue whose deletion was marked and then abandoned half-way (the
// deleter died after removing the ready messages) is absent: every call
// answers NotFound, ListQueues skips it, and none of them creates any of
// its nodes again: loading a queue never writes. CreateQueue then finishes
// the deletion and creates the queue anew, empty.
func TestMarkedQueueIsAbsentAndNotRecreated(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	served, fresh := newBroker(t, root), newBroker(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createQueue(t, served.client, &pb.CreateQueueRequest{Name: "q"})
	publishN(t, served.client, "q", 3)
	ms := receive(t, served.client, &pb.ReceiveRequest{Queue: "q", Mode: alo})
	if len(ms) != 1 {
		t.Fatalf("received %d, want 1", len(ms))
	}
	q := root + "/queues/q"
	markDeleting(t, conn, root, "q")
	if err := zkutil.DeleteTree(ctx, conn, q+"/items", nil); err != nil {
		t.Fatal(err)
	}

	// The broker that served the queue drops its handle when its
	// metadata watch fires; one that never opened it reads the mark.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := served.client.GetQueue(ctx, &pb.GetQueueRequest{Name: "q"})
		if status.Code(err) == codes.NotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetQueue of a queue marked for deletion: got %v, want NotFound", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, b := range []*testBroker{served, fresh} {
		for call, err := range queueCalls(ctx, b.client, "q", ms[0].GetAckToken()) {
			if status.Code(err) != codes.NotFound {
				t.Errorf("%s of a queue being deleted: got %v, want NotFound", call, err)
			}
		}
		if listed(t, b.client, "q") {
			t.Error("ListQueues lists a queue being deleted")
		}
	}
	if zktest.Exists(t, conn, q+"/items") {
		t.Fatal("the deleted items parent was created again")
	}

	info, err := fresh.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "q", MaxDeliveries: 3})
	if err != nil {
		t.Fatalf("CreateQueue over a queue being deleted: %v", err)
	}
	if info.GetMaxDeliveries() != 3 {
		t.Errorf("created %+v, want the new configuration", info)
	}
	if st := stats(t, served.client, "q"); st.GetReady()+st.GetInFlight()+st.GetDead() != 0 {
		t.Errorf("the new queue holds %+v, want nothing", st)
	}
	for _, c := range []string{"items", "leases", "dead", "consumers", "members"} {
		if !zktest.Exists(t, conn, q+"/"+c) {
			t.Errorf("the new queue has no %s", c)
		}
	}
}

// A deletion abandoned after its mark, with nodes created after the mark
// (a publisher's message, a consumer's registration, a lease, a sync
// queue's start), is finished by the next DeleteQueue, which answers OK;
// the one after answers NotFound.
func TestDeleteQueueFinishesAbandonedDeletion(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	b := newBroker(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	publishN(t, b.client, "q", 600)
	q := root + "/queues/q"
	markDeleting(t, conn, root, "q")
	acl := zk.WorldACL(zk.PermAll)
	for _, n := range []struct {
		path  string
		flags int32
	}{
		{q + "/items/qn-", zk.FlagSequence},
		{q + "/consumers/other-", zk.FlagEphemeral | zk.FlagSequence},
		{q + "/leases/qn-0000000001~0123456789abcdef", 0},
		{q + "/start", 0},
	} {
		if _, err := conn.Create(n.path, nil, n.flags, acl); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.client.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "q"}); err != nil {
		t.Fatalf("DeleteQueue of a marked queue: %v", err)
	}
	if zktest.Exists(t, conn, q) {
		t.Fatal("the queue's node survived")
	}
	if _, err := b.client.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "q"}); status.Code(err) != codes.NotFound {
		t.Fatalf("DeleteQueue again: got %v, want NotFound", err)
	}
}

// Two DeleteQueue calls of one queue on two brokers cooperate: each
// answers OK or NotFound, at least one OK, and the queue is gone.
func TestConcurrentDeletesCooperate(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	a, b := newBroker(t, root), newBroker(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for round := 0; round < 5; round++ {
		createQueue(t, a.client, &pb.CreateQueueRequest{Name: "q"})
		publishN(t, a.client, "q", 1000)
		if round%2 == 1 {
			markDeleting(t, conn, root, "q") // a third deleter died after its mark
		}
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, tb := range []*testBroker{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = tb.client.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "q"})
			}()
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch status.Code(err) {
			case codes.OK:
				ok++
			case codes.NotFound:
			default:
				t.Fatalf("round %d: concurrent DeleteQueue: %v", round, err)
			}
		}
		if ok == 0 {
			t.Fatalf("round %d: no DeleteQueue answered OK: %v", round, errs)
		}
		if zktest.Exists(t, conn, root+"/queues/q") {
			t.Fatalf("round %d: the queue survived", round)
		}
	}
}

// A deleter that resumes after another call finished its deletion and a
// CreateQueue made the queue anew leaves the new queue alone: its deletes
// are conditional on the version of the metadata it marked.
func TestStaleDeleterSparesNewQueue(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	b := newBroker(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	publishN(t, b.client, "q", 5)
	marked := markDeleting(t, conn, root, "q")
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"}) // finishes the deletion
	publishN(t, b.client, "q", 2)
	if err := b.b.RemoveQueueAt(ctx, "q", marked); err != nil {
		t.Fatalf("the stale deleter: %v", err)
	}
	if st := stats(t, b.client, "q"); st.GetReady() != 2 {
		t.Fatalf("the new queue holds %d messages, want 2", st.GetReady())
	}
}

// A queue left without some of its parents by an interrupted deletion of
// an earlier release (metadata not marked): calls answer NotFound without
// creating anything; CreateQueue with the same configuration creates the
// missing parents; DeleteQueue removes it.
func TestQueueMissingParents(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	b := newBroker(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := root + "/queues/q"
	for _, name := range []string{"q", "r"} {
		createQueue(t, b.client, &pb.CreateQueueRequest{Name: name})
		for _, c := range []string{"items", "leases"} {
			if err := conn.Delete(root+"/queues/"+name+"/"+c, -1); err != nil {
				t.Fatal(err)
			}
		}
	}
	errs := queueCalls(ctx, b.client, "q", "")
	for _, call := range []string{"Publish", "Receive", "Stats", "Purge", "Consume"} {
		if status.Code(errs[call]) != codes.NotFound {
			t.Errorf("%s of a queue without items: got %v, want NotFound", call, errs[call])
		}
	}
	if zktest.Exists(t, conn, q+"/items") || zktest.Exists(t, conn, q+"/leases") {
		t.Fatal("a call created a missing parent")
	}
	if _, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "q", MaxDeliveries: 2}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("CreateQueue with another configuration: got %v, want AlreadyExists", err)
	}
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	publishN(t, b.client, "q", 1)
	if ms := receive(t, b.client, &pb.ReceiveRequest{Queue: "q", Mode: alo}); len(ms) != 1 {
		t.Fatalf("received %d from the repaired queue, want 1", len(ms))
	}
	if _, err := b.client.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "r"}); err != nil {
		t.Fatal(err)
	}
	if zktest.Exists(t, conn, root+"/queues/r") {
		t.Fatal("r survived its deletion")
	}
}

// The leader finishes a deletion abandoned longer than abandonedAfter.
func TestLeaderFinishesAbandonedDeletion(t *testing.T) {
	defer broker.SetAbandonedAfter(0)()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	b := newBroker(t, root)
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "q"})
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "kept"})
	publishN(t, b.client, "q", 10)
	markDeleting(t, conn, root, "q")
	deadline := time.Now().Add(30 * time.Second)
	for zktest.Exists(t, conn, root+"/queues/q") {
		if time.Now().After(deadline) {
			t.Fatal("the leader did not finish the deletion")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !listed(t, b.client, "kept") {
		t.Fatal("the leader deleted another queue")
	}
	b.stop() // before the restore runs
}

// CreateQueue beyond MaxQueues fails with ResourceExhausted naming the
// limit; an existing queue can still be "created" again, and a deletion
// makes room. Out-of-range limits fail at startup.
func TestMaxQueues(t *testing.T) {
	root := zktest.Root(t)
	b := newBroker(t, root, func(c *broker.Config) { c.MaxQueues = 3 })
	ctx := context.Background()
	for _, n := range []string{"a", "b", "c"} {
		createQueue(t, b.client, &pb.CreateQueueRequest{Name: n})
	}
	_, err := b.client.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "d"})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "at most 3") {
		t.Fatalf("fourth queue: got %v, want ResourceExhausted naming the limit 3", err)
	}
	if listed(t, b.client, "d") {
		t.Fatal("the refused queue exists")
	}
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "a"})
	if _, err := b.client.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	createQueue(t, b.client, &pb.CreateQueueRequest{Name: "d"})

	for _, n := range []int{-1, 20_001} {
		_, err := broker.New(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, MaxQueues: n})
		if err == nil || !strings.Contains(err.Error(), "--max-queues") {
			t.Errorf("MaxQueues %d: got %v, want an error naming --max-queues", n, err)
		}
	}
}

// A queue deleted on one broker while another serves it (a Consume stream
// open, leases held, its handle cached): the other's calls answer NotFound
// (an ack of a lease of the deleted queue: FailedPrecondition), and the
// queue stays deleted.
func TestDeletedQueueStaysDeleted(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	serving, deleting := newBroker(t, root), newBroker(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createQueue(t, serving.client, &pb.CreateQueueRequest{Name: "q", VisibilityTimeout: durationpb.New(200 * time.Millisecond)})
	publishN(t, serving.client, "q", 20)
	ms := receive(t, serving.client, &pb.ReceiveRequest{Queue: "q", Mode: alo, MaxMessages: 5})
	stream, err := serving.client.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: "q", Mode: alo, Prefetch: 5}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := deleting.client.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	// The stream used its credit; more makes it claim again.
	if err := stream.Send(&pb.ConsumeRequest{Credit: 5}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := stream.Recv()
		if err == nil {
			continue // sent before the deletion
		}
		if status.Code(err) != codes.NotFound {
			t.Fatalf("stream of a deleted queue: got %v, want NotFound", err)
		}
		break
	}
	for call, err := range queueCalls(ctx, serving.client, "q", ms[0].GetAckToken()) {
		if c := status.Code(err); c != codes.NotFound && !(c == codes.FailedPrecondition && (call == "Ack" || call == "ExtendLease")) {
			t.Errorf("%s of a deleted queue: got %v, want NotFound", call, err)
		}
	}
	// The leases expire meanwhile: give the leader's sweep (every 100 ms)
	// a few rounds with them before looking.
	time.Sleep(500 * time.Millisecond)
	if zktest.Exists(t, conn, root+"/queues/q") {
		t.Fatal("the deleted queue came back")
	}
}

// adminOp is one CreateQueue or DeleteQueue call of the stress test.
type adminOp struct {
	create     bool
	start, end time.Time
	code       codes.Code
}

// effect is what a call did to its queue: present (a create), absent (a
// delete), none, or unknown (a delete that failed may have marked the
// queue, which makes it absent).
func (o adminOp) effect() (present, definite, maybeAbsent bool) {
	switch {
	case o.create && o.code == codes.OK:
		return true, true, false
	case !o.create && o.code == codes.OK:
		return false, true, false
	case !o.create && o.code != codes.NotFound:
		return false, false, true
	}
	return false, false, false
}

// allowedFinal returns the states (present true/false) a queue may be in
// after ops: the effect of any op that can be linearized last, that is,
// no op with an effect started after it ended.
func allowedFinal(ops []adminOp) map[bool]bool {
	allowed := map[bool]bool{}
	var definite []adminOp
	for _, o := range ops {
		if _, d, _ := o.effect(); d {
			definite = append(definite, o)
		}
	}
	if len(definite) == 0 {
		allowed[false] = true // never created
	}
	for _, x := range ops {
		present, d, maybe := x.effect()
		if !d && !maybe {
			continue
		}
		last := true
		for _, y := range definite {
			if y.start.After(x.end) {
				last = false
				break
			}
		}
		if last {
			allowed[present] = true
		}
	}
	return allowed
}

// Publishers, consumers (Consume streams and Receive, acking or letting
// leases expire), Stats and listing callers, and two callers per queue
// name creating and deleting it, on two brokers: no call answers Internal
// (nor Unknown, Unavailable or DeadlineExceeded), and afterwards each
// queue is present or absent as its successful creates and deletes left
// it (nothing deleted comes back, nothing created is lost), complete if
// present and without a node if absent.
func TestDeleteQueueStress(t *testing.T) {
	defer broker.SetAbandonedAfter(time.Second)()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := &deleteStress{
		ctx:     ctx,
		brokers: []*testBroker{newBroker(t, root), newBroker(t, root)},
		names:   []string{"q0", "q1", "q2", "q3", "q4", "q5"},
		stopAt:  time.Now().Add(8 * time.Second),
		seen:    map[string]map[codes.Code]int{},
		ops:     map[string][]adminOp{},
	}
	s.start()
	s.wg.Wait()
	t.Logf("codes by call: %v", s.seen)
	for call, cs := range s.seen {
		for _, c := range []codes.Code{codes.Internal, codes.Unknown, codes.Unavailable, codes.DeadlineExceeded, codes.AlreadyExists} {
			if cs[c] > 0 {
				t.Errorf("%s answered %v %d times", call, c, cs[c])
			}
		}
	}
	if s.seen["DeleteQueue"][codes.OK] == 0 || s.seen["CreateQueue"][codes.OK] == 0 || s.seen["Publish"][codes.OK] == 0 {
		t.Fatalf("the load did not run: %v", s.seen)
	}

	// Deletions left marked by failed calls are finished by the leader.
	deadline := time.Now().Add(30 * time.Second)
	for _, name := range s.names {
		for {
			data, _, err := conn.Get(root + "/queues/" + name)
			if err != nil || !strings.Contains(string(data), `"deleting":true`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s stays marked for deletion", name)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	determinate := 0
	for _, name := range s.names {
		allowed := allowedFinal(s.ops[name])
		if len(allowed) == 1 {
			determinate++
		}
		s.checkFinal(t, conn, root+"/queues/"+name, name, allowed)
	}
	t.Logf("%d of %d names ended with one possible state", determinate, len(s.names))
}

// deleteStress is the load of TestDeleteQueueStress: workers calling the
// brokers at random on the queues names until stopAt, recording each
// call's status code and each queue's creates and deletes.
type deleteStress struct {
	ctx     context.Context
	brokers []*testBroker
	names   []string
	stopAt  time.Time
	wg      sync.WaitGroup

	mu   sync.Mutex
	seen map[string]map[codes.Code]int // call -> code -> calls
	ops  map[string][]adminOp          // queue -> creates and deletes
}

// start starts the workers: two admins per name, 4 publishers, 2
// receivers, 2 consumers and 2 observers.
func (s *deleteStress) start() {
	// Two admins per name, one per broker; the second stops earlier, so
	// most names end with a call no other overlaps.
	for i, name := range s.names {
		for j, tb := range s.brokers {
			stop := s.stopAt.Add(-time.Duration(j) * 700 * time.Millisecond)
			s.run(uint64(i*10+j+1), func(r *uint64) bool { return s.admin(r, tb, name, stop) })
		}
	}
	for i := 0; i < 4; i++ {
		s.run(uint64(100+i), s.publish)
	}
	for i := 0; i < 2; i++ {
		s.run(uint64(200+i), s.receive)
		s.run(uint64(300+i), s.consume)
		s.run(uint64(400+i), s.observe)
	}
}

// run calls f in a new goroutine until stopAt, the end of the test's
// context, or f returns false.
func (s *deleteStress) run(seed uint64, f func(r *uint64) bool) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		r := seed
		for time.Now().Before(s.stopAt) && s.ctx.Err() == nil && f(&r) {
		}
	}()
}

// pick returns a number in [0, n) from the xorshift state r: no shared
// rand state between the workers.
func pick(r *uint64, n int) int {
	*r ^= *r << 13
	*r ^= *r >> 7
	*r ^= *r << 17
	return int(*r % uint64(n))
}

// record counts err's code for call and returns it.
func (s *deleteStress) record(call string, err error) codes.Code {
	c := status.Code(err)
	s.mu.Lock()
	if s.seen[call] == nil {
		s.seen[call] = map[codes.Code]int{}
	}
	s.seen[call][c]++
	s.mu.Unlock()
	return c
}

// pickTarget picks a broker and a queue name.
func (s *deleteStress) pickTarget(r *uint64) (*testBroker, string) {
	return s.brokers[pick(r, 2)], s.names[pick(r, len(s.names))]
}

// admin creates or deletes name on tb until stop, and records the call.
func (s *deleteStress) admin(r *uint64, tb *testBroker, name string, stop time.Time) bool {
	if time.Now().After(stop) {
		return false
	}
	op := adminOp{create: pick(r, 2) == 0, start: time.Now()}
	var err error
	if op.create {
		_, err = tb.client.CreateQueue(s.ctx, &pb.CreateQueueRequest{Name: name, VisibilityTimeout: durationpb.New(time.Second)})
		op.code = s.record("CreateQueue", err)
	} else {
		_, err = tb.client.DeleteQueue(s.ctx, &pb.DeleteQueueRequest{Name: name})
		op.code = s.record("DeleteQueue", err)
	}
	op.end = time.Now()
	s.mu.Lock()
	s.ops[name] = append(s.ops[name], op)
	s.mu.Unlock()
	time.Sleep(time.Duration(pick(r, 100)) * time.Millisecond)
	return true
}

// publish publishes a batch of 1 to 10 messages.
func (s *deleteStress) publish(r *uint64) bool {
	tb, name := s.pickTarget(r)
	req := &pb.PublishRequest{Queue: name}
	for n := pick(r, 10); n >= 0; n-- {
		req.Messages = append(req.Messages, &pb.OutMessage{Payload: []byte("m")})
	}
	_, err := tb.client.Publish(s.ctx, req)
	s.record("Publish", err)
	return true
}

// receive receives at least once, acks some (on either broker) and lets
// the rest expire.
func (s *deleteStress) receive(r *uint64) bool {
	tb, name := s.pickTarget(r)
	resp, err := tb.client.Receive(s.ctx, &pb.ReceiveRequest{Queue: name, Mode: alo, MaxMessages: 5})
	if s.record("Receive", err) == codes.OK {
		for _, m := range resp.GetMessages() {
			if pick(r, 3) > 0 {
				_, err := s.brokers[pick(r, 2)].client.Ack(s.ctx, &pb.AckRequest{AckToken: m.GetAckToken()})
				s.record("Ack", err)
			}
		}
	}
	return true
}

// consume consumes on a Consume stream for up to 600 ms, acking on the
// stream.
func (s *deleteStress) consume(r *uint64) bool {
	tb, name := s.pickTarget(r)
	sctx, scancel := context.WithTimeout(s.ctx, time.Duration(100+pick(r, 500))*time.Millisecond)
	defer scancel()
	stream, err := tb.client.Consume(sctx)
	if err == nil {
		err = stream.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: name, Mode: alo, Prefetch: 10}})
	}
	for err == nil {
		var d *pb.Delivery
		if d, err = stream.Recv(); err == nil {
			err = stream.Send(&pb.ConsumeRequest{Credit: 1, Settle: []*pb.Settle{{AckToken: d.GetMessage().GetAckToken()}}})
		}
	}
	if dl, _ := sctx.Deadline(); time.Now().Before(dl) {
		s.record("Consume", err) // ended by the broker, not by our timeout
	}
	return true
}

// observe reads a queue's stats and description and lists the queues.
func (s *deleteStress) observe(r *uint64) bool {
	tb, name := s.pickTarget(r)
	_, err := tb.client.Stats(s.ctx, &pb.StatsRequest{Name: name})
	s.record("Stats", err)
	_, err = tb.client.GetQueue(s.ctx, &pb.GetQueueRequest{Name: name})
	s.record("GetQueue", err)
	_, err = tb.client.ListQueues(s.ctx, &pb.ListQueuesRequest{})
	s.record("ListQueues", err)
	return true
}

// checkFinal fails the test unless the queue name at p is present or
// absent as allowed, and, if present, complete and delivering.
func (s *deleteStress) checkFinal(t *testing.T, conn *zk.Conn, p, name string, allowed map[bool]bool) {
	t.Helper()
	present := zktest.Exists(t, conn, p)
	if !allowed[present] {
		t.Errorf("%s: present %v, but its calls allow only %v", name, present, allowed)
		return
	}
	if !present {
		return
	}
	for _, c := range []string{"items", "leases", "dead", "consumers", "members"} {
		if !zktest.Exists(t, conn, p+"/"+c) {
			t.Errorf("%s: present without %s", name, c)
		}
	}
	publishN(t, s.brokers[0].client, name, 1)
	deadline := time.Now().Add(20 * time.Second)
	for len(receive(t, s.brokers[1].client, &pb.ReceiveRequest{Queue: name})) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: a message published after the run is not delivered", name)
		}
	}
}
