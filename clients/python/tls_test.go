package python_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/tlsutil"
	"github.com/qbroker/qbroker/internal/zktest"
)

// The example runs against a broker with TLS and authentication on, as the
// security guide (docs/security.md) sets one up: --tls-ca and --token-file, or
// --tls-ca with a client certificate. Without credentials the broker
// refuses it (UNAUTHENTICATED), and a token without TLS is refused before
// any call.
func TestPythonExampleTLSAndToken(t *testing.T) {
	py := python(t)
	dir := t.TempDir()
	if err := tlsutil.Generate(dir, "py-client"); err != nil {
		t.Fatal(err)
	}
	tok, line, err := broker.MintToken("py-token")
	if err != nil {
		t.Fatal(err)
	}
	rules, tokens, tokenFile := filepath.Join(dir, "rules"), filepath.Join(dir, "tokens"), filepath.Join(dir, "py.token")
	for f, data := range map[string]string{rules: "py-token all *\npy-client all *\n", tokens: line + "\n", tokenFile: tok + "\n"} {
		if err := os.WriteFile(f, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	auth, err := broker.NewAuth(broker.AuthConfig{RulesFile: rules, TokensFile: tokens})
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, err := tlsutil.Server(tlsutil.ServerConfig{CertFile: filepath.Join(dir, tlsutil.ServerCertFile),
		KeyFile: filepath.Join(dir, tlsutil.ServerKeyFile), ClientCAFile: filepath.Join(dir, tlsutil.CAFile)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t), SessionTimeout: 4 * time.Second, Auth: auth},
		brokertest.Options{ServerOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(srvTLS))}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	ca := filepath.Join(dir, tlsutil.CAFile)

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"token", []string{"--tls-ca", ca, "--token-file", tokenFile, "--queue", "py-token"}},
		{"client certificate", []string{"--tls-ca", ca, "--tls-cert", filepath.Join(dir, tlsutil.ClientCertFile),
			"--tls-key", filepath.Join(dir, tlsutil.ClientKeyFile), "--queue", "py-cert"}},
	} {
		code, out, errOut := runExample(t, py, append([]string{"--addr", s.Addr, "--count", "3", "--prefix", "tls"}, tc.args...)...)
		if code != 0 || strings.Count(out, "\nacked ") != 3 || !strings.Contains(out, "ready=0 in_flight=0 dead=0") {
			t.Errorf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", tc.name, code, out, errOut)
		}
	}

	code, out, errOut := runExample(t, py, "--addr", s.Addr, "--tls-ca", ca, "--count", "1", "--timeout", "5")
	if code != 1 || !strings.Contains(errOut, "UNAUTHENTICATED") {
		t.Errorf("TLS without a credential: exit %d, want 1 with UNAUTHENTICATED\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	code, out, errOut = runExample(t, py, "--addr", s.Addr, "--token-file", tokenFile, "--count", "1")
	if code != 2 || !strings.Contains(errOut, "needs TLS: give --tls-ca") {
		t.Errorf("token without TLS: exit %d, want 2 naming --tls-ca\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
