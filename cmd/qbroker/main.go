// Command qbroker runs the qbroker message broker and talks to it.
//
//	qbroker serve     run a broker against a ZooKeeper ensemble
//	qbroker dev       start a local ZooKeeper, then serve (make run)
//	qbroker queues | create | publish | consume | stats | purge | dlq
//	                  client commands against a running broker
//
// Every command explains itself with --help. Flags default to QBROKER_*
// environment variables where noted.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
)

// command is one subcommand. Each file registers its commands in init.
type command struct {
	name  string
	usage string // one line
	run   func(args []string) error
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "qbroker: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err := c.run(os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "qbroker %s: %v\n", c.name, err)
		os.Exit(1)
	}
}

func usage() {
	var b strings.Builder
	b.WriteString("usage: qbroker <command> [flags]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "  %-8s %s\n", n, commands[n].usage)
	}
	b.WriteString("\nRun 'qbroker <command> --help' for a command's flags.\n")
	fmt.Fprint(os.Stderr, b.String())
}

// env returns the value of QBROKER_<name>, or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv("QBROKER_" + name); ok {
		return v
	}
	return def
}
