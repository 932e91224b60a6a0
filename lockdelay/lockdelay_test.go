package lockdelay_test

import (
	"context"
	"errors"
	"path"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lock"
	"github.com/qbroker/qbroker/lockdelay"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{
		{0, true}, {time.Millisecond, true}, {lockdelay.Max, true},
		{-time.Nanosecond, false}, {lockdelay.Max + time.Nanosecond, false},
	} {
		if err := lockdelay.Validate(tc.d); (err == nil) != tc.ok || (err != nil && !errors.Is(err, lockdelay.ErrInvalid)) {
			t.Errorf("Validate(%v) = %v, want ok %v", tc.d, err, tc.ok)
		}
	}
}

// Mark makes a marker only beside a live holder; Release deletes both
// nodes, and works without a marker too.
func TestMarkRelease(t *testing.T) {
	conn := zktest.Conn(t)
	dir := zktest.Root(t)
	if err := zkutil.EnsurePath(conn, dir, nil); err != nil {
		t.Fatal(err)
	}
	if err := lockdelay.Mark(conn, dir, "h-1", time.Second, nil); !errors.Is(err, lockdelay.ErrHolderGone) {
		t.Fatalf("Mark without a holder: got %v, want ErrHolderGone", err)
	}
	for _, h := range []string{"h-1", "h-2"} {
		if _, err := conn.Create(dir+"/"+h, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	if err := lockdelay.Mark(conn, dir, "h-1", time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if err := lockdelay.Mark(conn, dir, "h-1", time.Second, nil); err != nil {
		t.Fatalf("Mark again: %v", err)
	}
	data, _, err := conn.Get(dir + "/" + lockdelay.MarkerName("h-1"))
	if err != nil || string(data) != "1000" {
		t.Fatalf("marker data %q, %v: want the delay in milliseconds", data, err)
	}
	for _, h := range []string{"h-1", "h-2"} {
		if err := lockdelay.Release(conn, dir, h); err != nil {
			t.Fatalf("Release %s: %v", h, err)
		}
	}
	if c, _, err := conn.Children(dir); err != nil || len(c) != 0 {
		t.Fatalf("left after Release: %v %v", c, err)
	}
	if err := lockdelay.Release(conn, dir, "a/b"); !errors.Is(err, lockdelay.ErrInvalid) {
		t.Fatalf("Release of a path: got %v, want ErrInvalid", err)
	}
}

// With nobody contending, a Sweeper removes a lost holder's marker once
// its delay has passed since the Sweeper noted the loss, and not before;
// the lock's node is then empty, as an idle reaper wants it.
func TestSweeper(t *testing.T) {
	const delay = 2 * time.Second
	dir := zktest.Root(t)
	p := dir + "/name"
	admin := zktest.Conn(t)
	proxy := zktest.NewProxy(t, zktest.Addr(t))
	connA, _ := zktest.ConnCounting(t, []string{proxy.Addr()}, 2*time.Second)
	m, err := lock.NewMutex(connA, p, lock.WithDelay(delay))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := lockdelay.NewSweeper(admin, dir)
	if n, err := s.Pass(ctx); err != nil || n != 0 {
		t.Fatalf("Pass while held: %d, %v; want 0 deleted", n, err)
	}
	marker := p + "/" + lockdelay.MarkerName(path.Base(g.Key()))
	if _, st, err := admin.Get(marker); err != nil || st.Version != 0 {
		t.Fatalf("marker while held: %v %v, want version 0", st, err)
	}
	proxy.Cut()
	zktest.WaitFor(t, time.Minute, "the holder's node to go with its session", func() bool {
		ok, _, err := admin.Exists(g.Key())
		return err == nil && !ok
	})
	noted := time.Now() // before the pass notes the loss: the delay runs from later
	if n, err := s.Pass(ctx); err != nil || n != 0 {
		t.Fatalf("first Pass after the loss: %d, %v; want the loss noted, nothing deleted", n, err)
	}
	if _, st, err := admin.Get(marker); err != nil || st.Version != 1 {
		t.Fatalf("marker after the first pass: %v %v, want version 1 (noted)", st, err)
	}
	deleted := 0
	zktest.WaitFor(t, 30*time.Second, "a pass to delete the marker", func() bool {
		n, err := s.Pass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		deleted += n
		return deleted > 0
	})
	if since := time.Since(noted); since < delay {
		t.Fatalf("marker deleted %v after the loss was noted, want at least %v", since, delay)
	}
	if c, _, err := admin.Children(p); err != nil || len(c) != 0 {
		t.Fatalf("left under the lock: %v %v", c, err)
	}
	proxy.Restore()
	select {
	case <-g.Lost():
	case <-time.After(time.Minute):
		t.Fatal("the lost holder's Lost did not close")
	}
}
