package qbroker_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/brokertest"
	"github.com/qbroker/qbroker/internal/tlsutil"
	"github.com/qbroker/qbroker/internal/zktest"
)

// A client whose TLS does not match the broker's gets an error saying
// what to change (matching ErrUnavailable still), not an opaque transport
// error: no TLS against a TLS broker, TLS against a plaintext broker, no
// client certificate against a broker that requires one. A client that
// matches works.
func TestTLSMismatchHints(t *testing.T) {
	dir := t.TempDir()
	if err := tlsutil.Generate(dir, "app-1"); err != nil {
		t.Fatal(err)
	}
	srvTLS, err := tlsutil.Server(tlsutil.ServerConfig{CertFile: filepath.Join(dir, tlsutil.ServerCertFile),
		KeyFile: filepath.Join(dir, tlsutil.ServerKeyFile), ClientCAFile: filepath.Join(dir, tlsutil.CAFile), RequireClientCert: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mtls, err := brokertest.Start(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t)},
		brokertest.Options{ServerOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(srvTLS))}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mtls.Stop)
	plain, err := brokertest.Start(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t)}, brokertest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.Stop)

	ca := qbroker.TLSFiles{CAFile: filepath.Join(dir, tlsutil.CAFile)}
	withCert := ca
	withCert.CertFile, withCert.KeyFile = filepath.Join(dir, tlsutil.ClientCertFile), filepath.Join(dir, tlsutil.ClientKeyFile)
	for _, tt := range []struct {
		name string
		addr string
		opts []qbroker.Option
		want qbroker.TLSMismatch // 0: the call succeeds
		says string
	}{
		{"no TLS to a TLS broker", mtls.Addr, nil, qbroker.BrokerSpeaksTLS, "the broker at " + mtls.Addr + " speaks TLS: dial it with WithTLSFiles"},
		{"TLS to a plaintext broker", plain.Addr, []qbroker.Option{qbroker.WithTLSFiles(ca)}, qbroker.BrokerWithoutTLS,
			"the broker at " + plain.Addr + " does not speak TLS (plaintext gRPC)"},
		{"no client certificate to mutual TLS", mtls.Addr, []qbroker.Option{qbroker.WithTLSFiles(ca)}, qbroker.ClientCertRequired,
			"the broker at " + mtls.Addr + " requires a client certificate (mutual TLS)"},
		{"matching TLS", mtls.Addr, []qbroker.Option{qbroker.WithTLSFiles(withCert)}, 0, ""},
		{"matching plaintext", plain.Addr, nil, 0, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, tt.addr, tt.opts...)
			_, err := c.ListQueues(ctx, "")
			var tm *qbroker.TLSMismatchError
			switch {
			case tt.want == 0:
				if err != nil {
					t.Fatalf("ListQueues: %v", err)
				}
			case !errors.As(err, &tm) || tm.Kind != tt.want || tm.Addr != tt.addr:
				t.Fatalf("ListQueues: got %v, want a TLSMismatchError of kind %d for %s", err, tt.want, tt.addr)
			case !errors.Is(err, qbroker.ErrUnavailable) || !strings.Contains(err.Error(), tt.says):
				t.Fatalf("ListQueues: got %v, want ErrUnavailable saying %q", err, tt.says)
			}
		})
	}
}
