package broker

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"

	"github.com/qbroker/qbroker/internal/reload"
)

// JWTConfig configures JSON Web Tokens as bearer tokens (AuthConfig.JWT).
// A JWT is accepted when it is signed by a key of the JWKS file with an
// allowed algorithm, its iss is Issuer, its aud holds Audience, it has an
// exp that has not passed and no nbf (or iat) in the future; its identity
// is the string in IdentityClaim. Rules apply to that identity as to the
// tokens file's identities: both name callers in one namespace, so the
// identity provider must be trusted with every name the rules grant.
type JWTConfig struct {
	// JWKSFile is a JSON Web Key Set ({"keys": [...]}, what an identity
	// provider publishes at its jwks_uri) of the keys that sign accepted
	// tokens; re-read when it changes, as the tokens file is. Keys with
	// "use" other than "sig" are ignored. Empty: JWTs are not accepted.
	JWKSFile string
	// Issuer every token's iss must equal. Required.
	Issuer string
	// Audience every token's aud must hold. Required.
	Audience string
	// Algorithms accepted (the tokens' alg); default
	// DefaultJWTAlgorithms. "none" is refused; HS256, HS384 and HS512 only
	// when listed here, verified with the JWKS file's "oct" keys.
	Algorithms []string
	// IdentityClaim names the claim holding the caller's identity (a
	// string of 1 to 256 characters without spaces or commas); default
	// "sub".
	IdentityClaim string
	// Leeway allowed for clock skew when checking exp, nbf and iat;
	// default DefaultJWTLeeway, at most MaxJWTLeeway.
	Leeway time.Duration
}

// Defaults and bounds of JWTConfig.
const (
	DefaultJWTLeeway = 10 * time.Second
	MaxJWTLeeway     = 5 * time.Minute
)

// DefaultJWTAlgorithms are the algorithms accepted unless
// JWTConfig.Algorithms says otherwise.
var DefaultJWTAlgorithms = []string{"RS256", "ES256", "EdDSA"}

// jwtAlgorithms are the algorithms JWTConfig.Algorithms may list.
var jwtAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
	"ES256", "ES384", "ES512", "EdDSA", "HS256", "HS384", "HS512"}

// minHMACKey is the shortest "oct" key accepted: a shorter one would be
// guessable offline from any token it signed.
const minHMACKey = 32

// jwtVerifier checks JWTs against the keys of a JWKS file. It
// remembers the tokens it accepted (a client sends the same JWT with
// every call; a signature check costs 50-150 µs of CPU) until they expire
// or the key set changes.
type jwtVerifier struct {
	keys   *reload.Value[*jwkSet]
	parser *jwt.Parser
	claim  string
	leeway time.Duration

	mu       sync.Mutex
	cacheGen uint64 // the key set's generation the cache holds tokens of
	cache    map[[sha256.Size]byte]jwtAccepted
}

// jwtAccepted is a token verified: its identity, valid until.
type jwtAccepted struct {
	name  string
	until time.Time
}

// maxJWTCache bounds the tokens remembered; past it the cache starts
// anew.
const maxJWTCache = 4096

func newJWTVerifier(c JWTConfig, log *slog.Logger) (*jwtVerifier, error) {
	if c.Issuer == "" || c.Audience == "" {
		return nil, errors.New("jwt: an issuer and an audience are required (tokens of the same provider meant for other services must not pass)")
	}
	algs := c.Algorithms
	if len(algs) == 0 {
		algs = DefaultJWTAlgorithms
	}
	for _, a := range algs {
		if strings.EqualFold(a, "none") {
			return nil, errors.New("jwt: algorithm none: unsigned tokens are never accepted")
		}
		if !slices.Contains(jwtAlgorithms, a) {
			return nil, fmt.Errorf("jwt: unknown algorithm %q (want one of %s)", a, strings.Join(jwtAlgorithms, ", "))
		}
	}
	if c.IdentityClaim == "" {
		c.IdentityClaim = "sub"
	}
	if c.Leeway == 0 {
		c.Leeway = DefaultJWTLeeway
	}
	if c.Leeway < 0 || c.Leeway > MaxJWTLeeway {
		return nil, fmt.Errorf("jwt: leeway %v out of range [0, %v]", c.Leeway, MaxJWTLeeway)
	}
	keys, err := reload.New(func() (*jwkSet, error) { return readParsed(c.JWKSFile, parseJWKS) }, 0, log, c.JWKSFile)
	if err != nil {
		return nil, fmt.Errorf("jwt: %w", err)
	}
	return &jwtVerifier{
		keys: keys,
		parser: jwt.NewParser(jwt.WithValidMethods(slices.Clone(algs)), jwt.WithIssuer(c.Issuer),
			jwt.WithAudience(c.Audience), jwt.WithLeeway(c.Leeway), jwt.WithExpirationRequired(), jwt.WithIssuedAt()),
		claim:  c.IdentityClaim,
		leeway: c.Leeway,
	}, nil
}

// looksLikeJWT reports whether a bearer token has a JWT's shape: three
// dot-separated parts. Tokens MintToken makes have no dot.
func looksLikeJWT(tok string) bool { return strings.Count(tok, ".") == 2 }

// verify checks tok and returns its identity and when it stops being
// valid (exp plus the leeway).
func (v *jwtVerifier) verify(tok string) (string, time.Time, error) {
	keys, gen := v.keys.GetVersion()
	h := sha256.Sum256([]byte(tok))
	if a, ok := v.cached(h, gen); ok {
		return a.name, a.until, nil
	}
	name, until, err := v.check(keys, tok)
	if err == nil {
		v.remember(h, gen, jwtAccepted{name, until})
	}
	return name, until, err
}

func (v *jwtVerifier) cached(h [sha256.Size]byte, gen uint64) (jwtAccepted, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	a, ok := v.cache[h]
	if !ok || v.cacheGen != gen || !time.Now().Before(a.until) {
		return jwtAccepted{}, false
	}
	return a, true
}

func (v *jwtVerifier) remember(h [sha256.Size]byte, gen uint64, a jwtAccepted) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cacheGen != gen || len(v.cache) >= maxJWTCache {
		if gen < v.cacheGen {
			return // verified with keys older than the cache's
		}
		v.cache, v.cacheGen = map[[sha256.Size]byte]jwtAccepted{}, gen
	}
	v.cache[h] = a
}

// check verifies tok with keys.
func (v *jwtVerifier) check(keys *jwkSet, tok string) (string, time.Time, error) {
	claims := jwt.MapClaims{}
	if _, err := v.parser.ParseWithClaims(tok, claims, keys.keyFor); err != nil {
		return "", time.Time{}, err
	}
	name, ok := claims[v.claim].(string)
	if !ok {
		return "", time.Time{}, fmt.Errorf("no string claim %q to name the caller", v.claim)
	}
	if err := checkIdentity(name); err != nil {
		return "", time.Time{}, fmt.Errorf("claim %q: %w", v.claim, err)
	}
	exp, err := claims.GetExpirationTime()
	if err != nil || exp == nil {
		return "", time.Time{}, errors.New("no exp") // the parser requires it
	}
	return name, exp.Add(v.leeway), nil
}

// jwkSet is a parsed JWKS file: the signing keys, public keys or (for the
// HS algorithms) shared secrets.
type jwkSet struct {
	keys []jwk
}

type jwk struct {
	kid string
	alg string // the algorithm the key is for; empty: any its type fits
	key any    // *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey or []byte
}

// parseJWKS parses a JSON Web Key Set. It refuses a set that does not
// parse, a key that is not valid, two keys with one key id, an RSA key of
// fewer than 2048 bits, an "oct" key of fewer than 32 bytes and private
// asymmetric keys (the broker needs only the public half: a file holding
// the private half is a mistake to report, not to use). Keys whose "use"
// is not "sig" are left out.
func parseJWKS(data []byte) (*jwkSet, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("not a JSON Web Key Set: %w", err)
	}
	s := &jwkSet{}
	seen := map[string]bool{}
	for i, k := range set.Keys {
		name := k.KeyID
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
		}
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		if _, secret := k.Key.([]byte); !secret && !k.Valid() { // Valid knows no secrets
			return nil, fmt.Errorf("key %s is not valid", name)
		}
		if seen[k.KeyID] {
			return nil, fmt.Errorf("key id %q appears twice", k.KeyID)
		}
		seen[k.KeyID] = true
		switch key := k.Key.(type) {
		case *rsa.PublicKey:
			if key.N.BitLen() < 2048 {
				return nil, fmt.Errorf("key %s: RSA key of %d bits: want at least 2048", name, key.N.BitLen())
			}
		case *ecdsa.PublicKey, ed25519.PublicKey:
		case []byte:
			if len(key) < minHMACKey {
				return nil, fmt.Errorf("key %s: oct key of %d bytes: want at least %d", name, len(key), minHMACKey)
			}
		case *rsa.PrivateKey, *ecdsa.PrivateKey, ed25519.PrivateKey:
			return nil, fmt.Errorf("key %s is a private key: the JWKS file must hold public keys only", name)
		default:
			return nil, fmt.Errorf("key %s: unsupported key type %T", name, k.Key)
		}
		s.keys = append(s.keys, jwk{kid: k.KeyID, alg: k.Algorithm, key: k.Key})
	}
	return s, nil
}

// keyFor is the parser's key function: the key named by the token's kid
// (or, without a kid, the set's only key that fits its alg), provided its
// type fits the alg, so that a public key can never serve as an HMAC
// secret.
func (s *jwkSet) keyFor(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	kid, hasKid := t.Header["kid"].(string)
	if _, present := t.Header["kid"]; present && !hasKid {
		return nil, errors.New("kid is not a string")
	}
	var fit []jwk
	for _, k := range s.keys {
		if hasKid && k.kid != kid {
			continue
		}
		if hasKid && !keyFits(k, alg) {
			return nil, fmt.Errorf("key %q does not fit algorithm %s", kid, alg)
		}
		if keyFits(k, alg) {
			fit = append(fit, k)
		}
	}
	switch {
	case len(fit) == 1:
		return fit[0].key, nil
	case hasKid:
		return nil, fmt.Errorf("no key with kid %q in the key set", kid)
	case len(fit) == 0:
		return nil, fmt.Errorf("no kid, and no key in the key set for %s", alg)
	default:
		return nil, fmt.Errorf("no kid, and %d keys in the key set for %s", len(fit), alg)
	}
}

// keyFits reports whether k can verify signatures of alg.
func keyFits(k jwk, alg string) bool {
	if k.alg != "" && k.alg != alg {
		return false
	}
	switch key := k.key.(type) {
	case *rsa.PublicKey:
		return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")
	case *ecdsa.PublicKey:
		want := map[string]elliptic.Curve{"ES256": elliptic.P256(), "ES384": elliptic.P384(), "ES512": elliptic.P521()}[alg]
		return want != nil && key.Curve == want
	case ed25519.PublicKey:
		return alg == "EdDSA"
	case []byte:
		return strings.HasPrefix(alg, "HS")
	}
	return false
}
