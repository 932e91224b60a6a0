package broker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/qbroker/qbroker/internal/reload"
)

// AuthConfig configures authentication and authorization (NewAuth).
type AuthConfig struct {
	// RulesFile maps identities to actions on name patterns (see
	// ParseRules). Required: with authentication on, what no rule allows
	// is denied.
	RulesFile string
	// TokensFile lists the bearer tokens' identities and SHA-256 hashes
	// (see ParseTokens); empty: tokens are refused, only client
	// certificates identify callers.
	TokensFile string
	// JWT configures JSON Web Tokens as bearer tokens; off without a
	// JWKSFile. With both, a bearer token of a JWT's shape (three
	// dot-separated parts) is checked as a JWT only, any other against
	// the tokens file only.
	JWT JWTConfig
	// Logger for reloads; default discards.
	Logger *slog.Logger
}

// Auth authenticates calls, by a client certificate verified by the TLS
// handshake or a bearer token (of the tokens file, or a JWT), and
// authorizes them against rules. Its files are re-read when they change
// (at most once a second, on use); a version that does not parse is
// logged and the previous one kept. A broker re-checks its open streams
// against every new version (authstreams.go).
//
// An Auth is safe for concurrent use.
type Auth struct {
	rules  *reload.Value[*Rules]
	tokens *reload.Value[tokenSet] // nil without a tokens file
	jwt    *jwtVerifier            // nil without a JWKS file
}

// NewAuth reads the files of c.
func NewAuth(c AuthConfig) (*Auth, error) {
	if c.RulesFile == "" {
		return nil, errors.New("broker: auth: a rules file is required")
	}
	a := &Auth{}
	var err error
	a.rules, err = reload.New(func() (*Rules, error) { return readRules(c.RulesFile) }, 0, c.Logger, c.RulesFile)
	if err != nil {
		return nil, fmt.Errorf("broker: auth: %w", err)
	}
	if c.TokensFile != "" {
		a.tokens, err = reload.New(func() (tokenSet, error) { return readTokens(c.TokensFile) }, 0, c.Logger, c.TokensFile)
		if err != nil {
			return nil, fmt.Errorf("broker: auth: %w", err)
		}
	}
	if c.JWT.JWKSFile != "" {
		a.jwt, err = newJWTVerifier(c.JWT, c.Logger)
		if err != nil {
			return nil, fmt.Errorf("broker: auth: %w", err)
		}
	}
	return a, nil
}

// generation looks at the files (as a call would) and returns a number
// that changes whenever one of them was reloaded.
func (a *Auth) generation() uint64 {
	a.rules.Get()
	g := a.rules.Generation()
	if a.tokens != nil {
		a.tokens.Get()
		g += a.tokens.Generation()
	}
	if a.jwt != nil {
		a.jwt.keys.Get()
		g += a.jwt.keys.Generation()
	}
	return g
}

// Identity is an authenticated caller: the name of its token, the
// identity claim of its JWT, or its client certificate's subject common
// name (or, without one, its first URI, DNS or e-mail subject alternative
// name).
type Identity struct {
	Name string
	Via  string // "token", "jwt" or "certificate"

	until time.Time // when its credential expires (JWT, certificate); zero: never
}

type identityKey struct{}

// IdentityFrom returns the identity a call was authenticated as.
func IdentityFrom(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

var (
	errNoCredentials = status.Error(codes.Unauthenticated, "no credentials: send a client certificate or an \"authorization: Bearer <token>\" header")
	errBadToken      = status.Error(codes.Unauthenticated, "invalid bearer token")
)

// authenticate finds the caller's identity: a bearer token when the call
// has an authorization header (which must then be valid), else a verified
// client certificate.
func (a *Auth) authenticate(ctx context.Context) (Identity, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if vals := md.Get("authorization"); len(vals) > 0 {
		if len(vals) > 1 {
			return Identity{}, errBadToken
		}
		tok, ok := strings.CutPrefix(vals[0], "Bearer ")
		tok = strings.TrimSpace(tok)
		if ok && a.jwt != nil && looksLikeJWT(tok) {
			name, until, err := a.jwt.verify(tok)
			if err != nil {
				return Identity{}, status.Error(codes.Unauthenticated, "invalid JWT: "+err.Error())
			}
			return Identity{Name: name, Via: "jwt", until: until}, nil
		}
		if !ok || a.tokens == nil {
			return Identity{}, errBadToken
		}
		name, ok := a.tokens.Get().lookup(tok)
		if !ok {
			return Identity{}, errBadToken
		}
		return Identity{Name: name, Via: "token"}, nil
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			leaf := ti.State.VerifiedChains[0][0]
			if time.Now().After(leaf.NotAfter) {
				// Verified at the handshake; a stream can outlive it.
				return Identity{}, status.Errorf(codes.Unauthenticated, "client certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
			}
			if name := certName(ti); name != "" {
				return Identity{Name: name, Via: "certificate", until: leaf.NotAfter}, nil
			}
		}
	}
	return Identity{}, errNoCredentials
}

// certName names the verified client certificate's subject.
func certName(ti credentials.TLSInfo) string {
	c := ti.State.VerifiedChains[0][0]
	switch {
	case c.Subject.CommonName != "":
		return c.Subject.CommonName
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	case len(c.EmailAddresses) > 0:
		return c.EmailAddresses[0]
	}
	return ""
}

// Tokens.

// tokenPrefix starts every token MintToken makes, so a token is
// recognisable in a secret scanner.
const tokenPrefix = "qbt_"

// MintToken makes a bearer token for identity name: 32 random bytes. It
// returns the token, to hand to the client, and the line to add to the
// tokens file, which holds only the token's SHA-256.
func MintToken(name string) (token, line string, err error) {
	if err := checkIdentity(name); err != nil {
		return "", "", err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	token = tokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return token, name + " sha256:" + hashToken(token), nil
}

func hashToken(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}

// tokenSet is a parsed tokens file.
type tokenSet []tokenEntry

type tokenEntry struct {
	name string
	hash []byte // SHA-256 of the token
}

// lookup returns the identity of tok. It compares tok's hash with every
// entry in constant time, so the time taken tells nothing about which
// entry came close.
func (s tokenSet) lookup(tok string) (string, bool) {
	if tok == "" {
		return "", false
	}
	h := sha256.Sum256([]byte(tok))
	name, found := "", false
	for _, e := range s {
		if subtle.ConstantTimeCompare(h[:], e.hash) == 1 {
			name, found = e.name, true
		}
	}
	return name, found
}

func readTokens(file string) (tokenSet, error) { return readParsed(file, ParseTokens) }

// readParsed reads file and parses it with parse; errors name the file.
func readParsed[T any](file string, parse func([]byte) (T, error)) (T, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := parse(data)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s: %w", file, err)
	}
	return v, nil
}

// ParseTokens parses a tokens file: one "<identity> sha256:<64 hex
// digits>" per line (what MintToken returns); blank lines and lines
// starting with # are ignored. An identity may have several tokens (to
// rotate them).
func ParseTokens(data []byte) (tokenSet, error) {
	var s tokenSet
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want \"<identity> sha256:<hex>\"", n)
		}
		if err := checkIdentity(f[0]); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		hx, ok := strings.CutPrefix(f[1], "sha256:")
		h, err := hex.DecodeString(hx)
		if !ok || err != nil || len(h) != sha256.Size {
			return nil, fmt.Errorf("line %d: want sha256: and 64 hex digits, not the token itself", n)
		}
		s = append(s, tokenEntry{name: f[0], hash: h})
	}
	return s, sc.Err()
}

// checkIdentity accepts identity names of printable characters without
// spaces or commas.
func checkIdentity(name string) error {
	if name == "" || len(name) > 256 {
		return fmt.Errorf("identity %q: want 1 to 256 characters", name)
	}
	for _, r := range name {
		if r <= ' ' || r == ',' || r == 0x7f {
			return fmt.Errorf("identity %q: no spaces, commas or control characters", name)
		}
	}
	return nil
}
