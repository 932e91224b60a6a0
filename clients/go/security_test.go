package qbroker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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

// The client dials a broker with TLS and authentication by files and a
// token; refusals match ErrUnauthenticated and ErrPermissionDenied; a
// token without TLS is refused by Dial.
func TestDialTLSAndToken(t *testing.T) {
	dir := t.TempDir()
	if err := tlsutil.Generate(dir, "reader"); err != nil {
		t.Fatal(err)
	}
	tok, line, err := broker.MintToken("admin")
	if err != nil {
		t.Fatal(err)
	}
	rules, tokens := filepath.Join(dir, "rules"), filepath.Join(dir, "tokens")
	if err := os.WriteFile(rules, []byte("admin all *\nreader view *\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokens, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
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
	s, err := brokertest.Start(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t), Auth: auth},
		brokertest.Options{ServerOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(srvTLS))}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)

	files := qbroker.TLSFiles{CAFile: filepath.Join(dir, tlsutil.CAFile)}
	dial := func(opts ...qbroker.Option) *qbroker.Client {
		c, err := qbroker.Dial(ctx, s.Addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	admin := dial(qbroker.WithTLSFiles(files), qbroker.WithToken(tok))
	if _, err := admin.CreateQueue(ctx, "jobs", qbroker.QueueOptions{}); err != nil {
		t.Fatalf("admin CreateQueue: %v", err)
	}
	files.CertFile, files.KeyFile = filepath.Join(dir, tlsutil.ClientCertFile), filepath.Join(dir, tlsutil.ClientKeyFile)
	reader := dial(qbroker.WithTLSFiles(files))
	if _, err := reader.Stats(ctx, "jobs"); err != nil {
		t.Fatalf("reader Stats: %v", err)
	}
	if _, err := reader.Publish(ctx, "jobs", []byte("x")); !errors.Is(err, qbroker.ErrPermissionDenied) {
		t.Fatalf("reader Publish: got %v, want ErrPermissionDenied", err)
	}
	anon := dial(qbroker.WithTLSFiles(qbroker.TLSFiles{CAFile: files.CAFile}))
	if _, err := anon.Stats(ctx, "jobs"); !errors.Is(err, qbroker.ErrUnauthenticated) {
		t.Fatalf("Stats without credentials: got %v, want ErrUnauthenticated", err)
	}
	if err := anon.Ping(ctx); err != nil {
		t.Fatalf("Ping without credentials: %v", err)
	}
	if _, err := qbroker.Dial(ctx, s.Addr, qbroker.WithToken(tok)); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("Dial with a token and no TLS: got %v, want ErrInvalidArgument", err)
	}
	if _, err := qbroker.Dial(ctx, s.Addr, qbroker.WithTLSFiles(qbroker.TLSFiles{CAFile: filepath.Join(dir, "missing.pem")})); !errors.Is(err, qbroker.ErrInvalidArgument) {
		t.Fatalf("Dial with a missing CA file: got %v, want ErrInvalidArgument", err)
	}
}
