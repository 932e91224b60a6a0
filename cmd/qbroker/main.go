// Command qbroker runs the qbroker message broker and talks to it.
//
//	qbroker serve     run a broker against a ZooKeeper ensemble
//	qbroker dev       start a local ZooKeeper, then serve (make run)
//	qbroker queues | create | delete | publish | consume | peek | stats | purge | dlq | join
//	                  client commands against a running broker
//	qbroker version   print the version (also --version)
//	qbroker completion bash|zsh|fish
//	                  print a shell completion script
//
// Every command explains itself with --help. Help goes to standard output
// (exit status 0); usage errors go to standard error with exit status 2,
// other failures with 1. Flags default to QBROKER_* environment variables
// where noted.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// command is one subcommand. Each file registers its commands in init.
type command struct {
	name  string
	usage string // one line
	// run returns flag.ErrHelp after printing help, a usageError for bad
	// flags or arguments.
	run func(args []string) error
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

func main() {
	os.Exit(runMain(os.Args[1:]))
}

// runMain runs the command line args and returns the exit status.
func runMain(args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(os.Stdout)
		return 0
	case "help":
		if len(args) == 1 {
			usage(os.Stdout)
			return 0
		}
		args = []string{args[1], "--help"}
	case "-version", "--version":
		args = []string{"version"}
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "qbroker: unknown command %q\n\n", args[0])
		usage(os.Stderr)
		return 2
	}
	err := c.run(args[1:])
	var ue usageError
	var es exitStatus
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &es):
		return es.code // a command run by lock: its status, its own messages
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "qbroker %s: %v\n", c.name, err)
		return 2
	default:
		fmt.Fprintf(os.Stderr, "qbroker %s: %v\n", c.name, err)
		return 1
	}
}

func usage(w io.Writer) {
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
	fmt.Fprint(w, b.String())
}

// usageError is a bad command line: bad flags, arguments or QBROKER_*
// values. main prints it with exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// helpWriter is a FlagSet's output: it holds what the flag package prints
// (help, or an error and the usage) until flush sends it to standard
// output for --help and to standard error otherwise.
type helpWriter struct {
	out, err io.Writer
	buf      bytes.Buffer
}

func (h *helpWriter) Write(p []byte) (int, error) { return h.buf.Write(p) }

// flush writes what was held: to out when help was asked for.
func (h *helpWriter) flush(help bool) {
	w := h.err
	if help {
		w = h.out
	}
	_, _ = h.buf.WriteTo(w)
}

// parseFlags parses args with fs, whose output must be a *helpWriter (see
// newHelpWriter): flag.ErrHelp after printing help to standard output, a
// usageError after printing the error and usage to standard error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if describing != nil {
		describing(fs)
		return flag.ErrHelp
	}
	err := fs.Parse(args)
	if hw, ok := fs.Output().(*helpWriter); ok {
		hw.flush(errors.Is(err, flag.ErrHelp))
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		return usageError{err}
	}
	return err
}

// env returns the value of QBROKER_<name>, or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv("QBROKER_" + name); ok {
		return v
	}
	return def
}
