package main

import (
	"context"
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

// A client command whose TLS flags do not match the broker says which
// flags to change: no TLS to a TLS broker, TLS to a plaintext one, no
// client certificate to a broker that requires one.
func TestClientTLSMismatchHints(t *testing.T) {
	dir := t.TempDir()
	if err := tlsutil.Generate(dir, "app-1"); err != nil {
		t.Fatal(err)
	}
	srvTLS, err := tlsutil.Server(tlsutil.ServerConfig{CertFile: filepath.Join(dir, tlsutil.ServerCertFile),
		KeyFile: filepath.Join(dir, tlsutil.ServerKeyFile), ClientCAFile: filepath.Join(dir, tlsutil.CAFile), RequireClientCert: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := brokertest.Start(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t)},
		brokertest.Options{ServerOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(srvTLS))}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	mtls, plain := cli{t: t, addr: s.Addr}, cli{t: t, addr: startBroker(t)}
	ca := filepath.Join(dir, tlsutil.CAFile)
	for _, tt := range []struct {
		c    cli
		args []string
		want string
	}{
		{mtls, nil, "the broker at " + mtls.addr + " speaks TLS: pass --tls-ca FILE"},
		{plain, []string{"--tls-ca", ca}, "the broker at " + plain.addr + " does not speak TLS (plaintext gRPC): drop --tls, --tls-ca"},
		{mtls, []string{"--tls-ca", ca}, "the broker at " + mtls.addr + " requires a client certificate (mutual TLS): pass --tls-cert FILE and --tls-key FILE"},
	} {
		_, _, err := tt.c.run("", append([]string{"queues"}, tt.args...)...)
		err = cliError(err)
		if err == nil || !strings.HasPrefix(err.Error(), "list queues: "+tt.want) || strings.Contains(err.Error(), "WithTLS") {
			t.Errorf("qbroker queues %s: got %v, want %q", strings.Join(tt.args, " "), err, tt.want)
		}
	}
	mtls.ok("", "queues", "--tls-ca", ca, "--tls-cert", filepath.Join(dir, tlsutil.ClientCertFile), "--tls-key", filepath.Join(dir, tlsutil.ClientKeyFile))
}
