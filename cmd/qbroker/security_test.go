package main

import (
	"bytes"
	"crypto/tls"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/tlsutil"
	"github.com/qbroker/qbroker/internal/zktest"
)

// serve refuses to listen beyond loopback without TLS and authentication
// unless --insecure, which then warns at start; security flags that need
// one another are checked.
func TestServeExposureChecks(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // substring of the error; "" means accepted
	}{
		{nil, ""},
		{[]string{"--listen", "0.0.0.0:7070"}, "--listen 0.0.0.0:7070 is not a loopback address"},
		{[]string{"--listen", ":7070"}, "is not a loopback address"},
		{[]string{"--listen", "[::1]:7070", "--metrics-listen", "10.0.0.1:9090"}, "--metrics-listen 10.0.0.1:9090 is not a loopback address"},
		{[]string{"--listen", "0.0.0.0:7070", "--tls-cert", "c", "--tls-key", "k"}, "needs --tls-cert, --tls-key and --auth-rules"},
		{[]string{"--listen", "0.0.0.0:7070", "--tls-cert", "c", "--tls-key", "k", "--auth-rules", "r", "--auth-tokens", "t"}, ""},
		{[]string{"--tls-cert", "c", "--tls-key", "k", "--auth-rules", "r"}, "--auth-rules needs --auth-tokens, --jwt-jwks or --tls-client-ca"},
		{[]string{"--tls-cert", "c", "--tls-key", "k", "--auth-rules", "r", "--jwt-jwks", "j", "--jwt-issuer", "i", "--jwt-audience", "a"}, ""},
		{[]string{"--tls-cert", "c", "--tls-key", "k", "--auth-rules", "r", "--jwt-jwks", "j"}, "--jwt-jwks needs --jwt-issuer and --jwt-audience"},
		{[]string{"--tls-cert", "c", "--tls-key", "k", "--auth-tokens", "t", "--jwt-jwks", "j", "--jwt-issuer", "i", "--jwt-audience", "a"}, "--jwt-jwks needs --auth-rules"},
		{[]string{"--listen", "0.0.0.0:7070", "--insecure"}, ""},
		{[]string{"--listen", "localhost:7070", "--metrics-listen", "0.0.0.0:9090", "--tls-cert", "c", "--tls-key", "k", "--metrics-tls", "--console=false"}, ""},
		{[]string{"--listen", "localhost:7070", "--metrics-listen", "0.0.0.0:9090", "--tls-cert", "c", "--tls-key", "k", "--metrics-tls"}, "the web console there needs --auth-rules"},
		{[]string{"--listen", "localhost:7070", "--metrics-listen", "0.0.0.0:9090", "--tls-cert", "c", "--tls-key", "k", "--metrics-tls",
			"--tls-client-ca", "ca", "--auth-rules", "r"}, ""},
		{[]string{"--tls-cert", "c"}, "--tls-cert and --tls-key go together"},
		{[]string{"--auth-rules", "r", "--auth-tokens", "t"}, "--auth-rules needs --tls-cert"},
		{[]string{"--auth-tokens", "x", "--tls-cert", "c", "--tls-key", "k"}, "--auth-tokens needs --auth-rules"},
		{[]string{"--tls-require-client-cert", "--tls-cert", "c", "--tls-key", "k"}, "--tls-require-client-cert needs --tls-client-ca"},
		{[]string{"--metrics-tls"}, "--metrics-tls needs --tls-cert"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			o := serveFlags(fs)
			if err := fs.Parse(append([]string{"--zk-auth-file", "zk-auth"}, tt.args...)); err != nil {
				t.Fatal(err)
			}
			err := o.validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
	var logs bytes.Buffer
	o := &serveOptions{security: securityOptions{insecure: true}}
	o.security.logExposure(slog.New(slog.NewTextHandler(&logs, nil)), "0.0.0.0:7070", "127.0.0.1:9090")
	if !strings.Contains(logs.String(), "without TLS") || !strings.Contains(logs.String(), "no authentication") {
		t.Fatalf("--insecure beyond loopback logged %q, want warnings about TLS and authentication", logs.String())
	}
}

// qbroker serve with TLS, a client CA, tokens and rules: the client
// commands connect with a token or a client certificate, get what the
// rules allow and are refused the rest; metrics are served over HTTPS.
func TestServeSecured(t *testing.T) {
	dir := t.TempDir()
	if err := tlsutil.Generate(dir, "dev-client"); err != nil {
		t.Fatal(err)
	}
	tok, line, err := broker.MintToken("admin")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tokenFile := write("admin.token", tok+"\n")
	tokens := write("tokens", line+"\n")
	rules := write("rules", "admin all *\ndev-client publish,consume orders.*\n")
	zkAuth := write("zk-auth", "qbroker:secret\n")
	ca := filepath.Join(dir, tlsutil.CAFile)

	addr, metrics := freeAddr(t), freeAddr(t)
	startServe(t, "--zk", zktest.Addr(t), "--root", zktest.Root(t), "--listen", addr,
		"--metrics-listen", metrics, "--log-level", "error", "--zk-auth-file", zkAuth,
		"--tls-cert", filepath.Join(dir, tlsutil.ServerCertFile), "--tls-key", filepath.Join(dir, tlsutil.ServerKeyFile),
		"--tls-client-ca", ca, "--auth-rules", rules, "--auth-tokens", tokens, "--metrics-tls")

	c := cli{t: t, addr: addr}
	admin := []string{"--tls-ca", ca, "--token-file", tokenFile}
	cert := []string{"--tls-ca", ca, "--tls-cert", filepath.Join(dir, tlsutil.ClientCertFile), "--tls-key", filepath.Join(dir, tlsutil.ClientKeyFile)}
	zktest.WaitFor(t, 30*time.Second, "the broker to serve", func() bool {
		_, _, err := c.run("", append([]string{"queues"}, admin...)...)
		return err == nil
	})
	c.ok("", append([]string{"create", "orders.eu", "billing"}, admin...)...)
	c.ok("", append([]string{"publish", "orders.eu", "a"}, cert...)...)
	if got := payloads(t, c.ok("", append([]string{"consume", "-n", "1", "orders.eu"}, cert...)...), "1"); len(got) != 1 || got[0] != "a" {
		t.Fatalf("consumed %q, want a", got)
	}
	refused := func(want string, args ...string) {
		t.Helper()
		_, _, err := c.run("", args...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("qbroker %s: got %v, want %q", strings.Join(args, " "), err, want)
		}
	}
	refused(`may not publish queue "billing" (PermissionDenied)`, append([]string{"publish", "billing", "x"}, cert...)...)
	refused(`may not delete queue "orders.eu" (PermissionDenied)`, append([]string{"delete", "--yes", "orders.eu"}, cert...)...)
	refused("(Unauthenticated)", "queues", "--tls-ca", ca)

	pool, err := tlsutil.LoadPool(ca)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := hc.Get("https://" + metrics + "/healthz")
	if err != nil {
		t.Fatalf("metrics over HTTPS: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz over HTTPS: %d %s", resp.StatusCode, body)
	}

	// The web console acts as the browser's client certificate; without
	// one it refuses, saying why.
	console := func(hc *http.Client, want int, says string) {
		t.Helper()
		resp, err := hc.Get("https://" + metrics + "/")
		if err != nil {
			t.Fatalf("console: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || !strings.Contains(string(body), says) {
			t.Fatalf("console: %d, want %d with %q\n%s", resp.StatusCode, want, says, body)
		}
	}
	console(hc, http.StatusUnauthorized, "no verified client certificate")
	clientCert, err := tls.LoadX509KeyPair(filepath.Join(dir, tlsutil.ClientCertFile), filepath.Join(dir, tlsutil.ClientKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	withCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool,
		Certificates: []tls.Certificate{clientCert}}}}
	console(withCert, http.StatusOK, "acting as <b>dev-client</b>")
}

// qbroker token prints a token and its tokens-file line; qbroker certs
// writes the development files and refuses to overwrite them; dev
// --secure-dir points serve at its files.
func TestTokenAndCertsCommands(t *testing.T) {
	bin := buildCommand(t, "v0.0.0-test")
	out, errOut, st := exitRun(t, bin, nil, "token", "ops")
	if st != 0 {
		t.Fatalf("token: status %d: %s", st, errOut)
	}
	l := lines(out)
	if len(l) != 2 || !strings.HasPrefix(l[0], "qbt_") || !strings.HasPrefix(l[1], "ops sha256:") || strings.Contains(l[1], l[0]) {
		t.Fatalf("token printed %q, want the token, then \"ops sha256:<hash>\"", out)
	}
	if _, err := broker.ParseTokens([]byte(l[1])); err != nil {
		t.Fatalf("token line does not parse: %v", err)
	}
	if _, _, st := exitRun(t, bin, nil, "token", "bad name"); st != 2 {
		t.Fatalf("token with a space in the identity: status %d, want 2", st)
	}
	dir := filepath.Join(t.TempDir(), "certs")
	if _, errOut, st := exitRun(t, bin, nil, "certs", "--dir", dir); st != 0 {
		t.Fatalf("certs: status %d: %s", st, errOut)
	}
	for _, f := range []string{tlsutil.CAFile, tlsutil.ServerCertFile, tlsutil.ServerKeyFile, tlsutil.ClientCertFile, tlsutil.ClientKeyFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if _, errOut, st := exitRun(t, bin, nil, "certs", "--dir", dir); st != 1 || !strings.Contains(errOut, "exists") {
		t.Fatalf("certs over existing files: status %d, stderr %q; want 1 and a refusal", st, errOut)
	}

	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	o := serveFlags(fs)
	sec := filepath.Join(t.TempDir(), "sec")
	var msg bytes.Buffer
	if err := fs.Parse([]string{"--listen", "0.0.0.0:7171"}); err != nil {
		t.Fatal(err)
	}
	if err := devSecurity(sec, o, &msg); err != nil {
		t.Fatal(err)
	}
	for _, l := range lines(msg.String())[1:] {
		if !strings.Contains(l, "qbroker queues --addr 127.0.0.1:7171 --tls-ca ") {
			t.Errorf("dev --secure-dir --listen 0.0.0.0:7171 printed %q, want client commands with --addr 127.0.0.1:7171", l)
		}
	}
	o.zkAuth.generated = true // as dev does
	if err := o.validate(); err != nil {
		t.Fatalf("dev --secure-dir options: %v", err)
	}
	if _, err := o.security.auth(nil); err != nil {
		t.Fatalf("dev --secure-dir auth files: %v", err)
	}
	if _, err := o.security.serverTLS(nil); err != nil {
		t.Fatalf("dev --secure-dir certificates: %v", err)
	}
	if err := devSecurity(sec, o, io.Discard); err != nil {
		t.Fatalf("second dev --secure-dir on the same directory: %v", err)
	}
}
