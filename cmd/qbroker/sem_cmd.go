package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

func runSem(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("sem", "[flags] name limit [-- command [args...]]", `
Takes --permits of the counting semaphore name, which has limit permits
(the first use of a name sets it; a semaphore whose limit is another is
refused), waiting for them, then either runs command while holding them
and gives them back when the command exits (exiting with its status), or,
without a command, prints "<key> <token>" and holds them until Ctrl-C.
The command gets the lease in QBROKER_SEM_NAME, QBROKER_SEM_KEY,
QBROKER_SEM_PERMITS and QBROKER_SEM_TOKEN (the fencing token: pass it to
what the command writes, so a stale holder can be refused).

The permits are held while this process's stream to the broker is open:
if this process dies the broker gives them back, and if the broker dies
they are given back when the broker's ZooKeeper session times out. When
the lease is lost while the command runs, the command gets SIGTERM, then
SIGKILL after --kill-after, and sem exits with an error.

With --lock-delay, permits lost without their release (this process
killed or cut off from the broker, or the broker's session expired) stay
unavailable to everyone for that long, so that a holder that was only cut
off stops its command first; a release when the command exits, or at
Ctrl-C, frees them at once.`, std)
	killAfter := fs.Duration("kill-after", 5*time.Second, "after SIGTERM, how long a command may take to exit before SIGKILL")
	value := fs.String("value", "", "the holder's value, shown to Revoke (default: host and pid)")
	permits := fs.Int("permits", 1, "how many permits to take at once")
	delay := fs.Duration("lock-delay", 0, "after the permits are lost without a release, keep them unavailable this long (at most 1m; 0: none)")
	pos, err := parse(fs, args, 2, -1)
	if err != nil {
		return err
	}
	limit, err := strconv.Atoi(pos[1])
	if err != nil {
		return usagef("limit %q: want a number of permits", pos[1])
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
	p, err := c.Acquire(ctx, pos[0], limit, qbroker.Permits(*permits), qbroker.PermitValue([]byte(*value)), qbroker.PermitDelay(*delay))
	if err != nil {
		return ignoreCanceled(err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), cf.timeout)
		defer cancel()
		_ = p.Release(rctx)
	}()
	if len(pos) == 2 {
		fmt.Fprintf(std.out, "%s %d\n", p.Key(), p.Token())
		select {
		case <-p.Lost():
			return p.Err()
		case <-ctx.Done():
			return nil
		}
	}
	return runWithPermits(ctx, std, p, pos[2:], *killAfter)
}

// runWithPermits runs argv holding p: its context is p's lease (and
// Ctrl-C), so a lost lease stops it, as runLocked does for a lock.
func runWithPermits(ctx context.Context, std stdio, p *qbroker.Permit, argv []string, killAfter time.Duration) error {
	return runHeld(ctx, std, held{gone: p.Lost(), err: p.Err, env: []string{"QBROKER_SEM_NAME=" + p.Name(),
		"QBROKER_SEM_KEY=" + p.Key(), "QBROKER_SEM_PERMITS=" + strconv.Itoa(p.Permits()),
		"QBROKER_SEM_TOKEN=" + strconv.FormatInt(p.Token(), 10)}}, argv, killAfter)
}
