package broker

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
)

// TestJWTAlgConfusion: with HS256 allowed (and an "oct" key for it), a
// token signed with HS256 using an RSA key's public half as the secret is
// still refused: a key is used only for the algorithms its type fits.
// The oct key itself verifies HS256 tokens.
func TestJWTAlgConfusion(t *testing.T) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	data, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: &rk.PublicKey, KeyID: "rsa"}, {Key: secret, KeyID: "hmac"}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := newJWTVerifier(JWTConfig{JWKSFile: file, Issuer: "i", Audience: "a", Algorithms: []string{"RS256", "HS256"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(kid string, key any) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"iss": "i", "aud": "a", "sub": "alice",
			"exp": time.Now().Add(time.Hour).Unix()})
		tok.Header["kid"] = kid
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	der, err := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.verify(sign("rsa", der)); err == nil || !strings.Contains(err.Error(), `key "rsa" does not fit algorithm HS256`) {
		t.Fatalf("HS256 signed with the RSA public key: got %v, want refused", err)
	}
	name, _, err := v.verify(sign("hmac", secret))
	if err != nil || name != "alice" {
		t.Fatalf("HS256 with the oct key: got %q, %v; want alice", name, err)
	}
}
