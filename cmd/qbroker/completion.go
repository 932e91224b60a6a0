package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Shell completion: `qbroker completion bash|zsh|fish` prints a script
// that completes the command names, and each command's flags, from the
// commands this binary registers.

func init() {
	register(command{name: "completion", usage: "print a shell completion script: bash, zsh or fish", run: func(args []string) error {
		return runCompletion(stdio{out: os.Stdout, err: os.Stderr}, args)
	}})
}

// describing, when set, is handed each command's FlagSet by parseFlags
// instead of parsing: the command returns flag.ErrHelp at once, having
// done nothing. completion sets it to list the flags.
var describing func(*flag.FlagSet)

// completionFlag is one flag of a command; values, when set, are the
// only values it takes.
type completionFlag struct {
	name, usage string
	values      []string
}

// flagValues are the values of the flags that take one of a few words,
// by flag name (a name means the same in every command that has it).
var flagValues = map[string][]string{
	"mode":       {qbroker.AtMostOnce.String(), qbroker.AtLeastOnce.String()},
	"kind":       {qbroker.KindFIFO.String(), qbroker.KindPriority.String(), qbroker.KindSync.String()},
	"log-format": {"text", "json"},
	"log-level":  {"debug", "info", "warn", "error"},
}

// commandFlags returns each command's flags, by command name.
func commandFlags() map[string][]completionFlag {
	out := map[string][]completionFlag{}
	for name, c := range commands {
		var flags []completionFlag
		describing = func(fs *flag.FlagSet) {
			fs.VisitAll(func(f *flag.Flag) {
				usage, _, _ := strings.Cut(f.Usage, "\n")
				flags = append(flags, completionFlag{f.Name, usage, flagValues[f.Name]})
			})
		}
		_ = c.run(nil)
		describing = nil
		out[name] = flags
	}
	return out
}

// dash returns a flag as typed: --name, or -n for one letter.
func dash(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

func runCompletion(std stdio, args []string) error {
	fs := flag.NewFlagSet("completion", flag.ContinueOnError)
	fs.SetOutput(&helpWriter{out: std.out, err: std.err})
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: qbroker completion bash|zsh|fish

Prints a script that completes qbroker's commands and their flags.
	bash:  source <(qbroker completion bash)      (e.g. in ~/.bashrc)
	zsh:   source <(qbroker completion zsh)       (after compinit), or save it
	       as _qbroker in a directory of $fpath
	fish:  qbroker completion fish > ~/.config/fish/completions/qbroker.fish`)
	}
	if describing != nil {
		describing(fs)
		return flag.ErrHelp
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		fs.Output().(*helpWriter).flush(false)
		return usagef("want one shell: bash, zsh or fish")
	}
	var write func(io.Writer, []string, map[string][]completionFlag)
	switch fs.Arg(0) {
	case "bash":
		write = bashCompletion
	case "zsh":
		write = zshCompletion
	case "fish":
		write = fishCompletion
	default:
		return usagef("unknown shell %q: want bash, zsh or fish", fs.Arg(0))
	}
	flags := commandFlags()
	names := make([]string, 0, len(flags))
	for n := range flags {
		names = append(names, n)
	}
	sort.Strings(names)
	write(std.out, names, flags)
	return nil
}

func flagWords(fl []completionFlag) string {
	words := make([]string, len(fl))
	for i, f := range fl {
		words[i] = dash(f.name)
	}
	return strings.Join(words, " ")
}

func bashCompletion(w io.Writer, names []string, flags map[string][]completionFlag) {
	fmt.Fprintf(w, `# bash completion for qbroker: source <(qbroker completion bash)
_qbroker() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	if [ "$COMP_CWORD" -le 1 ]; then
		COMPREPLY=($(compgen -W "help %[1]s" -- "$cur"))
		return
	fi
	case ${COMP_WORDS[COMP_CWORD-1]} in
%[2]s	esac
	local flags=
	case ${COMP_WORDS[1]} in
	help) [ "$COMP_CWORD" -eq 2 ] && COMPREPLY=($(compgen -W "%[1]s" -- "$cur")); return ;;
	completion) [ "$COMP_CWORD" -eq 2 ] && COMPREPLY=($(compgen -W "bash zsh fish" -- "$cur")); return ;;
`, strings.Join(names, " "), bashValueCases(flags))
	for _, n := range names {
		if n != "completion" && len(flags[n]) > 0 {
			fmt.Fprintf(w, "\t%s) flags=%q ;;\n", n, flagWords(flags[n]))
		}
	}
	fmt.Fprint(w, `	esac
	case $cur in
	-*) COMPREPLY=($(compgen -W "$flags --help" -- "$cur")) ;;
	*) COMPREPLY=($(compgen -f -- "$cur")) ;;
	esac
}
complete -F _qbroker qbroker
`)
}

// valueFlags returns the flags that take one of a few words, with their
// words, sorted by name.
func valueFlags(flags map[string][]completionFlag) []completionFlag {
	seen := map[string]bool{}
	var out []completionFlag
	for _, fl := range flags {
		for _, f := range fl {
			if len(f.values) > 0 && !seen[f.name] {
				seen[f.name] = true
				out = append(out, f)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// bashValueCases are the case arms completing the value of the flag
// before the cursor (--mode or -mode).
func bashValueCases(flags map[string][]completionFlag) string {
	var b strings.Builder
	for _, f := range valueFlags(flags) {
		fmt.Fprintf(&b, "\t--%[1]s|-%[1]s) COMPREPLY=($(compgen -W %[2]q -- \"$cur\")); return ;;\n", f.name, strings.Join(f.values, " "))
	}
	return b.String()
}

// zshEntry quotes a _describe entry, "name:description" (a colon in the
// name is escaped), as a zsh single-quoted word.
func zshEntry(name, desc string) string {
	s := strings.ReplaceAll(name, ":", `\:`) + ":" + desc
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func zshCompletion(w io.Writer, names []string, flags map[string][]completionFlag) {
	fmt.Fprint(w, "#compdef qbroker\n# zsh completion for qbroker: source <(qbroker completion zsh), or save as _qbroker in $fpath\n_qbroker() {\n\tlocal -a cmds flags\n\tcmds=(\n")
	for _, n := range names {
		fmt.Fprintf(w, "\t\t%s\n", zshEntry(n, commands[n].usage))
	}
	fmt.Fprint(w, "\t\t'help:show a command'\\''s help'\n\t)\n\tif (( CURRENT == 2 )); then\n\t\t_describe command cmds\n\t\treturn\n\tfi\n\tcase $words[2] in\n")
	fmt.Fprint(w, "\thelp) (( CURRENT == 3 )) && _describe command cmds; return ;;\n")
	fmt.Fprint(w, "\tcompletion) (( CURRENT == 3 )) && compadd bash zsh fish; return ;;\n\tesac\n\tcase $words[CURRENT-1] in\n")
	for _, f := range valueFlags(flags) {
		fmt.Fprintf(w, "\t--%[1]s|-%[1]s) compadd %[2]s; return ;;\n", f.name, strings.Join(f.values, " "))
	}
	fmt.Fprint(w, "\tesac\n\tcase $words[2] in\n")
	for _, n := range names {
		if n == "completion" || len(flags[n]) == 0 {
			continue
		}
		fmt.Fprintf(w, "\t%s) flags=(", n)
		for _, f := range flags[n] {
			fmt.Fprintf(w, " %s", zshEntry(dash(f.name), f.usage))
		}
		fmt.Fprint(w, " ) ;;\n")
	}
	fmt.Fprint(w, `	esac
	if [[ $PREFIX == -* ]]; then
		_describe flag flags
	else
		_files
	fi
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
	_qbroker "$@"
else
	compdef _qbroker qbroker
fi
`)
}

// fishQuote quotes s as a fish single-quoted string.
func fishQuote(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}

func fishCompletion(w io.Writer, names []string, flags map[string][]completionFlag) {
	fmt.Fprint(w, "# fish completion for qbroker: qbroker completion fish > ~/.config/fish/completions/qbroker.fish\ncomplete -c qbroker -e\n")
	all := strings.Join(names, " ") + " help"
	for _, n := range names {
		fmt.Fprintf(w, "complete -c qbroker -n 'not __fish_seen_subcommand_from %s' -f -a %s -d %s\n", all, n, fishQuote(commands[n].usage))
	}
	fmt.Fprintf(w, "complete -c qbroker -n 'not __fish_seen_subcommand_from %s' -f -a help -d 'show a command'\\''s help'\n", all)
	fmt.Fprintf(w, "complete -c qbroker -n '__fish_seen_subcommand_from help' -f -a %s\n", fishQuote(strings.Join(names, " ")))
	fmt.Fprint(w, "complete -c qbroker -n '__fish_seen_subcommand_from completion' -f -a 'bash zsh fish'\n")
	for _, n := range names {
		for _, f := range flags[n] {
			opt := "-l " + f.name
			if len(f.name) == 1 {
				opt = "-o " + f.name
			}
			if len(f.values) > 0 {
				opt += " -x -a " + fishQuote(strings.Join(f.values, " "))
			}
			fmt.Fprintf(w, "complete -c qbroker -n '__fish_seen_subcommand_from %s' %s -d %s\n", n, opt, fishQuote(f.usage))
		}
	}
}
