package qbroker_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
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

// WithTokenSource sends the source's current token: a JWT refreshed by
// the application. A Consumer whose JWT expires is ended by the broker
// with ErrUnauthenticated; consuming again takes the fresh token, and
// calls go on meanwhile. A source that fails fails the call with
// ErrUnauthenticated.
func TestTokenSourceJWT(t *testing.T) {
	dir := t.TempDir()
	if err := tlsutil.Generate(dir, "reader"); err != nil {
		t.Fatal(err)
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: key.Public(), KeyID: "k"}}})
	if err != nil {
		t.Fatal(err)
	}
	rules, keys := filepath.Join(dir, "rules"), filepath.Join(dir, "jwks.json")
	for f, data := range map[string][]byte{rules: []byte("app all *\n"), keys: jwks} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	auth, err := broker.NewAuth(broker.AuthConfig{RulesFile: rules, JWT: broker.JWTConfig{JWKSFile: keys,
		Issuer: "idp", Audience: "qbroker", Leeway: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, err := tlsutil.Server(tlsutil.ServerConfig{CertFile: filepath.Join(dir, tlsutil.ServerCertFile),
		KeyFile: filepath.Join(dir, tlsutil.ServerKeyFile)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := brokertest.Start(ctx, broker.Config{ZooKeeper: []string{zktest.Addr(t)}, Root: zktest.Root(t), Auth: auth},
		brokertest.Options{ServerOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(srvTLS))}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)

	sign := func(exp time.Time) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"iss": "idp", "aud": "qbroker", "sub": "app", "exp": exp.Unix()})
		tok.Header["kid"] = "k"
		out, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	var current atomic.Pointer[string]
	set := func(tok string) { current.Store(&tok) }
	set(sign(time.Now().Add(time.Hour)))
	source := func(context.Context) (string, error) {
		tok := *current.Load()
		if tok == "" {
			return "", errors.New("no token yet")
		}
		return tok, nil
	}
	c, err := qbroker.Dial(ctx, s.Addr, qbroker.WithTLSFiles(qbroker.TLSFiles{CAFile: filepath.Join(dir, tlsutil.CAFile)}),
		qbroker.WithTokenSource(source))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.CreateQueue(ctx, "jobs", qbroker.QueueOptions{}); err != nil {
		t.Fatalf("CreateQueue: %v", err)
	}
	// A token that expires in 3s (a slow machine may take longer to
	// subscribe: then try again).
	var k *qbroker.Consumer
	for k == nil {
		set(sign(time.Now().Add(3 * time.Second)))
		k, err = c.Consume(ctx, "jobs", qbroker.ConsumeOptions{})
		if err != nil && !errors.Is(err, qbroker.ErrUnauthenticated) {
			t.Fatal(err)
		}
	}
	select {
	case <-k.Done():
	case <-ctx.Done():
		t.Fatal("the consumer of an expiring JWT did not end")
	}
	if err := k.Err(); !errors.Is(err, qbroker.ErrUnauthenticated) {
		t.Fatalf("consumer of an expired JWT ended with %v, want ErrUnauthenticated", err)
	}
	set(sign(time.Now().Add(time.Hour)))
	if _, err := c.Publish(ctx, "jobs", []byte("fresh")); err != nil {
		t.Fatalf("Publish with the fresh token: %v", err)
	}
	k, err = c.Consume(ctx, "jobs", qbroker.ConsumeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	m, err := k.Next(ctx)
	if err != nil || string(m.Payload) != "fresh" {
		t.Fatalf("Next with the fresh token: got %v, %v", m, err)
	}
	set("")
	if _, err := c.Stats(ctx, "jobs"); !errors.Is(err, qbroker.ErrUnauthenticated) {
		t.Fatalf("Stats with a failing token source: got %v, want ErrUnauthenticated", err)
	}
}
