package broker_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

const (
	testIssuer   = "https://idp.example"
	testAudience = "qbroker"
)

// signer is a key of the tests' identity provider.
type signer struct {
	kid    string
	method jwt.SigningMethod
	key    crypto.Signer
}

func newRSA(t *testing.T, kid string) signer {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return signer{kid, jwt.SigningMethodRS256, k}
}

func newEC(t *testing.T, kid string) signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signer{kid, jwt.SigningMethodES256, k}
}

func newEd(t *testing.T, kid string) signer {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signer{kid, jwt.SigningMethodEdDSA, k}
}

// claims are valid claims for sub: right issuer and audience, issued now,
// expiring in an hour.
func claims(sub string) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{"iss": testIssuer, "aud": []string{"other", testAudience}, "sub": sub,
		"iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(time.Hour).Unix()}
}

func (s signer) sign(t *testing.T, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(s.method, c)
	tok.Header["kid"] = s.kid
	out, err := tok.SignedString(s.key)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// writeJWKS writes the public keys of signers as a JWKS file.
func writeJWKS(t *testing.T, file string, signers ...signer) {
	t.Helper()
	var set jose.JSONWebKeySet
	for _, s := range signers {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: s.key.Public(), KeyID: s.kid, Algorithm: s.method.Alg(), Use: "sig"})
	}
	data, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, file, string(data))
}

const jwtRules = `admin  all  *
alice  all  alice.*
bob    all  bob.*
carol  all  carol.*
`

// newJWTBroker starts a broker accepting JWTs signed by signers and the
// tokens file's token of admin.
func newJWTBroker(t *testing.T, leeway time.Duration, signers ...signer) (*secureEnv, string) {
	t.Helper()
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	writeJWKS(t, jwks, signers...)
	e := newAuthBroker(t, jwtRules, []string{"admin"}, func(c *broker.AuthConfig) {
		c.JWT = broker.JWTConfig{JWKSFile: jwks, Issuer: testIssuer, Audience: testAudience, Leeway: leeway}
	})
	return e, jwks
}

// TestJWTAccepted: tokens signed with RS256, ES256 and EdDSA by keys of
// the JWKS file are accepted, each as the identity its sub names, to
// which the rules apply; a token of the tokens file still works beside
// them.
func TestJWTAccepted(t *testing.T) {
	rs, es, ed := newRSA(t, "rsa-1"), newEC(t, "ec-1"), newEd(t, "ed-1")
	e, _ := newJWTBroker(t, 0, rs, es, ed)
	ctx := callCtx(t)
	for _, tc := range []struct {
		s   signer
		sub string
	}{{rs, "alice"}, {es, "bob"}, {ed, "carol"}} {
		c := pb.NewQueueClient(dialTLS(t, e.tb.addr, e.roots(), nil, tc.s.sign(t, claims(tc.sub))))
		if _, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: tc.sub + ".q"}); err != nil {
			t.Fatalf("%s, %s: CreateQueue of its own queue: %v", tc.s.method.Alg(), tc.sub, err)
		}
		_, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "admin.q"})
		mustCode(t, tc.sub+": CreateQueue of another's queue", err, codes.PermissionDenied)
		if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.sub+" may not create") {
			t.Fatalf("denial %q does not name the JWT's identity %s", msg, tc.sub)
		}
	}
	if _, err := e.as(t, "admin").ListQueues(ctx, &pb.ListQueuesRequest{}); err != nil {
		t.Fatalf("the tokens file's token beside JWTs: %v", err)
	}
}

// TestJWTRefused: every token that must not pass is refused with
// Unauthenticated naming why, and none changes anything.
func TestJWTRefused(t *testing.T) {
	rs, es := newRSA(t, "rsa-1"), newEC(t, "ec-1")
	e, _ := newJWTBroker(t, time.Second, rs, es)
	ctx := callCtx(t)
	now := time.Now()
	with := func(k string, v any) jwt.MapClaims {
		c := claims("alice")
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, claims("alice")).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	// Alg confusion: HS256 with the RSA public key, as published, for secret.
	der, err := x509.MarshalPKIXPublicKey(rs.key.Public())
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, claims("alice"))
	hs.Header["kid"] = "rsa-1"
	confused, err := hs.SignedString(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	forger := newRSA(t, "rsa-1") // another key claiming rs's kid
	noKid := jwt.NewWithClaims(jwt.SigningMethodRS256, claims("alice"))
	noKidTok, err := noKid.SignedString(rs.key)
	if err != nil {
		t.Fatal(err)
	}
	valid := rs.sign(t, claims("alice"))
	parts := strings.Split(valid, ".")
	for _, tc := range []struct{ name, token, want string }{
		{"expired", rs.sign(t, with("exp", now.Add(-time.Minute).Unix())), "token is expired"},
		{"no exp", rs.sign(t, with("exp", nil)), "exp"},
		{"not yet valid", rs.sign(t, with("nbf", now.Add(time.Hour).Unix())), "not valid yet"},
		{"issued in the future", rs.sign(t, with("iat", now.Add(time.Hour).Unix())), "used before issued"},
		{"wrong iss", rs.sign(t, with("iss", "https://evil.example")), "invalid issuer"},
		{"wrong aud", rs.sign(t, with("aud", "other")), "invalid audience"},
		{"no sub", rs.sign(t, with("sub", nil)), `claim "sub"`},
		{"sub with a space", rs.sign(t, with("sub", "alice admin")), `claim "sub"`},
		{"alg none", none, "signing method none is invalid"},
		{"HS256 with the public key", confused, "signing method HS256 is invalid"},
		{"unknown kid", newRSA(t, "rsa-9").sign(t, claims("alice")), `no key with kid "rsa-9"`},
		{"kid of a key for another alg", signer{"ec-1", jwt.SigningMethodRS256, rs.key}.sign(t, claims("alice")), `key "ec-1" does not fit algorithm RS256`},
		{"no kid", noKidTok, ""},
		{"garbage", "eyJhbGciOi.garbage.!!", "token is malformed"},
		{"forged signature", forger.sign(t, claims("alice")), "signature is invalid"},
		{"payload swapped", parts[0] + "." + strings.Split(rs.sign(t, claims("admin")), ".")[1] + "." + parts[2], "signature is invalid"},
	} {
		c := pb.NewQueueClient(dialTLS(t, e.tb.addr, e.roots(), nil, tc.token))
		_, err := c.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "alice." + strings.ReplaceAll(tc.name, " ", "-")})
		if tc.name == "no kid" {
			// One key fits RS256: a token without kid is verified with it.
			if err != nil {
				t.Fatalf("no kid, one RS256 key: %v", err)
			}
			continue
		}
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.Unauthenticated || !strings.HasPrefix(msg, "invalid JWT: ") || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: got %v; want Unauthenticated \"invalid JWT: ...%s...\"", tc.name, err, tc.want)
		}
	}
	l, err := e.as(t, "admin").ListQueues(ctx, &pb.ListQueuesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.GetQueues()) != 1 || l.GetQueues()[0].GetName() != "alice.no-kid" {
		t.Fatalf("queues after the refused tokens: %v; want only alice.no-kid", l.GetQueues())
	}
}

// TestJWTKeyRotation: a key added to the JWKS file is used without a
// restart; removing a key refuses its tokens and ends the open streams of
// the identities they authenticated, with Unauthenticated naming why; a
// JWT that expires while its stream is open ends the stream.
func TestJWTKeyRotation(t *testing.T) {
	old, next := newRSA(t, "2024"), newEd(t, "2025")
	e, jwks := newJWTBroker(t, time.Millisecond, old)
	ctx := callCtx(t)
	admin := e.as(t, "admin")
	createQueue(t, admin, &pb.CreateQueueRequest{Name: "alice.jobs"})
	createQueue(t, admin, &pb.CreateQueueRequest{Name: "bob.jobs"})
	stop := publishing(t, admin, "alice.jobs")
	stopBob := publishing(t, admin, "bob.jobs")

	newTok := next.sign(t, claims("bob"))
	bob := pb.NewQueueClient(dialTLS(t, e.tb.addr, e.roots(), nil, newTok))
	_, err := bob.ListQueues(ctx, &pb.ListQueuesRequest{})
	mustCode(t, "a token of a key not yet in the set", err, codes.Unauthenticated)
	writeJWKS(t, jwks, old, next)
	zktest.WaitFor(t, 30*time.Second, "the added key to be used", func() bool {
		_, err := bob.ListQueues(ctx, &pb.ListQueuesRequest{})
		return err == nil
	})

	aliceConn := dialTLS(t, e.tb.addr, e.roots(), nil, old.sign(t, claims("alice")))
	consume := consumeStream(t, ctx, pb.NewQueueClient(aliceConn), "alice.jobs")
	bobConsume := consumeStream(t, ctx, bob, "bob.jobs")
	zktest.WaitFor(t, 30*time.Second, "deliveries", func() bool { return consume.count() > 0 && bobConsume.count() > 0 })

	writeJWKS(t, jwks, next) // the old key retired
	consume.mustEnd(t, "Consume of a token of the removed key", codes.Unauthenticated,
		`JWT for identity alice is no longer valid: invalid JWT: token is unverifiable: error while executing keyfunc: no key with kid "2024"`)
	stop()
	leftInQueue(t, ctx, admin, "alice.jobs")
	if isDone(bobConsume) {
		t.Fatalf("the stream of a token of the kept key ended: %v", bobConsume.err)
	}
	_, err = pb.NewQueueClient(aliceConn).ListQueues(ctx, &pb.ListQueuesRequest{})
	mustCode(t, "a new call with a token of the removed key", err, codes.Unauthenticated)

	// A token that expires while its stream is open ends the stream.
	c := claims("bob")
	c["exp"] = time.Now().Add(2 * time.Second).Unix()
	short := pb.NewQueueClient(dialTLS(t, e.tb.addr, e.roots(), nil, next.sign(t, c)))
	shortConsume := consumeStream(t, ctx, short, "bob.jobs")
	shortConsume.mustEnd(t, "Consume of an expiring JWT", codes.Unauthenticated, "JWT for identity bob is no longer valid: invalid JWT: token has invalid claims: token is expired")
	stopBob()
}

// consumeStream opens an at-most-once Consume stream of queue.
func consumeStream(t *testing.T, ctx context.Context, c pb.QueueClient, queue string) *watched {
	t.Helper()
	cs, err := c.Consume(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.Send(&pb.ConsumeRequest{Subscribe: &pb.Subscribe{Queue: queue,
		Mode: pb.DeliveryMode_DELIVERY_MODE_AT_MOST_ONCE, Prefetch: 10}}); err != nil {
		t.Fatal(err)
	}
	return watch(func() error { _, err := cs.Recv(); return err })
}

// TestJWTConfigRefused: a JWT configuration that would accept what it
// must not is refused at start, naming the problem.
func TestJWTConfigRefused(t *testing.T) {
	dir := t.TempDir()
	rules, jwks := filepath.Join(dir, "rules"), filepath.Join(dir, "jwks.json")
	writeFile(t, rules, jwtRules)
	writeJWKS(t, jwks, newEC(t, "ec-1"))
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keysFile := func(name string, keys ...jose.JSONWebKey) string {
		p := filepath.Join(dir, name)
		data, err := json.Marshal(jose.JSONWebKeySet{Keys: keys})
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, p, string(data))
		return p
	}
	good := broker.JWTConfig{JWKSFile: jwks, Issuer: testIssuer, Audience: testAudience}
	for _, tc := range []struct {
		name string
		mod  func(*broker.JWTConfig)
		want string
	}{
		{"no issuer", func(c *broker.JWTConfig) { c.Issuer = "" }, "issuer and an audience are required"},
		{"no audience", func(c *broker.JWTConfig) { c.Audience = "" }, "issuer and an audience are required"},
		{"alg none", func(c *broker.JWTConfig) { c.Algorithms = []string{"ES256", "none"} }, "algorithm none"},
		{"unknown alg", func(c *broker.JWTConfig) { c.Algorithms = []string{"XS256"} }, `unknown algorithm "XS256"`},
		{"leeway", func(c *broker.JWTConfig) { c.Leeway = time.Hour }, "leeway 1h0m0s out of range"},
		{"missing file", func(c *broker.JWTConfig) { c.JWKSFile = filepath.Join(dir, "none") }, "no such file"},
		{"not JSON", func(c *broker.JWTConfig) { c.JWKSFile = rules }, "not a JSON Web Key Set"},
		{"small RSA key", func(c *broker.JWTConfig) {
			c.JWKSFile = keysFile("small", jose.JSONWebKey{Key: &small.PublicKey, KeyID: "s"})
		}, "RSA key of 1024 bits"},
		{"private key", func(c *broker.JWTConfig) {
			c.JWKSFile = keysFile("private", jose.JSONWebKey{Key: priv, KeyID: "p"})
		}, "is a private key"},
		{"short secret", func(c *broker.JWTConfig) {
			c.JWKSFile = keysFile("short", jose.JSONWebKey{Key: []byte("secret"), KeyID: "h"})
		}, "oct key of 6 bytes"},
		{"duplicate kid", func(c *broker.JWTConfig) {
			c.JWKSFile = keysFile("dup", jose.JSONWebKey{Key: priv.Public(), KeyID: "k"}, jose.JSONWebKey{Key: priv.Public(), KeyID: "k"})
		}, `key id "k" appears twice`},
	} {
		c := good
		tc.mod(&c)
		_, err := broker.NewAuth(broker.AuthConfig{RulesFile: rules, JWT: c})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := broker.NewAuth(broker.AuthConfig{RulesFile: rules, JWT: good}); err != nil {
		t.Fatalf("good configuration: %v", err)
	}
}
