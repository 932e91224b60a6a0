package zkqueue_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// Check refuses a batch naming the draft it refuses (*DraftError), and
// the publishes refuse unchecked drafts the same way, writing nothing;
// drafts Check passed are published as they are.
func TestCheckNamesTheDraft(t *testing.T) {
	ctx := context.Background()
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	q, err := zkqueue.New(conn, root+"/items", zkqueue.WithMaxPayload(16))
	if err != nil {
		t.Fatal(err)
	}
	sch, err := zkqueue.NewScheduled(q, root+"/delayed", 0)
	if err != nil {
		t.Fatal(err)
	}
	bad := []zkqueue.Draft{{Payload: []byte("ok")}, {Payload: []byte("ok")}, {Payload: []byte("17 bytes, 1 over!")}}
	publishes := map[string]func() error{
		"Check":        func() error { return q.Check(append([]zkqueue.Draft(nil), bad...)) },
		"PublishAll":   func() error { _, err := q.PublishAll(ctx, bad); return err },
		"Receipts":     func() error { _, err := q.PublishReceipts(ctx, bad); return err },
		"Scheduled":    func() error { _, err := sch.PublishAll(ctx, bad, make([]time.Time, len(bad))); return err },
		"PublishDraft": func() error { _, err := q.PublishDraft(ctx, bad[2]); return err },
	}
	for name, f := range publishes {
		err := f()
		var de *zkqueue.DraftError
		want := 2
		if name == "PublishDraft" {
			want = 0
		}
		if !errors.As(err, &de) || de.Index != want || !errors.Is(err, zkqueue.ErrTooLarge) {
			t.Errorf("%s: got %v, want a *DraftError of message %d wrapping ErrTooLarge", name, err, want)
			continue
		}
		if !strings.Contains(err.Error(), "message "+strconv.Itoa(want)+":") {
			t.Errorf("%s: %q does not name message %d", name, err, want)
		}
	}
	if n, err := q.Len(ctx); err != nil || n != 0 {
		t.Fatalf("refused publishes wrote %d messages (%v), want 0", n, err)
	}

	good := []zkqueue.Draft{{Payload: []byte("a")}, {Payload: []byte("b")}}
	if err := q.Check(good); err != nil {
		t.Fatal(err)
	}
	if _, err := q.PublishAll(ctx, good); err != nil {
		t.Fatal(err)
	}
	// Receipts of drafts without dedup ids, on a queue without dedup.
	rs, err := q.PublishReceipts(ctx, []zkqueue.Draft{{Payload: []byte("c")}})
	if err != nil || len(rs) != 1 || rs[0].ID == "" || rs[0].Duplicate {
		t.Fatalf("PublishReceipts without dedup ids: %v, %v; want one receipt with an id", rs, err)
	}
	for _, want := range []string{"a", "b", "c"} {
		m, err := q.TryDequeue(ctx)
		if err != nil || string(m.Payload) != want {
			t.Fatalf("dequeue: %q, %v; want %s", m.Payload, err, want)
		}
	}
}
