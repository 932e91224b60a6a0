package broker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/zktest"
)

func electionClient(tb *testBroker) pb.ElectionClient { return pb.NewElectionClient(tb.grpcConn) }

// wantCode fails the test unless err has code want.
func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if status.Code(err) != want {
		t.Errorf("%s: got %v, want %v", what, err, want)
	}
}

// observed collects an Observe stream's leaders.
type observed struct {
	mu      sync.Mutex
	leaders []*pb.LeaderInfo
}

func (o *observed) seen(key, value string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, l := range o.leaders {
		if l.GetKey() == key && string(l.GetValue()) == value {
			return true
		}
	}
	return false
}

func observe(t *testing.T, ctx context.Context, c pb.ElectionClient, name string) *observed {
	t.Helper()
	s, err := c.Observe(ctx, &pb.ObserveRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	o := &observed{}
	go func() {
		for {
			l, err := s.Recv()
			if err != nil {
				return
			}
			o.mu.Lock()
			o.leaders = append(o.leaders, l)
			o.mu.Unlock()
		}
	}()
	return o
}

// Six candidates, three on each of two brokers (so a broker's candidates
// of one election take turns), each campaign twice: exactly one leads at
// any time, Leader names it on both brokers, the observer sees every
// leadership with growing tokens, and ending the stream resigns.
func TestElectionOverGRPC(t *testing.T) {
	root := zktest.Root(t)
	brokers := []*testBroker{newBroker(t, root), newBroker(t, root)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	obs := observe(t, ctx, electionClient(brokers[0]), "sched")

	var leading atomic.Int32
	var mu sync.Mutex
	var tokens []int64
	errs := make(chan error, 12)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := electionClient(brokers[i%2])
			for round := range 2 {
				value := fmt.Sprintf("c%d-%d", i, round)
				errs <- leadOnce(ctx, c, electionClient(brokers[(i+1)%2]), value, &leading, obs, func(tok int64) {
					mu.Lock()
					tokens = append(tokens, tok)
					mu.Unlock()
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(tokens) != 12 {
		t.Fatalf("%d leaderships, want 12", len(tokens))
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens %v do not grow", tokens)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for i := 1; i < len(obs.leaders); i++ {
		if obs.leaders[i].GetToken() < obs.leaders[i-1].GetToken() {
			t.Fatalf("observed tokens decrease: %v", obs.leaders)
		}
	}
}

// leadOnce campaigns with value through c, checks it leads alone and that
// other (another broker) names it, waits until the observer saw it, then
// resigns by ending the stream.
func leadOnce(ctx context.Context, c, other pb.ElectionClient, value string, leading *atomic.Int32,
	obs *observed, token func(int64)) error {
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s, err := c.Campaign(sctx, &pb.CampaignRequest{Name: "sched", Value: []byte(value)})
	if err != nil {
		return err
	}
	ev, err := s.Recv()
	if err != nil {
		return fmt.Errorf("%s: campaign: %w", value, err)
	}
	if n := leading.Add(1); n != 1 || ev.GetType() != pb.LeaderEvent_TYPE_LEADING {
		return fmt.Errorf("%s: %d leaders at once, event %v", value, n, ev)
	}
	token(ev.GetToken())
	l, err := other.Leader(ctx, &pb.LeaderRequest{Name: "sched"})
	if err != nil || l.GetKey() != ev.GetKey() || string(l.GetValue()) != value || l.GetToken() != ev.GetToken() {
		return fmt.Errorf("%s: Leader on the other broker = %v, %v; want %v", value, l, err, ev)
	}
	for !obs.seen(ev.GetKey(), value) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: the observer never saw it", value)
		case <-time.After(10 * time.Millisecond):
		}
	}
	leading.Add(-1)
	return nil // stop ends the stream: resigns
}

// Proclaim and Resign by key work from another broker: the observer sees
// the new value; the resigned candidate's stream gets LOST and Aborted.
func TestElectionByKey(t *testing.T) {
	root := zktest.Root(t)
	b1, b2 := newBroker(t, root), newBroker(t, root)
	c1, c2 := electionClient(b1), electionClient(b2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	obs := observe(t, ctx, c2, "e")
	s, err := c1.Campaign(ctx, &pb.CampaignRequest{Name: "e", Value: []byte("v1")})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Proclaim(ctx, &pb.ProclaimRequest{Name: "e", Key: ev.GetKey(), Value: []byte("v2")}); err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "the observer to see v2", func() bool { return obs.seen(ev.GetKey(), "v2") })
	if _, err := c2.Resign(ctx, &pb.ResignRequest{Name: "e", Key: ev.GetKey()}); err != nil {
		t.Fatal(err)
	}
	lost, err := s.Recv()
	if err != nil || lost.GetType() != pb.LeaderEvent_TYPE_LOST {
		t.Fatalf("after Resign: got %v, %v, want LOST", lost, err)
	}
	_, err = s.Recv()
	wantCode(t, "the resigned stream's end", err, codes.Aborted)
	_, err = c1.Resign(ctx, &pb.ResignRequest{Name: "e", Key: ev.GetKey()})
	wantCode(t, "Resign again", err, codes.NotFound)
	_, err = c1.Leader(ctx, &pb.LeaderRequest{Name: "e"})
	wantCode(t, "Leader without candidates", err, codes.NotFound)
}

// Bad input gets InvalidArgument, unknown keys NotFound, a waiting
// candidate's Proclaim FailedPrecondition; none creates a node.
func TestElectionBadInput(t *testing.T) {
	root := zktest.Root(t)
	tb := newBroker(t, root)
	c := electionClient(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range []string{"", "..", "a/b", strings.Repeat("x", 201)} {
		_, err := c.Leader(ctx, &pb.LeaderRequest{Name: name})
		wantCode(t, fmt.Sprintf("Leader(%q)", name), err, codes.InvalidArgument)
		_, err = c.Resign(ctx, &pb.ResignRequest{Name: name, Key: "n-0000000001"})
		wantCode(t, fmt.Sprintf("Resign(%q)", name), err, codes.InvalidArgument)
		s, err := c.Campaign(ctx, &pb.CampaignRequest{Name: name})
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, fmt.Sprintf("Campaign(%q)", name), err, codes.InvalidArgument)
		o, err := c.Observe(ctx, &pb.ObserveRequest{Name: name})
		if err == nil {
			_, err = o.Recv()
		}
		wantCode(t, fmt.Sprintf("Observe(%q)", name), err, codes.InvalidArgument)
	}
	for _, key := range []string{"", "x-0000000001", "..", "n-0000000001/x", "n-12"} {
		_, err := c.Proclaim(ctx, &pb.ProclaimRequest{Name: "e", Key: key})
		wantCode(t, fmt.Sprintf("Proclaim key %q", key), err, codes.InvalidArgument)
	}
	s, err := c.Campaign(ctx, &pb.CampaignRequest{Name: "e", Value: make([]byte, 64<<10+1)})
	if err == nil {
		_, err = s.Recv()
	}
	wantCode(t, "Campaign with a value over 64 KiB", err, codes.InvalidArgument)
	_, err = c.Proclaim(ctx, &pb.ProclaimRequest{Name: "e", Key: "n-0000000001"})
	wantCode(t, "Proclaim of an unknown key", err, codes.NotFound)

	leader, err := c.Campaign(ctx, &pb.CampaignRequest{Name: "e", Value: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leader.Recv(); err != nil {
		t.Fatal(err)
	}
	// A second candidate, on another broker (one here would wait its turn
	// without a node).
	waiter, err := electionClient(newBroker(t, root)).Campaign(ctx, &pb.CampaignRequest{Name: "e", Value: []byte("b")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = waiter.CloseSend() }()
	zc := zktest.Conn(t)
	var waitingKey string
	zktest.WaitFor(t, 30*time.Second, "the second candidate's node", func() bool {
		kids, _, err := zc.Children(root + "/elections/e")
		if err != nil || len(kids) != 2 {
			return false
		}
		waitingKey = max(kids[0], kids[1])
		return true
	})
	_, err = c.Proclaim(ctx, &pb.ProclaimRequest{Name: "e", Key: waitingKey, Value: []byte("x")})
	wantCode(t, "Proclaim of a waiting candidate", err, codes.FailedPrecondition)
	kids, _, err := zc.Children(root + "/elections")
	if err != nil || len(kids) != 1 || kids[0] != "e" {
		t.Fatalf("elections after bad input: %v, %v; want only e", kids, err)
	}
}
