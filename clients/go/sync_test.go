package qbroker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// A synchronizing queue opens when its second member joins; before that
// consumers are refused.
func TestJoinSync(t *testing.T) {
	_, c := setup(t)
	ctx := testCtx(t)
	createQueue(t, c, "group", qbroker.QueueOptions{Kind: qbroker.KindSync, SyncMembers: 2})
	createQueue(t, c, "fifo", qbroker.QueueOptions{})
	if _, err := c.Publish(ctx, "group", []byte("go")); err != nil {
		t.Fatal(err)
	}

	checkRefusedBeforeOpen(t, ctx, c, "group")

	a, err := c.JoinSync(ctx, "group", "a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Leave()
	if ev := <-a.Events(); ev != (qbroker.SyncEvent{State: qbroker.SyncJoined, Joined: 1, Required: 2}) {
		t.Errorf("first event: got %+v, want joined 1 of 2", ev)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := a.WaitOpen(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitOpen with one member: got %v, want DeadlineExceeded", err)
	}

	checkJoinSyncErrors(t, ctx, c)

	b, err := c.JoinSync(ctx, "group", "b")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*qbroker.Membership{a, b} {
		if err := m.WaitOpen(ctx); err != nil {
			t.Fatal(err)
		}
		if ev := m.Last(); ev.State != qbroker.SyncOpen || ev.Joined != 2 {
			t.Errorf("last event: got %+v, want open with 2 joined", ev)
		}
	}
	st, err := c.Stats(ctx, "group")
	if err != nil || !st.SyncOpen || st.SyncJoined != 2 {
		t.Errorf("Stats: got %+v, %v; want open with 2 joined", st, err)
	}
	ms, err := c.Receive(ctx, "group", qbroker.ReceiveOptions{})
	if err != nil || len(ms) != 1 || string(ms[0].Payload) != "go" {
		t.Errorf("Receive when open: got %v, %v; want go", ms, err)
	}

	if err := b.Leave(); err != nil {
		t.Errorf("Leave: %v", err)
	}
	for range b.Events() { // buffered events, then closed
	}
	if err := b.WaitOpen(ctx); err != nil {
		t.Errorf("WaitOpen after Leave of an opened membership: got %v, want nil", err)
	}
}

// checkRefusedBeforeOpen fails the test unless Receive and Consume of
// the sync queue, not open yet, fail with ErrFailedPrecondition.
func checkRefusedBeforeOpen(t *testing.T, ctx context.Context, c *qbroker.Client, queue string) {
	t.Helper()
	if _, err := c.Receive(ctx, queue, qbroker.ReceiveOptions{}); !errors.Is(err, qbroker.ErrFailedPrecondition) {
		t.Errorf("Receive before open: got %v, want ErrFailedPrecondition", err)
	}
	k, err := c.Consume(ctx, queue, qbroker.ConsumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	<-k.Done()
	if err := k.Err(); !errors.Is(err, qbroker.ErrFailedPrecondition) {
		t.Errorf("Consume before open: got %v, want ErrFailedPrecondition", err)
	}
}

// checkJoinSyncErrors fails the test unless joining as a member already
// in "group", with a bad member id, to the FIFO queue "fifo" or to a
// missing queue fails with the matching error.
func checkJoinSyncErrors(t *testing.T, ctx context.Context, c *qbroker.Client) {
	t.Helper()
	for _, tc := range []struct {
		queue, member string
		want          error
	}{
		{"group", "a", qbroker.ErrAlreadyExists},
		{"group", "bad/id", qbroker.ErrInvalidArgument},
		{"fifo", "x", qbroker.ErrFailedPrecondition},
		{"nope", "x", qbroker.ErrNotFound},
	} {
		if m, err := c.JoinSync(ctx, tc.queue, tc.member); !errors.Is(err, tc.want) {
			t.Errorf("JoinSync(%s, %s): got %v, want %v", tc.queue, tc.member, err, tc.want)
			if m != nil {
				m.Leave()
			}
		}
	}
}

// A membership ends with its context, with the context's error.
func TestJoinSyncContext(t *testing.T) {
	_, c := setup(t)
	createQueue(t, c, "group", qbroker.QueueOptions{Kind: qbroker.KindSync, SyncMembers: 3})
	ctx, cancel := context.WithCancel(context.Background())
	m, err := c.JoinSync(ctx, "group", "a")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := m.WaitOpen(testCtx(t)); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitOpen: got %v, want context.Canceled", err)
	}
	if err := m.Leave(); !errors.Is(err, context.Canceled) {
		t.Errorf("Leave: got %v, want context.Canceled", err)
	}
	// The place is free again.
	eventually(t, "member left", func() (bool, error) {
		st, err := c.Stats(testCtx(t), "group")
		return st.SyncJoined == 0, err
	})
}
