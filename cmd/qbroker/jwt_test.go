package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/qbroker/qbroker/internal/tlsutil"
	"github.com/qbroker/qbroker/internal/zktest"
)

// qbroker serve with --jwt-*: the client commands send a JWT read from
// --token-file as they send any token; the identity is its sub, and an
// expired JWT is refused naming why.
func TestServeJWT(t *testing.T) {
	dir := t.TempDir()
	if err := tlsutil.Generate(dir, "dev-client"); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
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
	jwks, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: key.Public(), KeyID: "k1", Use: "sig"}}})
	if err != nil {
		t.Fatal(err)
	}
	sign := func(exp time.Time) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": "https://idp.example", "aud": "qbroker",
			"preferred_username": "alice", "sub": "0b1c2d", "exp": exp.Unix()})
		tok.Header["kid"] = "k1"
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	good := write("alice.jwt", sign(time.Now().Add(time.Hour))+"\n")
	expired := write("old.jwt", sign(time.Now().Add(-time.Hour))+"\n")
	ca := filepath.Join(dir, tlsutil.CAFile)

	addr := freeAddr(t)
	startServe(t, "--zk", zktest.Addr(t), "--root", zktest.Root(t), "--listen", addr, "--log-level", "error", "--insecure",
		"--tls-cert", filepath.Join(dir, tlsutil.ServerCertFile), "--tls-key", filepath.Join(dir, tlsutil.ServerKeyFile),
		"--auth-rules", write("rules", "alice all alice.*\n"), "--jwt-jwks", write("jwks.json", string(jwks)),
		"--jwt-issuer", "https://idp.example", "--jwt-audience", "qbroker", "--jwt-identity-claim", "preferred_username")

	c := cli{t: t, addr: addr}
	alice := []string{"--tls-ca", ca, "--token-file", good}
	zktest.WaitFor(t, 30*time.Second, "the broker to serve", func() bool {
		_, _, err := c.run("", append([]string{"queues"}, alice...)...)
		return err == nil
	})
	c.ok("", append([]string{"create", "alice.jobs"}, alice...)...)
	c.ok("", append([]string{"publish", "alice.jobs", "hello"}, alice...)...)
	if got := payloads(t, c.ok("", append([]string{"consume", "-n", "1", "alice.jobs"}, alice...)...), "1"); len(got) != 1 || got[0] != "hello" {
		t.Fatalf("consumed %q, want hello", got)
	}
	refused := func(want string, args ...string) {
		t.Helper()
		_, _, err := c.run("", args...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("qbroker %s: got %v, want %q", strings.Join(args, " "), err, want)
		}
	}
	refused(`alice may not create queue "bob.jobs" (PermissionDenied)`, append([]string{"create", "bob.jobs"}, alice...)...)
	refused("invalid JWT: token has invalid claims: token is expired (Unauthenticated)", "queues", "--tls-ca", ca, "--token-file", expired)
}
