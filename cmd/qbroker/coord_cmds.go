package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Client commands of the coordination services: lock, elect, counter, sem.
var coordCommands = []clientCommand{
	{"lock", "hold a lock, or run a command while holding it", runLock},
	{"elect", "campaign for leader and print leadership changes", runElect},
	{"counter", "read or change a counter: get, add, cas, set (counter_cmds.go)", runCounter},
	{"sem", "hold semaphore permits, or run a command while holding them", runSem},
}

func init() {
	for _, c := range coordCommands {
		registerClient(c)
	}
}

// exitStatus is a command's exit status to pass on (the command run under
// a lock): main exits with it and prints nothing more.
type exitStatus struct{ code int }

func (e exitStatus) Error() string { return "exit status " + strconv.Itoa(e.code) }

func runLock(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("lock", "[flags] name [-- command [args...]]", `
Takes the lock name, waiting for it, then either runs command while
holding it and releases it when the command exits (exiting with its
status), or, without a command, prints "<key> <token>" and holds the lock
until Ctrl-C. The command gets the grant in QBROKER_LOCK_NAME,
QBROKER_LOCK_KEY and QBROKER_LOCK_TOKEN (the fencing token: pass it to
what the command writes, so a stale holder can be refused).

The lock is held while this process's stream to the broker is open: if
this process dies the broker releases it, and if the broker dies the lock
is released when the broker's ZooKeeper session times out. When the lock
is lost while the command runs, the command gets SIGTERM, then SIGKILL
after --kill-after, and lock exits with an error.

With --lock-delay, a lock lost without its release (this process killed
or cut off from the broker, or the broker's session expired) stays
unavailable to everyone for that long, so that a holder that was only cut
off stops its command first; a release when the command exits, or at
Ctrl-C, frees it at once.`, std)
	killAfter := fs.Duration("kill-after", 5*time.Second, "after SIGTERM, how long a command may take to exit before SIGKILL")
	value := fs.String("value", "", "the holder's value, shown to Revoke (default: host and pid)")
	delay := fs.Duration("lock-delay", 0, "after the lock is lost without a release, keep it unavailable this long (at most 1m; 0: none)")
	pos, err := parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	if *value == "" {
		host, _ := os.Hostname()
		*value = fmt.Sprintf("%s pid %d", host, os.Getpid())
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	l, err := c.Lock(ctx, pos[0], qbroker.LockValue([]byte(*value)), qbroker.LockDelay(*delay))
	if err != nil {
		return ignoreCanceled(err)
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
		defer cancel()
		_ = l.Unlock(uctx)
	}()
	if len(pos) == 1 {
		fmt.Fprintf(std.out, "%s %d\n", l.Key(), l.Token())
		select {
		case <-l.Lost():
			return l.Err()
		case <-ctx.Done():
			return nil
		}
	}
	return runLocked(ctx, std, l, pos[1:], *killAfter)
}

// runLocked runs argv under l: its context is l's holding (and Ctrl-C),
// so a lost lock stops it.
func runLocked(ctx context.Context, std stdio, l *qbroker.Lock, argv []string, killAfter time.Duration) error {
	return runHeld(ctx, std, held{gone: l.Lost(), err: l.Err, env: []string{"QBROKER_LOCK_NAME=" + l.Name(),
		"QBROKER_LOCK_KEY=" + l.Key(), "QBROKER_LOCK_TOKEN=" + strconv.FormatInt(l.Token(), 10)}}, argv, killAfter)
}

// held is what a command runs under (a lock, semaphore permits, a double
// barrier's participant): the command runs while it holds.
type held struct {
	gone <-chan struct{} // closed when the holding ends
	err  func() error    // why it ended: nil while held or after a release
	env  []string        // what the command is told of it
}

// runHeld runs argv while h holds: its context is h's life (and Ctrl-C),
// so a holding lost stops the command (SIGTERM, SIGKILL after killAfter)
// and is the error. Otherwise the command's exit status (exitStatus) or
// nil, also when Ctrl-C stopped it.
func runHeld(ctx context.Context, std stdio, h held, argv []string, killAfter time.Duration) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-h.gone:
			cancel()
		case <-cctx.Done():
		}
	}()
	cmd := exec.CommandContext(cctx, argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = std.in, std.out, std.err
	cmd.Env = append(os.Environ(), h.env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = killAfter
	err := cmd.Run()
	if herr := h.err(); herr != nil {
		return fmt.Errorf("%w; the command was stopped", herr)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return exitStatus{ee.ExitCode()}
	case ctx.Err() != nil:
		return nil // Ctrl-C: the command was stopped
	}
	return err
}

func runElect(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("elect", "[flags] name [value]", `
With a value, campaigns in the election name with it and holds the
leadership, once won, until Ctrl-C; with --observe (or without a value),
only watches. Either way it prints the election's leaders as they change,
one line each:
	<key> <token> <value>
A campaign whose leadership is lost (resigned by key, or the broker lost
its ZooKeeper session) exits with an error. With --lock-delay, a
leadership lost without resigning (this process killed or cut off, or the
broker's session expired) leaves the election without a leader that long;
Ctrl-C resigns at once.`, std)
	observeOnly := fs.Bool("observe", false, "only print the leaders; do not campaign")
	delay := fs.Duration("lock-delay", 0, "after the leadership is lost without resigning, keep the election without a leader this long (at most 1m; 0: none)")
	pos, err := parse(fs, args, 1, 2)
	if err != nil {
		return err
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	octx, stop := context.WithCancel(ctx)
	defer stop()
	observed := make(chan error, 1)
	go func() {
		observed <- c.Observe(octx, pos[0], func(l qbroker.Leader) error {
			fmt.Fprintf(std.out, "%s %d %s\n", l.Key, l.Token, printable(l.Value))
			return nil
		})
	}()
	if *observeOnly || len(pos) == 1 {
		return ignoreCanceled(<-observed)
	}
	return campaignAndHold(ctx, c, pos[0], []byte(pos[1]), observer{observed, stop}, qbroker.CampaignDelay(*delay))
}

// observer is the election's observer running beside a campaign: done
// gets its end, stop ends it.
type observer struct {
	done <-chan error
	stop func()
}

// campaignAndHold campaigns, then holds the leadership until Ctrl-C (then
// resigns), its loss, or the observer's failure.
func campaignAndHold(ctx context.Context, c *qbroker.Client, name string, value []byte, obs observer, opts ...qbroker.CampaignOption) error {
	type won struct {
		l   *qbroker.Leadership
		err error
	}
	cctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	ch := make(chan won, 1)
	go func() {
		l, err := c.Campaign(cctx, name, value, opts...)
		ch <- won{l, err}
	}()
	observerDone := false
	defer func() {
		if !observerDone {
			obs.stop()
			<-obs.done
		}
	}()
	var w won
	select {
	case w = <-ch:
	case err := <-obs.done:
		observerDone = true
		giveUp()
		// The campaign ends as given up (or won meanwhile: resigned
		// below); the observer's error says why.
		if w = <-ch; w.err == nil || errors.Is(w.err, context.Canceled) {
			w.err = err
		}
	}
	if w.l != nil {
		defer func() {
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = w.l.Resign(rctx)
		}()
	}
	if w.err != nil {
		return ignoreCanceled(w.err)
	}
	select {
	case <-w.l.Done():
		return w.l.Err()
	case err := <-obs.done:
		observerDone = true
		return ignoreCanceled(err)
	case <-ctx.Done():
		return nil
	}
}
