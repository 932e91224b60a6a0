package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goSymbol matches what reads like a Go identifier in a message for people:
// a mixed-case word (DefaultVisibility, WithTLS, ZKSessions) or a qualified
// name (Config.ZKMigrateACL). ZooKeeper is a name, not a symbol.
var goSymbol = regexp.MustCompile(`\b([A-Z][a-z0-9]+[A-Z]\w*|[A-Z]{2,}[a-z]\w*|[A-Z]\w*\.[A-Z]\w*)\b`)

func goSymbols(msg string) []string {
	var out []string
	for _, m := range goSymbol.FindAllString(msg, -1) {
		if m != "ZooKeeper" {
			out = append(out, m)
		}
	}
	return out
}

// Errors of serve's settings, checked by the broker, name the flag the user
// typed, not the Go field it sets.
func TestServeErrorsNameFlags(t *testing.T) {
	bin := buildCommand(t, "v0.0.0-test")
	noZK := "127.0.0.1:1"
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--segment-size", "1"}, "--segment-size"},
		{[]string{"--max-queues", "100000000"}, "--max-queues"},
		{[]string{"--zk-sessions", "20"}, "--zk-sessions"},
		{[]string{"--max-streams", "-1"}, "--max-streams"},
		{[]string{"--max-conns-per-ip", "-1"}, "--max-conns-per-ip"},
		{[]string{"--root", "relative"}, "--root"},
		{[]string{"--id", "a/b"}, "--id"},
	} {
		args := append([]string{"serve", "--zk", noZK, "--metrics-listen", "", "--insecure"}, tc.args...)
		_, errOut, status := exitRun(t, bin, nil, args...)
		if status == 0 || !strings.Contains(errOut, tc.flag) || len(goSymbols(errOut)) > 0 {
			t.Errorf("qbroker %s: status %d, stderr %q; want an error naming %s and no Go symbol (found %v)",
				strings.Join(args, " "), status, errOut, tc.flag, goSymbols(errOut))
		}
	}
}

// A token without TLS is refused in the flags' words before dialling.
func TestClientTokenNeedsTLSNamesFlags(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := cli{t: t, addr: "127.0.0.1:1"}
	_, _, err := c.run("", "queues", "--token-file", tok)
	if err == nil || !strings.Contains(err.Error(), "--token-file") || !strings.Contains(err.Error(), "--tls-ca") || len(goSymbols(err.Error())) > 0 {
		t.Fatalf("queues --token-file without TLS: got %v, want an error naming --token-file and --tls-ca, no Go symbol", err)
	}
	if _, ok := err.(usageError); !ok {
		t.Errorf("got %T, want a usage error (exit status 2)", err)
	}
}

// A client command's refusal by the broker names no RPC or Go symbol.
func TestJoinRefusalNamesNoSymbol(t *testing.T) {
	c := cli{t: t, addr: startBroker(t)}
	c.ok("", "create", "fifo")
	_, _, err := c.run("", "join", "fifo", "m1")
	if err == nil {
		t.Fatal("join of a FIFO queue: no error")
	}
	// The status code the broker answered ends the message, as documented.
	msg := strings.TrimSuffix(err.Error(), " (FailedPrecondition)")
	if !strings.Contains(msg, "SYNC queue") || len(goSymbols(msg)) > 0 {
		t.Fatalf("join of a FIFO queue: got %v, want a refusal saying it needs a SYNC queue, no Go symbol (found %v)", err, goSymbols(msg))
	}
}
