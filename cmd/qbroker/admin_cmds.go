package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Client commands that manage queues and groups: delete, join.
var adminCommands = []clientCommand{
	{"delete", "delete queues with all their messages", runDelete},
	{"join", "join a sync queue's group and hold the membership", runJoin},
}

func init() {
	for _, c := range adminCommands {
		registerClient(c)
	}
	register(command{name: "version", usage: "print the version (also --version)", run: func(args []string) error {
		return runVersion(stdio{out: os.Stdout, err: os.Stderr}, args)
	}})
}

func runDelete(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("delete", "[flags] queue...", `
Deletes queues with all their messages: ready, in flight and dead letters.
It shows what each queue holds and asks for confirmation on standard
input, unless --yes (or -f) is given, as a script must.`, std)
	var yes bool
	fs.BoolVar(&yes, "yes", false, "delete without asking")
	fs.BoolVar(&yes, "f", false, "same as --yes")
	names, err := parse(fs, args, 1, -1)
	if err != nil {
		return err
	}
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if !yes {
		err := confirm(ctx, std, c, "delete", names, func(n string, st qbroker.Stats) string {
			return fmt.Sprintf("%s (%d ready, %d in flight, %d dead letters)", n, st.Ready, st.InFlight, st.Dead)
		})
		if err != nil {
			return err
		}
	}
	for _, n := range names {
		if err := c.DeleteQueue(ctx, n); err != nil {
			return err
		}
		fmt.Fprintf(std.out, "%s: deleted\n", n)
	}
	return nil
}

// confirm asks on standard input whether to verb the queues, describing
// each from its stats; anything but y or yes (an empty or closed standard
// input too, as in a script) is a refusal, an error naming --yes.
func confirm(ctx context.Context, std stdio, c *qbroker.Client, verb string, names []string, describe func(string, qbroker.Stats) string) error {
	var what []string
	for _, n := range names {
		st, err := c.Stats(ctx, n)
		if err != nil {
			return err
		}
		what = append(what, describe(n, st))
	}
	fmt.Fprintf(std.err, "%s %s? [y/N] ", verb, strings.Join(what, ", "))
	answer, _ := bufio.NewReader(std.in).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return fmt.Errorf("not confirmed: nothing %s (--yes %ss without asking)", pastTense(verb), verb)
}

// pastTense is "deleted" for "delete", "purged" for "purge".
func pastTense(verb string) string { return strings.TrimSuffix(verb, "e") + "ed" }

func runJoin(ctx context.Context, std stdio, args []string) error {
	fs, cf := newFlagSet("join", "[flags] queue member-id", `
Joins the group of a sync queue as member-id and holds the membership
until Ctrl-C, or with --until-open until the queue opens. Consumers of a
sync queue are refused until --members members have joined. It prints the
group's progress, one line per change:
	joined <members joined>/<members required>
	open
A member that leaves before the queue opens frees its place; once open,
the queue stays open when members leave.`, std)
	untilOpen := fs.Bool("until-open", false, "leave once the queue is open")
	pos, err := parse(fs, args, 2, 2)
	if err != nil {
		return err
	}
	queue, member := pos[0], pos[1]
	c, err := cf.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	m, err := c.JoinSync(ctx, queue, member)
	if err != nil {
		return ignoreCanceled(err)
	}
	defer m.Leave()
	// A line per change: the group's progress and its opening come as
	// separate events with the same counts.
	var last qbroker.SyncEvent
	printed, opened := false, false
	for {
		select {
		case ev, ok := <-m.Events():
			if !ok {
				return ignoreCanceled(m.Err())
			}
			if !printed || ev.Joined != last.Joined || ev.Required != last.Required {
				fmt.Fprintf(std.out, "joined %d/%d\n", ev.Joined, ev.Required)
				last, printed = ev, true
			}
			if ev.State == qbroker.SyncOpen && !opened {
				opened = true
				fmt.Fprintln(std.out, "open")
				if *untilOpen {
					return nil
				}
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// version is the build's version, set at link time:
//
//	go build -ldflags "-X main.version=v1.2.3" ./cmd/qbroker
//
// Without it, buildVersion reports what the Go toolchain recorded: the
// module version (for go install ...@v1.2.3) or the VCS revision.
var version string

// buildVersion returns version, or the build information's.
func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version // "(devel)" for a build in a checkout
	var rev, dirty string
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev != "" {
		v += " " + rev[:min(len(rev), 12)] + dirty
	}
	return v
}

func runVersion(std stdio, args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(&helpWriter{out: std.out, err: std.err})
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: qbroker version\n\nPrints the version of this qbroker command (also: qbroker --version).")
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("too many arguments: %q", fs.Args())
	}
	fmt.Fprintf(std.out, "qbroker %s %s %s/%s\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
