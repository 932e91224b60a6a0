package zkqueue_test

import (
	"context"
	"errors"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/zkqueue"
)

// With NoCreate, opening a Store and its Leases writes nothing: a queue
// being deleted is not brought back by a process opening it.
func TestNoCreate(t *testing.T) {
	root := zktest.Root(t)
	conn := zktest.Conn(t)
	s, err := zkqueue.New(conn, root+"/items", zkqueue.WithoutCreate())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zkqueue.NewLeases(s, root+"/leases", root+"/dead"); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := conn.Exists(root); err != nil || ok {
		t.Fatalf("root exists: %v, %v", ok, err)
	}
	if _, err := s.Publish(context.Background(), []byte("x")); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("Publish without a parent: got %v, want ErrNoNode", err)
	}
}
