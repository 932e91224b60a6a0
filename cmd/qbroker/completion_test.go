package main

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// completionScript returns the script for shell, written to a file.
func completionScript(t *testing.T, shell string) (string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := runCompletion(stdio{out: &out, err: &errOut}, []string{shell}); err != nil {
		t.Fatalf("completion %s: %v (%s)", shell, err, errOut.String())
	}
	p := filepath.Join(t.TempDir(), "qbroker."+shell)
	if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, out.String()
}

// Every script names every command and the flags of each.
func TestCompletionScriptsText(t *testing.T) {
	flags := commandFlags()
	if got := flags["publish"]; !slices.ContainsFunc(got, func(f completionFlag) bool { return f.name == "header" }) {
		t.Fatalf("publish flags %v lack header", got)
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		_, text := completionScript(t, shell)
		for name, fl := range flags {
			if !strings.Contains(text, name) {
				t.Errorf("%s script lacks command %s", shell, name)
			}
			for _, f := range fl {
				want := dash(f.name)
				if shell == "fish" {
					want = "-l " + f.name
					if len(f.name) == 1 {
						want = "-o " + f.name
					}
				}
				if !strings.Contains(text, want) {
					t.Errorf("%s script lacks %s's %s", shell, name, want)
				}
			}
		}
	}
}

// Every completed flag value is one its flag accepts, in every command
// that has the flag; every flag of values exists.
func TestCompletionFlagValues(t *testing.T) {
	found := map[string]bool{}
	for name, c := range commands {
		describing = func(fs *flag.FlagSet) {
			fs.VisitAll(func(f *flag.Flag) {
				for _, v := range flagValues[f.Name] {
					found[f.Name] = true
					if err := f.Value.Set(v); err != nil {
						t.Errorf("%s --%s %s: %v", name, f.Name, v, err)
					}
				}
			})
		}
		_ = c.run(nil)
		describing = nil
	}
	for name := range flagValues {
		if !found[name] {
			t.Errorf("flag values for --%s, which no command has", name)
		}
	}
	for _, f := range commandFlags()["consume"] {
		if f.name == "mode" && len(f.values) != 2 {
			t.Errorf("consume --mode: values %v, want the two delivery modes", f.values)
		}
	}
}

// The bash script completes commands, help topics, shells and flags.
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	script, _ := completionScript(t, "bash")
	for _, tc := range []struct {
		words string // the command line, the last word being completed
		want  string
	}{
		{"qbroker pe", "peek"},
		{"qbroker pu", "publish purge"},
		{"qbroker help d", "delete dev dlq"},
		{"qbroker completion ", "bash zsh fish"},
		{"qbroker publish --he", "--header --help"},
		{"qbroker publish --content", "--content-type"},
		{"qbroker peek -", "--addr -n --timeout --tls --tls-ca --tls-cert --tls-key --tls-server-name --token-file --help"},
		{"qbroker delete q --y", "--yes"},
		{"qbroker consume --mode ", "at-most-once at-least-once"},
		{"qbroker consume q -mode at-l", "at-least-once"},
		{"qbroker create q --kind ", "fifo priority sync"},
		{"qbroker create --kind p", "priority"},
		{"qbroker serve --log-format ", "text json"},
		{"qbroker dev --log-level w", "warn"},
	} {
		words := strings.Split(tc.words, " ")
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = "'" + w + "'"
		}
		prog := "source " + script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" +
			strconv.Itoa(len(words)-1) + "\n_qbroker\necho \"${COMPREPLY[*]}\"\n"
		out, err := exec.Command(bash, "--norc", "--noprofile", "-c", prog).CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", tc.words, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.words, got, tc.want)
		}
	}
}

// zsh and fish, when installed, load their scripts and complete.
func TestCompletionZshFish(t *testing.T) {
	t.Run("zsh", func(t *testing.T) {
		zsh, err := exec.LookPath("zsh")
		if err != nil {
			t.Skip("zsh not installed; its script is checked by TestCompletionScriptsText")
		}
		script, _ := completionScript(t, "zsh")
		prog := "autoload -Uz compinit && compinit -u && source " + script + " && whence -w _qbroker && print ${_comps[qbroker]}"
		out, err := exec.Command(zsh, "-f", "-c", prog).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "_qbroker: function") || !strings.HasSuffix(strings.TrimSpace(string(out)), "_qbroker") {
			t.Fatalf("zsh: %v\n%s", err, out)
		}
	})
	t.Run("fish", func(t *testing.T) {
		fish, err := exec.LookPath("fish")
		if err != nil {
			t.Skip("fish not installed; its script is checked by TestCompletionScriptsText")
		}
		script, _ := completionScript(t, "fish")
		for words, want := range map[string][]string{
			"qbroker pe":           {"peek"},
			"qbroker publish --he": {"--header"},
			"qbroker completion ":  {"bash", "zsh", "fish"},
		} {
			out, err := exec.Command(fish, "--no-config", "-c", "source "+script+"; complete -C '"+words+"'").CombinedOutput()
			if err != nil {
				t.Fatalf("%q: %v\n%s", words, err, out)
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				got = append(got, strings.SplitN(l, "\t", 2)[0])
			}
			for _, w := range want {
				if !slices.Contains(got, w) {
					t.Errorf("%q: got %v, want %s among them", words, got, w)
				}
			}
		}
	})
}
