package main

import (
	"crypto/tls"
	"io"
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

// With authentication on, /metrics and the Go profiles of --metrics-tls
// need a client certificate or a bearer token: without one 401; /metrics
// shows an identity only the queue series of the queues it may view; the
// profiles need the debug action (403 without it). /healthz stays open.
func TestMetricsListenerAuthentication(t *testing.T) {
	dir := t.TempDir()
	if err := tlsutil.Generate(dir, "app-1"); err != nil {
		t.Fatal(err)
	}
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var tokens strings.Builder
	tok := map[string]string{}
	for _, id := range []string{"ops", "scraper"} {
		tk, line, err := broker.MintToken(id)
		if err != nil {
			t.Fatal(err)
		}
		tok[id] = tk
		tokens.WriteString(line + "\n")
	}
	ca := filepath.Join(dir, tlsutil.CAFile)
	addr, metrics := freeAddr(t), freeAddr(t)
	startServe(t, "--zk", zktest.Addr(t), "--root", zktest.Root(t), "--listen", addr,
		"--metrics-listen", metrics, "--log-level", "error", "--zk-auth-file", write("zk-auth", "qbroker:secret\n"),
		"--tls-cert", filepath.Join(dir, tlsutil.ServerCertFile), "--tls-key", filepath.Join(dir, tlsutil.ServerKeyFile),
		"--tls-client-ca", ca, "--auth-rules", write("rules", "ops all *\nscraper view orders.*\napp-1 publish,consume orders.*\n"),
		"--auth-tokens", write("tokens", tokens.String()), "--metrics-tls", "--pprof")
	c := cli{t: t, addr: addr}
	admin := []string{"--tls-ca", ca, "--token-file", write("ops.token", tok["ops"]+"\n")}
	zktest.WaitFor(t, 30*time.Second, "the broker to serve", func() bool {
		_, _, err := c.run("", append([]string{"queues"}, admin...)...)
		return err == nil
	})
	c.ok("", append([]string{"create", "orders.eu", "billing"}, admin...)...)
	c.ok("", append([]string{"publish", "orders.eu", "a"}, admin...)...)
	c.ok("", append([]string{"publish", "billing", "b"}, admin...)...)

	pool, err := tlsutil.LoadPool(ca)
	if err != nil {
		t.Fatal(err)
	}
	anon := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, tlsutil.ClientCertFile), filepath.Join(dir, tlsutil.ClientKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	withCert := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool,
		Certificates: []tls.Certificate{cert}}}}
	get := func(hc *http.Client, path, token string, want int) string {
		t.Helper()
		req, err := http.NewRequest("GET", "https://"+metrics+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("GET %s (token %v, certificate %v): %d, want %d\n%.500s", path, token != "", hc == withCert, resp.StatusCode, want, body)
		}
		return string(body)
	}
	const (
		ordersSeries  = `qbroker_messages_published_total{queue="orders.eu"}`
		billingSeries = `qbroker_messages_published_total{queue="billing"}`
	)
	get(anon, "/healthz", "", http.StatusOK)
	if body := get(anon, "/metrics", "", http.StatusUnauthorized); !strings.Contains(body, "Authorization: Bearer") {
		t.Errorf("/metrics without credentials says %q, want how to authenticate", body)
	}
	get(anon, "/metrics", "not-a-token", http.StatusUnauthorized)
	get(anon, "/debug/pprof/", "", http.StatusUnauthorized)
	get(anon, "/debug/pprof/heap", "", http.StatusUnauthorized)
	get(anon, "/debug/pprof/goroutine?debug=1", "", http.StatusUnauthorized)

	all := get(anon, "/metrics", tok["ops"], http.StatusOK)
	for _, want := range []string{ordersSeries, billingSeries, "qbroker_zk_session_state"} {
		if !strings.Contains(all, want) {
			t.Errorf("/metrics for ops (all *) lacks %s", want)
		}
	}
	for name, body := range map[string]string{
		"scraper (token, view orders.*)":        get(anon, "/metrics", tok["scraper"], http.StatusOK),
		"app-1 (certificate, publish orders.*)": get(withCert, "/metrics", "", http.StatusOK),
	} {
		if !strings.Contains(body, ordersSeries) || !strings.Contains(body, "qbroker_zk_session_state") {
			t.Errorf("/metrics for %s lacks %s or qbroker_zk_session_state", name, ordersSeries)
		}
		if strings.Contains(body, `queue="billing"`) {
			t.Errorf("/metrics for %s names queue billing, which it may not view", name)
		}
	}

	get(anon, "/debug/pprof/", tok["ops"], http.StatusOK)
	get(anon, "/debug/pprof/goroutine?debug=1", tok["ops"], http.StatusOK)
	if body := get(anon, "/debug/pprof/heap", tok["scraper"], http.StatusForbidden); !strings.Contains(body, "debug action") {
		t.Errorf("pprof for scraper says %q, want the action it lacks", body)
	}
	get(withCert, "/debug/pprof/", "", http.StatusForbidden)
}
