package semaphore_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/semaphore"
)

// childEnv, set to "<server> <path>", makes the test binary hold a permit
// of the semaphore at path and wait to be killed (see TestMain).
const childEnv = "QBROKER_SEMAPHORE_CHILD"

// childSession is the child's session timeout: short, so that the test
// does not wait long for the server to expire it.
const childSession = 2 * time.Second

// holdUntilKilled is the child process: it takes the only permit, prints
// "holding <key> <token>" and blocks.
func holdUntilKilled() int {
	server, p, _ := strings.Cut(os.Getenv(childEnv), " ")
	conn, err := zkutil.Connect([]string{server}, childSession, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := zkutil.WaitConnected(conn, 10*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, err := semaphore.New(conn, p, 1)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := s.Acquire(ctx, 1)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("holding %s %d\n", l.Key(), l.Token())
	select {} // until killed
}

// A holder in another process killed with SIGKILL: once the server
// expires its session its lease is gone, the waiter gets the permit with
// a greater token, and no node is left after it releases.
func TestKilledHolder(t *testing.T) {
	p := zktest.Root(t) + "/sem"
	conn := zktest.Conn(t)
	s := newSem(t, conn, p, 1)
	ctx := testCtx(t, time.Minute)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+zktest.Addr(t)+" "+p)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the child's grant: %v", err)
	}
	var key string
	var token int64
	if _, err := fmt.Sscanf(line, "holding %s %d", &key, &token); err != nil {
		t.Fatalf("the child said %q: %v", line, err)
	}

	waiter := async(ctx, s, 1)
	zktest.WaitFor(t, 30*time.Second, "the waiter in line", func() bool { return waitersOf(t, conn, p) == 1 })
	stillWaiting(t, waiter, "the waiter while the child holds")
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	l := await(t, waiter, "the waiter after the holder's SIGKILL")
	t.Logf("permit granted %v after the holder's SIGKILL (session timeout %v)", time.Since(killed).Round(time.Millisecond), childSession)
	if l.Token() <= token {
		t.Fatalf("token %d after the killed holder's %d, want greater", l.Token(), token)
	}
	if ok, _, err := conn.Exists(key); err != nil || ok {
		t.Fatalf("the killed holder's lease %s still exists (%v)", key, err)
	}
	release(t, ctx, l)
	for _, d := range []string{"queue", "leases"} {
		if got := children(t, conn, p+"/"+d); len(got) != 0 {
			t.Fatalf("%s left: %v", d, got)
		}
	}
}
