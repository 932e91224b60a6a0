package zkserver_test

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkserver"
)

// LiveHeap reads a running server's heap after a full collection: its
// old generation grows by at least the data the server was given to
// hold, and a process that is no JVM is an error.
func TestLiveHeap(t *testing.T) {
	requireZK(t)
	if _, err := exec.LookPath("jcmd"); err != nil {
		t.Skip("jcmd (a JDK) is needed to read the heap")
	}
	s, conn := startConnected(t, zkserver.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before, err := zkserver.LiveHeap(ctx, s.Pid())
	if err != nil || before.Old <= 0 || before.Young < 0 {
		t.Fatalf("LiveHeap: got %+v, %v; want a positive old generation", before, err)
	}
	const nodes, size = 400, 10 << 10 // 4 MiB of data
	data := make([]byte, size)
	for i := range nodes {
		if _, err := conn.Create(fmt.Sprintf("/n%d", i), data, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	after, err := zkserver.LiveHeap(ctx, s.Pid())
	if err != nil || after.Old-before.Old < nodes*size/2 || after.Used() < after.Old {
		t.Fatalf("LiveHeap after %d B of data: got %+v (before %+v), %v; want an old generation at least %d B larger", nodes*size, after, before, err, nodes*size/2)
	}
	if _, err := zkserver.LiveHeap(ctx, 1); err == nil {
		t.Errorf("LiveHeap(1): got no error, want one (init is no JVM)")
	}
}
