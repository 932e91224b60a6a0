package broker_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

// dropTokenLine rewrites the tokens file without identity's lines.
func (e *secureEnv) dropTokenLine(t *testing.T, identity string) {
	t.Helper()
	old, err := os.ReadFile(e.files.tokens)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(old), "\n") {
		if l != "" && !strings.HasPrefix(l, identity+" ") {
			lines = append(lines, l)
		}
	}
	writeFile(t, e.files.tokens, strings.Join(lines, "\n")+"\n")
}

// watched is a stream read on a goroutine of its own: how many messages
// it received, and the error it ended with.
type watched struct {
	mu   sync.Mutex
	n    int
	err  error
	done chan struct{}
}

func watch(recv func() error) *watched {
	w := &watched{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			err := recv()
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			w.n++
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *watched) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// ended waits up to d for the stream to end and returns its error.
func (w *watched) ended(t *testing.T, what string, d time.Duration) error {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(d):
		t.Fatalf("%s: still open after %v (%d messages received)", what, d, w.count())
	}
	return w.err
}

// mustEnd waits for the stream to end with code and a message holding
// want.
func (w *watched) mustEnd(t *testing.T, what string, code codes.Code, want string) {
	t.Helper()
	err := w.ended(t, what, 30*time.Second)
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("%s ended with %v; want %v naming %q", what, err, code, want)
	}
}

const revokeRules = `admin   all                            *
worker  publish,consume,lock,election,join  *
`

// openStreams opens, as conn's caller, an at-most-once Consume of queue,
// a Lock stream holding lock and an Observe stream of election, and
// waits until each works: a delivery, the grant, the leader.
func openStreams(t *testing.T, ctx context.Context, conn, admin *grpc.ClientConn, queue, lock, election string) (consume, held, observe *watched) {
	t.Helper()
	cs, err := pb.NewQueueClient(conn).Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue,
		Mode: pb.DeliveryMode_DELIVERY_MODE_AT_MOST_ONCE, Prefetch: 10}}); err != nil {
		t.Fatal(err)
	}
	consume = watch(func() error { _, err := cs.Recv(); return err })

	ls, err := pb.NewLockClient(conn).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Send(&pb.LockRequest{Name: lock}); err != nil {
		t.Fatal(err)
	}
	held = watch(func() error { _, err := ls.Recv(); return err })

	// admin leads the election; conn's caller observes it.
	camp, err := pb.NewElectionClient(admin).Campaign(ctx, &pb.CampaignRequest{Name: election, Value: []byte("admin")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := camp.Recv(); err != nil {
		t.Fatalf("admin Campaign: %v", err)
	}
	obs, err := pb.NewElectionClient(conn).Observe(ctx, &pb.ObserveRequest{Name: election})
	if err != nil {
		t.Fatal(err)
	}
	observe = watch(func() error { _, err := obs.Recv(); return err })

	zktest.WaitFor(t, 30*time.Second, "the streams to work", func() bool {
		return consume.count() > 0 && held.count() > 0 && observe.count() > 0
	})
	return consume, held, observe
}

// publishing publishes to queue as c until the test ends or stop is
// called.
func publishing(t *testing.T, c pb.QueueClient, queue string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			_, _ = c.Publish(ctx, &pb.PublishRequest{Queue: queue, Messages: []*pb.OutMessage{{Payload: fmt.Appendf(nil, "m%d", i)}}})
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// lockFree checks that another caller gets lock at once: the ended
// stream released it.
func lockFree(t *testing.T, ctx context.Context, conn *grpc.ClientConn, lock string) {
	t.Helper()
	ls, err := pb.NewLockClient(conn).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Send(&pb.LockRequest{Name: lock}); err != nil {
		t.Fatal(err)
	}
	ev, err := ls.Recv()
	if err != nil || ev.GetType() != pb.LockEvent_TYPE_GRANTED {
		t.Fatalf("Lock after the holder's stream ended: got %v, %v; want GRANTED", ev, err)
	}
}

// leftInQueue checks that a message published now is still there for
// another consumer: the ended Consume stream took nothing more.
func leftInQueue(t *testing.T, ctx context.Context, admin pb.QueueClient, queue string) {
	t.Helper()
	if _, err := admin.Publish(ctx, &pb.PublishRequest{Queue: queue, Messages: []*pb.OutMessage{{Payload: []byte("after")}}}); err != nil {
		t.Fatal(err)
	}
	var got []string
	zktest.WaitFor(t, 30*time.Second, "the message published after the stream ended", func() bool {
		r, err := admin.Receive(ctx, &pb.ReceiveRequest{Queue: queue, MaxMessages: 100})
		if err != nil {
			t.Fatalf("Receive: %v", err)
		}
		for _, m := range r.GetMessages() {
			got = append(got, string(m.GetPayload()))
		}
		// Not necessarily the last: a publish the stopped publisher
		// cancelled may still commit after it.
		return slices.Contains(got, "after")
	})
}

// TestRevokedTokenEndsStreams: removing a token's line from the tokens
// file ends the open streams of its identity, an at-most-once Consume, a
// Lock, an Observe, a Campaign and a JoinSync, with Unauthenticated
// naming the revocation; the Consume stream takes nothing more, the lock
// and the leadership are released and the member leaves its group.
func TestRevokedTokenEndsStreams(t *testing.T) {
	e := newAuthBroker(t, revokeRules, []string{"admin", "worker"})
	ctx := callCtx(t)
	adminConn := dialTLS(t, e.tb.addr, e.roots(), nil, e.tokens["admin"])
	workerConn := dialTLS(t, e.tb.addr, e.roots(), nil, e.tokens["worker"])
	admin := pb.NewQueueClient(adminConn)
	createQueue(t, admin, &pb.CreateQueueRequest{Name: "jobs"})
	stop := publishing(t, admin, "jobs")

	createQueue(t, admin, &pb.CreateQueueRequest{Name: "crew", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 2})

	consume, held, observe := openStreams(t, ctx, workerConn, adminConn, "jobs", "nightly", "scheduler")
	camp, err := pb.NewElectionClient(workerConn).Campaign(ctx, &pb.CampaignRequest{Name: "mover", Value: []byte("worker")})
	if err != nil {
		t.Fatal(err)
	}
	campaign := watch(func() error { _, err := camp.Recv(); return err })
	js, err := pb.NewQueueClient(workerConn).JoinSync(ctx, &pb.JoinSyncRequest{Queue: "crew", MemberId: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	joined := watch(func() error { _, err := js.Recv(); return err })
	zktest.WaitFor(t, 30*time.Second, "the campaign to lead and the member to join", func() bool {
		return campaign.count() > 0 && joined.count() > 0
	})

	e.dropTokenLine(t, "worker")
	want := "token for identity worker was revoked"
	consume.mustEnd(t, "Consume", codes.Unauthenticated, want)
	held.mustEnd(t, "Lock", codes.Unauthenticated, want)
	observe.mustEnd(t, "Observe", codes.Unauthenticated, want)
	campaign.mustEnd(t, "Campaign", codes.Unauthenticated, want)
	joined.mustEnd(t, "JoinSync", codes.Unauthenticated, want)
	stop()

	lockFree(t, ctx, adminConn, "nightly")
	leftInQueue(t, ctx, admin, "jobs")
	ac, err := pb.NewElectionClient(adminConn).Campaign(ctx, &pb.CampaignRequest{Name: "mover", Value: []byte("admin")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ac.Recv(); err != nil {
		t.Fatalf("Campaign after the leader's stream ended: %v", err)
	}
	zktest.WaitFor(t, 30*time.Second, "the ended member to leave the group", func() bool {
		st, err := admin.Stats(ctx, &pb.StatsRequest{Name: "crew"})
		return err == nil && st.GetSyncJoined() == 0
	})
	_, err = pb.NewQueueClient(workerConn).ListQueues(ctx, &pb.ListQueuesRequest{})
	mustCode(t, "a new call with the revoked token", err, codes.Unauthenticated)
}

// TestRuleChangeEndsStreams: a rules file that no longer grants consume
// on a queue ends the Consume streams on it with PermissionDenied naming
// the action and the queue; a stream the new rules still allow (a Lock)
// stays.
func TestRuleChangeEndsStreams(t *testing.T) {
	e := newAuthBroker(t, revokeRules, []string{"admin", "worker"})
	ctx := callCtx(t)
	adminConn := dialTLS(t, e.tb.addr, e.roots(), nil, e.tokens["admin"])
	workerConn := dialTLS(t, e.tb.addr, e.roots(), nil, e.tokens["worker"])
	admin := pb.NewQueueClient(adminConn)
	createQueue(t, admin, &pb.CreateQueueRequest{Name: "jobs"})
	stop := publishing(t, admin, "jobs")

	consume, held, observe := openStreams(t, ctx, workerConn, adminConn, "jobs", "nightly", "scheduler")
	writeFile(t, e.files.rules, "admin all *\nworker publish,lock,election *\n")
	consume.mustEnd(t, "Consume", codes.PermissionDenied, `rules no longer allow worker to consume queue "jobs"`)
	stop()
	leftInQueue(t, ctx, admin, "jobs")

	// The same pass re-checked the other streams: they stay open. A
	// second change then takes the lock away.
	if isDone(held) {
		t.Fatalf("the Lock stream ended although the rules still allow it: %v", held.err)
	}
	if isDone(observe) {
		t.Fatalf("the Observe stream ended although the rules still allow it: %v", observe.err)
	}
	writeFile(t, e.files.rules, "admin all *\nworker publish,election *\n")
	held.mustEnd(t, "Lock", codes.PermissionDenied, `rules no longer allow worker to lock lock "nightly"`)
	lockFree(t, ctx, adminConn, "nightly")
}

func isDone(w *watched) bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// TestExpiredCertificateEndsStreams: a stream authenticated by a client
// certificate ends when the certificate expires, naming the expiry.
func TestExpiredCertificateEndsStreams(t *testing.T) {
	e := newAuthBroker(t, revokeRules, []string{"admin"})
	ctx := callCtx(t)
	admin := e.as(t, "admin")
	createQueue(t, admin, &pb.CreateQueueRequest{Name: "jobs"})
	stop := publishing(t, admin, "jobs")
	defer stop()
	// A certificate valid for 3s more (a slow machine may take longer to
	// open the stream: then try again with a new one).
	var consume *watched
	for consume == nil {
		cert := clientCert(t, e.ca, "worker", time.Now().Add(3*time.Second))
		w := consumeStream(t, ctx, pb.NewQueueClient(dialTLS(t, e.tb.addr, e.roots(), &cert, "")), "jobs")
		zktest.WaitFor(t, 30*time.Second, "a delivery or the stream's end", func() bool { return w.count() > 0 || isDone(w) })
		if w.count() > 0 {
			consume = w
		}
	}
	consume.mustEnd(t, "Consume of an expiring certificate", codes.Unauthenticated,
		"client certificate for identity worker is no longer valid: client certificate expired at")
}
