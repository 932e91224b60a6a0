package zkqueue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
)

// A consumer that listed its tail empty just before the tail was sealed
// and its successor created (the publish that filled the segment returned,
// the consumer took its message, and only then did the roll commit) moves
// on to the successor. The sealed segment's children never change again,
// so its watch never fires: the listing of the parent that shows a newer
// segment must make it list the old tail again (sealed and empty: removed).
func TestEmptyTailRolledPast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := zktest.Conn(t)
	items := zktest.Root(t) + "/items"
	q, err := New(conn, items, WithSegmentSize(10))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Publish(ctx, []byte("first")); err != nil {
		t.Fatal(err)
	}
	if m, err := q.TryDequeue(ctx); err != nil || string(m.Payload) != "first" {
		t.Fatalf("first take: %v, %v", m, err)
	}
	// Lists segment 1 empty and unsealed: an empty tail, watched.
	if _, err := q.TryDequeue(ctx); !errors.Is(err, ErrEmpty) {
		t.Fatalf("empty queue: got %v, want ErrEmpty", err)
	}
	// The roll, then a publish into the successor, as another producer
	// would make them.
	s1, s2 := segmentPath(items, false, segment{0, 1}), segmentPath(items, false, segment{0, 2})
	acl := zk.WorldACL(zk.PermAll)
	if _, err := conn.Multi(&zk.SetDataRequest{Path: s1, Data: sealedData, Version: 0}, createSegmentOp(s2, acl)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Create(s2+"/"+messagePrefix(false, segment{0, 2}, "", ""), EncodeData(Message{Payload: []byte("second")}), zk.FlagSequence, acl); err != nil {
		t.Fatal(err)
	}
	m, err := q.Dequeue(ctx)
	if err != nil || string(m.Payload) != "second" {
		t.Fatalf("take after the roll: %v, %v; want the successor's message", m, err)
	}
	if ok, _, err := conn.Exists(s1); err != nil || ok {
		t.Errorf("drained segment 1: exists %v, %v; want it removed", ok, err)
	}
}
