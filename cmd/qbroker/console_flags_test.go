package main

import (
	"flag"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/zktest"
)

// --console-host repeats and takes lists; it replaces
// $QBROKER_CONSOLE_HOSTS; a bad name is a usage error naming it.
func TestConsoleHostFlag(t *testing.T) {
	parse := func(args ...string) (*serveOptions, error) {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o := serveFlags(fs)
		if err := parseFlags(fs, append([]string{"--insecure"}, args...)); err != nil {
			return o, err
		}
		return o, o.validate()
	}
	o, err := parse("--console-host", "a.example, b.example:8443", "--console-host", "[::2]")
	if err != nil || strings.Join(o.consoleHosts.names, " ") != "a.example b.example:8443 [::2]" {
		t.Fatalf("hosts %q, %v; want a.example b.example:8443 [::2]", o.consoleHosts.names, err)
	}
	if _, err := parse("--console-host", "http://a.example"); err == nil || !strings.Contains(err.Error(), "http://a.example") {
		t.Fatalf("--console-host http://a.example: %v, want an error naming it", err)
	}
	t.Setenv("QBROKER_CONSOLE_HOSTS", "env.example")
	if o, err := parse(); err != nil || strings.Join(o.consoleHosts.names, " ") != "env.example" {
		t.Fatalf("from the environment: %q, %v; want env.example", o.consoleHosts.names, err)
	}
	if o, err := parse("--console-host", "flag.example"); err != nil || strings.Join(o.consoleHosts.names, " ") != "flag.example" {
		t.Fatalf("flag over the environment: %q, %v; want flag.example", o.consoleHosts.names, err)
	}
	t.Setenv("QBROKER_CONSOLE_HOSTS", "bad/name")
	if _, err := parse(); err == nil || !strings.Contains(err.Error(), "QBROKER_CONSOLE_HOSTS") {
		t.Fatalf("a bad $QBROKER_CONSOLE_HOSTS: %v, want an error naming it", err)
	}
}

// qbroker serve's console answers its loopback names and the names of
// --console-host, and refuses any other Host with 421, saying which flag
// adds a name.
func TestServeConsoleHosts(t *testing.T) {
	addr, metrics := freeAddr(t), freeAddr(t)
	stop := startServe(t, "--zk", zktest.Addr(t), "--root", zktest.Root(t), "--listen", addr,
		"--metrics-listen", metrics, "--console-host", "queues.example.com", "--log-level", "error", "--insecure")

	get := func(host string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+metrics+"/console/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	_, port, err := net.SplitHostPort(metrics)
	if err != nil {
		t.Fatal(err)
	}
	zktest.WaitFor(t, 30*time.Second, "the console", func() bool {
		code, _ := get(metrics)
		return code == http.StatusOK
	})
	for _, h := range []string{"localhost:" + port, "queues.example.com:" + port, "queues.example.com"} {
		if code, body := get(h); code != http.StatusOK {
			t.Errorf("Host %s: %d, want 200\n%s", h, code, body)
		}
	}
	code, body := get("rebind.attacker.example:" + port)
	if code != http.StatusMisdirectedRequest || !strings.Contains(body, "--console-host rebind.attacker.example") ||
		!strings.Contains(body, "queues.example.com") {
		t.Errorf("Host rebind.attacker.example: %d, want 421 naming the flag and the names\n%s", code, body)
	}

	stop()
}
