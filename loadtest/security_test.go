package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

func TestSecurityFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // "" means accepted
	}{
		{[]string{"--spawn-brokers", "1", "--spawn-secure"}, ""},
		{[]string{"--broker", "127.0.0.1:7070", "--tls-ca", "ca.pem", "--token-file", "t"}, ""},
		{[]string{"--broker", "127.0.0.1:7070", "--spawn-secure"}, "--spawn-secure needs --spawn-brokers"},
		{[]string{"--spawn-brokers", "1", "--spawn-secure", "--tls-ca", "ca.pem"}, "no --tls-* or --token-file"},
		{[]string{"--broker", "127.0.0.1:7070", "--token-file", "t"}, "--token-file needs --tls-ca"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := parseFlags(tt.args, io.Discard)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestEndToEndSecure runs a short load test against a broker spawned with
// TLS and authentication (--spawn-secure): every call carries the token
// over TLS, and every message is accounted for.
func TestEndToEndSecure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topo, _ := spawnForTest(ctx, t, 1, true)
	if topo.Security == nil || topo.Security.TokenFile == "" || topo.Security.TLS.CAFile == "" {
		t.Fatalf("spawned secure topology without client credentials: %+v", topo.Security)
	}
	cfg := Config{
		Producers: 2, Consumers: 4, ConnsPerBroker: 1, Messages: 500, Payload: 100, Batch: 10, Prefetch: 4,
		Mode: qbroker.AtLeastOnce, Queue: "e2e-secure", Order: orderStrict,
		Timeout: 2 * time.Minute, DrainTimeout: time.Minute,
	}
	var stdout, stderr bytes.Buffer
	if code := runOn(ctx, cfg, topo, &stdout, &stderr); code != 0 {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}
	// The same brokers refuse a client without the token.
	c, err := qbroker.Dial(ctx, topo.Brokers[0], qbroker.WithTLSFiles(topo.Security.TLS))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ListQueues(ctx, ""); !errors.Is(err, qbroker.ErrUnauthenticated) {
		t.Fatalf("ListQueues without the token: got %v, want ErrUnauthenticated", err)
	}
}
