package zkqueue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// A delayed Nack settles the lease: Ack (with or without a read), Nack and
// Extend of the delivery's token all fail with ErrUnknownLease, and so do
// they of the lease that waits for the delay, found by listing ZooKeeper.
// The message itself stays in flight until the delay ends.
func TestDelayedNackSettlesTheLease(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	items, err := zkqueue.New(conn, root+"/items")
	if err != nil {
		t.Fatal(err)
	}
	leases, err := zkqueue.NewLeases(items, root+"/leases", root+"/dead")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := items.Publish(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	ls, err := leases.Take(ctx, 1, zkqueue.Room{}, time.Minute, false)
	if err != nil || len(ls) != 1 {
		t.Fatalf("TakeLeases: %v, %v", ls, err)
	}
	tok := ls[0].Token
	if _, out, err := leases.Nack(ctx, tok, 12*time.Hour, zkqueue.Policy{}); err != nil || out != zkqueue.Delayed {
		t.Fatalf("Nack with a delay: %v, %v; want Delayed", out, err)
	}
	children, _, err := conn.Children(root + "/leases")
	if err != nil || len(children) != 1 || children[0] == tok {
		t.Fatalf("leases after the nack: %v, %v; want one lease under a new name", children, err)
	}
	waiting := children[0]
	if !strings.HasPrefix(waiting, ls[0].ID) {
		t.Fatalf("nacked lease %s is not named after message %s", waiting, ls[0].ID)
	}
	settle := map[string]func(string) error{
		"Ack":        func(tk string) error { _, err := leases.Ack(ctx, tk); return err },
		"AckUnread":  func(tk string) error { _, err := leases.AckUnread(ctx, tk); return err },
		"Nack":       func(tk string) error { _, _, err := leases.Nack(ctx, tk, 0, zkqueue.Policy{}); return err },
		"Nack later": func(tk string) error { _, _, err := leases.Nack(ctx, tk, time.Second, zkqueue.Policy{}); return err },
		"Extend":     func(tk string) error { _, err := leases.Extend(ctx, tk, time.Hour); return err },
	}
	for name, f := range settle {
		if err := f(tok); !errors.Is(err, zkqueue.ErrUnknownLease) {
			t.Errorf("%s of the nacked delivery: got %v, want ErrUnknownLease", name, err)
		}
		if name == "AckUnread" {
			continue // deletes by name unread: its callers only hold delivered names
		}
		if err := f(waiting); !errors.Is(err, zkqueue.ErrUnknownLease) {
			t.Errorf("%s of the lease waiting for the delay: got %v, want ErrUnknownLease", name, err)
		}
	}
	if n, err := leases.InFlight(ctx); err != nil || n != 1 {
		t.Fatalf("in flight after the refused settlements: %d, %v; want 1", n, err)
	}
	if n, err := items.Len(ctx); err != nil || n != 0 {
		t.Fatalf("ready after the refused settlements: %d, %v; want 0", n, err)
	}
}

// A batch over the byte limit is refused with an error that states the
// per-message overhead counted besides the payloads; a batch exactly at the
// limit passes.
func TestBatchLimitCountsOverheadExplicitly(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	const limit = 4000
	s, err := zkqueue.New(zktest.Conn(t), root+"/items", zkqueue.WithMaxBatchBytes(limit), zkqueue.WithMaxPayload(1000))
	if err != nil {
		t.Fatal(err)
	}
	per := s.MessageOverhead()
	if want := zkqueue.HeaderMax + len(root+"/items") + 61 + 96; per != want {
		t.Fatalf("MessageOverhead() = %d, want %d", per, want)
	}
	batch := func(n, size int) [][]byte {
		payloads := make([][]byte, n)
		for i := range n {
			payloads[i] = make([]byte, size)
		}
		return payloads
	}
	// Four messages exactly at the limit.
	size := limit/4 - per
	payloads := batch(4, size)
	if _, err := s.PublishBatch(ctx, payloads); err != nil {
		t.Fatalf("batch of 4 x %d bytes at the limit: %v", size, err)
	}
	payloads = batch(4, size+1)
	_, err = s.PublishBatch(ctx, payloads)
	want := fmt.Sprintf("4 messages are %d bytes including %d bytes of per-message overhead > %d", 4*(size+1+per), 4*per, limit)
	if !errors.Is(err, zkqueue.ErrBatchTooLarge) || !strings.Contains(err.Error(), want) {
		t.Fatalf("batch one byte a message over: got %v, want ErrBatchTooLarge saying %q", err, want)
	}
}
