package main

import (
	"context"
	"errors"
	"strconv"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

func init() {
	registerClient(clientCommand{"barrier", "set, remove or wait for a barrier; meet or run a command in a double barrier", runBarrier})
}

func runBarrier(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("barrier", "[flags] set|remove|wait name | wait name count | enter name count -- command [args...]", `
set name        sets the barrier name: every "wait name" then waits
remove name     removes it, releasing every waiter
wait name       waits until the barrier name is not set
wait name count meets count participants at the double barrier name:
                returns once count of them arrived (each enters and
                leaves at once, so all return together)
enter name count -- command [args...]
                enters the double barrier name once count participants
                arrived, runs command, then leaves and waits for all of
                them to leave; exits with the command's status. The
                command gets QBROKER_BARRIER_NAME and QBROKER_BARRIER_KEY.

A participant is present while this process's stream to the broker is
open: if this process dies, or its broker does (when the broker's
ZooKeeper session times out), it leaves and no longer counts. When the
participant is lost while the command runs, the command gets SIGTERM,
then SIGKILL after --kill-after, and enter exits with an error.`, std)
	killAfter := fs.Duration("kill-after", 5*time.Second, "after SIGTERM, how long a command may take to exit before SIGKILL")
	pos, err := parse(fs, args, 2, -1)
	if err != nil {
		return err
	}
	op, name := pos[0], pos[1]
	count := 0
	switch {
	case (op == "set" || op == "remove" || op == "wait") && len(pos) == 2:
	case op == "wait" && len(pos) == 3, op == "enter" && len(pos) >= 4:
		if count, err = strconv.Atoi(pos[2]); err != nil || count < 1 {
			return usagef("count %q: want a number of participants, at least 1", pos[2])
		}
	case op == "enter":
		return usagef("enter: want name count -- command [args...]")
	default:
		return usagef("want set, remove or wait name; wait name count; or enter name count -- command")
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	switch {
	case op == "set":
		return c.SetBarrier(ctx, name)
	case op == "remove":
		return c.RemoveBarrier(ctx, name)
	case op == "wait" && count == 0:
		return ignoreCanceled(c.WaitBarrier(ctx, name))
	}
	p, err := c.EnterBarrier(ctx, name, count)
	if err != nil {
		return ignoreCanceled(err)
	}
	defer p.Close()
	if op == "enter" {
		if err := runEntered(ctx, std, p, pos[3:], *killAfter); err != nil {
			return err
		}
	}
	return ignoreCanceled(p.Leave(ctx))
}

// runEntered runs argv inside the double barrier p: its context is p's
// presence (and Ctrl-C), so a lost participant stops it. A command that
// failed leaves first, so the others are not held by this one.
func runEntered(ctx context.Context, std stdio, p *qbroker.Participant, argv []string, killAfter time.Duration) error {
	err := runHeld(ctx, std, held{gone: p.Done(), err: p.Err,
		env: []string{"QBROKER_BARRIER_NAME=" + p.Name(), "QBROKER_BARRIER_KEY=" + p.Key()}}, argv, killAfter)
	var st exitStatus
	switch {
	case errors.As(err, &st):
		lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer lcancel()
		_ = p.Leave(lctx)
	case err == nil && ctx.Err() != nil:
		return context.Canceled // Ctrl-C: the command was stopped
	}
	return err
}
