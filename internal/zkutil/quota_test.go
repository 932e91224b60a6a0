package zkutil_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// ZooKeeper counts a subtree's nodes and bytes once the quota nodes exist:
// what was there before, then every create, setData and delete below.
func TestQuotaStats(t *testing.T) {
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	q := root + "/q"
	create(t, conn, q+"/items")
	acl := zk.WorldACL(zk.PermAll)
	if _, err := conn.Create(q+"/items/before", []byte("12345"), 0, acl); err != nil {
		t.Fatal(err)
	}
	if _, _, err := zkutil.QuotaStats(conn, q); !errors.Is(err, zk.ErrNoNode) {
		t.Fatalf("stats without a quota: got %v, want ErrNoNode", err)
	}
	for range 2 { // idempotent
		if err := zkutil.EnsureQuota(conn, q, nil); err != nil {
			t.Fatal(err)
		}
	}
	want := func(count, bytes int64) {
		t.Helper()
		c, b, err := zkutil.QuotaStats(conn, q)
		if err != nil || c != count || b != bytes {
			t.Fatalf("stats: got count %d, bytes %d, %v; want %d, %d", c, b, err, count, bytes)
		}
	}
	want(3, 5) // q, items, before
	for i := range 10 {
		if _, err := conn.Create(q+"/items/m-", make([]byte, 100+i), zk.FlagSequence, acl); err != nil {
			t.Fatal(err)
		}
	}
	want(13, 5+1045)
	if _, err := conn.Set(q+"/items/before", []byte("1"), -1); err != nil {
		t.Fatal(err)
	}
	if err := conn.Delete(q+"/items/before", -1); err != nil {
		t.Fatal(err)
	}
	want(12, 1045)
	// Deleting the subtree and creating it again keeps the count right.
	if err := zkutil.DeleteTree(context.Background(), conn, q, nil); err != nil {
		t.Fatal(err)
	}
	want(0, 0)
	create(t, conn, q+"/items")
	want(2, 0)
	if err := zkutil.RemoveQuota(conn, q); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := conn.Exists("/zookeeper/quota" + root); err != nil || ok {
		t.Fatalf("quota parents left behind: %v, %v", ok, err)
	}
	if err := zkutil.RemoveQuota(conn, q); err != nil {
		t.Fatalf("removing again: %v", err)
	}
}

// Mntr reads the data size of a real server; a server that refuses mntr,
// or is not there, is an error naming the address.
func TestMntr(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ds, err := zkutil.Mntr(ctx, zktest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	if ds.Znodes < 4 || ds.Bytes <= 0 {
		t.Fatalf("data size %+v: want some nodes and bytes", ds)
	}
	conn := zktest.Conn(t)
	root := zktest.Root(t)
	create(t, conn, root)
	if _, err := conn.Create(root+"/big", make([]byte, 100_000), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	after, err := zkutil.Mntr(ctx, zktest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	if after.Bytes < ds.Bytes+100_000 || after.Znodes < ds.Znodes+1 {
		t.Fatalf("after a 100,000-byte node: %+v, before %+v", after, ds)
	}

	// A server that answers without the sizes (as one without mntr in its
	// whitelist does).
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 4)
		_, _ = c.Read(buf)
		_, _ = c.Write([]byte("mntr is not executed because it is not in the whitelist.\n"))
		c.Close()
	}()
	if _, err := zkutil.Mntr(ctx, l.Addr().String()); err == nil || !strings.Contains(err.Error(), "whitelist") {
		t.Fatalf("a refusing server: got %v, want an error about the whitelist", err)
	}
	<-done
	l.Close()
	if _, err := zkutil.Mntr(ctx, l.Addr().String()); err == nil || !strings.Contains(err.Error(), l.Addr().String()) {
		t.Fatalf("no server: got %v, want an error naming the address", err)
	}
}
