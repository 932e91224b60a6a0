package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/tlsutil"
)

// securityOptions are serve's TLS, authentication and exposure flags.
type securityOptions struct {
	tlsCert, tlsKey   string
	clientCA          string
	requireClientCert bool
	rules, tokens     string
	jwt               jwtOptions
	metricsTLS        bool
	insecure          bool
}

func (s *securityOptions) define(fs *flag.FlagSet, e *envDefaults) {
	fs.StringVar(&s.tlsCert, "tls-cert", env("TLS_CERT", ""), "serve gRPC over TLS with this PEM certificate (re-read when it changes) ($QBROKER_TLS_CERT)")
	fs.StringVar(&s.tlsKey, "tls-key", env("TLS_KEY", ""), "the TLS certificate's PEM key ($QBROKER_TLS_KEY)")
	fs.StringVar(&s.clientCA, "tls-client-ca", env("TLS_CLIENT_CA", ""), "verify client certificates against these PEM CA certificates; a verified certificate's common name is the caller's identity ($QBROKER_TLS_CLIENT_CA)")
	fs.BoolVar(&s.requireClientCert, "tls-require-client-cert", e.bool("TLS_REQUIRE_CLIENT_CERT", false), "refuse connections without a client certificate signed by --tls-client-ca (mutual TLS) ($QBROKER_TLS_REQUIRE_CLIENT_CERT)")
	fs.StringVar(&s.rules, "auth-rules", env("AUTH_RULES", ""), "turn authentication on: every call needs a client certificate or a bearer token, and this rules file says what each identity may do; all else is denied ($QBROKER_AUTH_RULES)")
	fs.StringVar(&s.tokens, "auth-tokens", env("AUTH_TOKENS", ""), "bearer tokens file: '<identity> sha256:<hex>' lines, made by 'qbroker token' ($QBROKER_AUTH_TOKENS)")
	s.jwt.define(fs, e)
	fs.BoolVar(&s.metricsTLS, "metrics-tls", e.bool("METRICS_TLS", false), "serve --metrics-listen (metrics, health, pprof) over HTTPS with the gRPC certificate and client CA ($QBROKER_METRICS_TLS)")
	fs.BoolVar(&s.insecure, "insecure", e.bool("INSECURE", false), "allow listening beyond loopback without TLS and authentication, and ZooKeeper nodes open to anyone without --zk-auth-file (a warning is logged at every start) ($QBROKER_INSECURE)")
}

// validate checks the combinations of security flags.
func (s *securityOptions) validate(listen, metricsListen string) []error {
	var errs []error
	if (s.tlsCert == "") != (s.tlsKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if s.clientCA != "" && s.tlsCert == "" {
		errs = append(errs, errors.New("--tls-client-ca needs --tls-cert and --tls-key"))
	}
	if s.requireClientCert && s.clientCA == "" {
		errs = append(errs, errors.New("--tls-require-client-cert needs --tls-client-ca"))
	}
	if s.tokens != "" && s.rules == "" {
		errs = append(errs, errors.New("--auth-tokens needs --auth-rules (with authentication on, what no rule allows is denied)"))
	}
	if s.rules != "" && s.tokens == "" && s.jwt.jwks == "" && s.clientCA == "" {
		errs = append(errs, errors.New("--auth-rules needs --auth-tokens, --jwt-jwks or --tls-client-ca: otherwise no caller could authenticate"))
	}
	errs = append(errs, s.jwt.validate(s.rules)...)
	if s.rules != "" && s.tlsCert == "" {
		errs = append(errs, errors.New("--auth-rules needs --tls-cert and --tls-key: tokens and identities are worthless in the clear"))
	}
	if s.metricsTLS && s.tlsCert == "" {
		errs = append(errs, errors.New("--metrics-tls needs --tls-cert and --tls-key"))
	}
	if s.insecure {
		return errs
	}
	if !isLoopback(listen) && (s.tlsCert == "" || s.rules == "") {
		errs = append(errs, fmt.Errorf("--listen %s is not a loopback address: serving it needs --tls-cert, --tls-key and --auth-rules (or --insecure, to serve anyone who can reach it)", listen))
	}
	if metricsListen != "" && !isLoopback(metricsListen) && !s.metricsTLS {
		errs = append(errs, fmt.Errorf("--metrics-listen %s is not a loopback address: serving it needs --metrics-tls (or --insecure)", metricsListen))
	}
	return errs
}

// jwtOptions are serve's JSON Web Token flags.
type jwtOptions struct {
	jwks, issuer, audience string
	algorithms, claim      string
	leeway                 time.Duration
}

func (j *jwtOptions) define(fs *flag.FlagSet, e *envDefaults) {
	fs.StringVar(&j.jwks, "jwt-jwks", env("JWT_JWKS", ""), "accept JWT bearer tokens signed by the keys of this JWKS file (re-read when it changes); needs --auth-rules, --jwt-issuer and --jwt-audience ($QBROKER_JWT_JWKS)")
	fs.StringVar(&j.issuer, "jwt-issuer", env("JWT_ISSUER", ""), "the iss every JWT must carry ($QBROKER_JWT_ISSUER)")
	fs.StringVar(&j.audience, "jwt-audience", env("JWT_AUDIENCE", ""), "a value every JWT's aud must hold ($QBROKER_JWT_AUDIENCE)")
	fs.StringVar(&j.algorithms, "jwt-algorithms", env("JWT_ALGORITHMS", strings.Join(broker.DefaultJWTAlgorithms, ",")), "JWT signing algorithms accepted, comma-separated; never none; HS256/384/512 only when listed, with an oct key in the JWKS file ($QBROKER_JWT_ALGORITHMS)")
	fs.StringVar(&j.claim, "jwt-identity-claim", env("JWT_IDENTITY_CLAIM", "sub"), "the JWT claim naming the caller, the identity the rules name ($QBROKER_JWT_IDENTITY_CLAIM)")
	fs.DurationVar(&j.leeway, "jwt-leeway", e.dur("JWT_LEEWAY", broker.DefaultJWTLeeway), "clock skew allowed when checking a JWT's exp, nbf and iat, at most 5m ($QBROKER_JWT_LEEWAY)")
}

func (j *jwtOptions) validate(rules string) []error {
	if j.jwks == "" {
		return nil
	}
	var errs []error
	if rules == "" {
		errs = append(errs, errors.New("--jwt-jwks needs --auth-rules (with authentication on, what no rule allows is denied)"))
	}
	if j.issuer == "" || j.audience == "" {
		errs = append(errs, errors.New("--jwt-jwks needs --jwt-issuer and --jwt-audience: tokens the same provider issues for other services must not pass"))
	}
	return errs
}

// config is the broker's JWTConfig; off without --jwt-jwks.
func (j *jwtOptions) config() broker.JWTConfig {
	if j.jwks == "" {
		return broker.JWTConfig{}
	}
	var algs []string
	for _, a := range strings.Split(j.algorithms, ",") {
		if a = strings.TrimSpace(a); a != "" {
			algs = append(algs, a)
		}
	}
	return broker.JWTConfig{JWKSFile: j.jwks, Issuer: j.issuer, Audience: j.audience, Algorithms: algs,
		IdentityClaim: j.claim, Leeway: j.leeway}
}

// isLoopback reports whether a listen address host:port stays on this
// machine: a loopback IP or localhost. An empty host listens everywhere.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// serverTLS is the gRPC (and, with --metrics-tls, HTTP) server's TLS
// configuration; nil without --tls-cert.
func (s *securityOptions) serverTLS(log *slog.Logger) (*tls.Config, error) {
	if s.tlsCert == "" {
		return nil, nil
	}
	return tlsutil.Server(tlsutil.ServerConfig{CertFile: s.tlsCert, KeyFile: s.tlsKey, ClientCAFile: s.clientCA,
		RequireClientCert: s.requireClientCert, Logger: log})
}

// auth is the broker's authentication; nil without --auth-rules.
func (s *securityOptions) auth(log *slog.Logger) (*broker.Auth, error) {
	if s.rules == "" {
		return nil, nil
	}
	return broker.NewAuth(broker.AuthConfig{RulesFile: s.rules, TokensFile: s.tokens, JWT: s.jwt.config(), Logger: log})
}

// logExposure warns, at every start, about what is served unprotected.
func (s *securityOptions) logExposure(log *slog.Logger, listen, metricsListen string) {
	if s.tlsCert == "" && !isLoopback(listen) {
		log.Warn("INSECURE: gRPC is served without TLS beyond loopback: anyone who can reach it sees and can replay all traffic", "listen", listen)
	}
	if s.rules == "" && !isLoopback(listen) {
		log.Warn("INSECURE: no authentication: anyone who can reach the broker can publish, consume, purge and delete any queue", "listen", listen)
	}
	if metricsListen != "" && !isLoopback(metricsListen) && !s.metricsTLS {
		log.Warn("INSECURE: metrics (and pprof, if on) served without TLS beyond loopback", "metrics_listen", metricsListen)
	}
}

// Client side.

// clientSecurity are the TLS and token flags of the client commands.
type clientSecurity struct {
	tls                    bool
	ca, cert, key, srvName string
	tokenFile              string
}

func (c *clientSecurity) define(fs *flag.FlagSet) {
	fs.BoolVar(&c.tls, "tls", env("TLS", "") == "true", "use TLS, trusting the system's CAs (implied by --tls-ca) ($QBROKER_TLS)")
	fs.StringVar(&c.ca, "tls-ca", env("TLS_CA", ""), "use TLS, trusting these PEM CA certificates ($QBROKER_TLS_CA)")
	fs.StringVar(&c.cert, "tls-cert", env("TLS_CERT", ""), "client certificate (PEM) for mutual TLS ($QBROKER_TLS_CERT)")
	fs.StringVar(&c.key, "tls-key", env("TLS_KEY", ""), "the client certificate's key (PEM) ($QBROKER_TLS_KEY)")
	fs.StringVar(&c.srvName, "tls-server-name", env("TLS_SERVER_NAME", ""), "name the broker's certificate must carry; default the host dialled ($QBROKER_TLS_SERVER_NAME)")
	fs.StringVar(&c.tokenFile, "token-file", env("TOKEN_FILE", ""), "file holding a bearer token (or set $QBROKER_TOKEN) ($QBROKER_TOKEN_FILE)")
}

// options are the client options for the flags.
func (c *clientSecurity) options() ([]qbroker.Option, error) {
	var opts []qbroker.Option
	if c.tls || c.ca != "" || c.cert != "" {
		opts = append(opts, qbroker.WithTLSFiles(qbroker.TLSFiles{CAFile: c.ca, CertFile: c.cert, KeyFile: c.key, ServerName: c.srvName}))
	}
	tok := os.Getenv("QBROKER_TOKEN")
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, usagef("--token-file: %v", err)
		}
		tok = strings.TrimSpace(string(b))
	}
	if tok != "" {
		opts = append(opts, qbroker.WithToken(tok))
	}
	return opts, nil
}

// tlsHint says, in the client commands' flags, what to change when the
// client and the broker disagree on TLS.
func tlsHint(e *qbroker.TLSMismatchError) string {
	switch e.Kind {
	case qbroker.BrokerSpeaksTLS:
		return fmt.Sprintf("the broker at %s speaks TLS: pass --tls-ca FILE (the CA certificate that signed the broker's; with 'qbroker dev --secure-dir DIR', DIR/ca.pem) or --tls (the system's CAs)", e.Addr)
	case qbroker.BrokerWithoutTLS:
		return fmt.Sprintf("the broker at %s does not speak TLS (plaintext gRPC): drop --tls, --tls-ca, --tls-cert, --tls-key and --token-file, or check --addr", e.Addr)
	case qbroker.ClientCertRequired:
		return fmt.Sprintf("the broker at %s requires a client certificate (mutual TLS): pass --tls-cert FILE and --tls-key FILE, signed by a CA the broker trusts (its --tls-client-ca)", e.Addr)
	}
	return e.Error()
}

// The token and certs commands.

func init() {
	register(command{name: "token", usage: "mint a bearer token: prints it, and its tokens-file line", run: runToken})
	register(command{name: "certs", usage: "write a development CA, server and client certificates", run: runCerts})
}

func runToken(args []string) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(&helpWriter{out: os.Stdout, err: os.Stderr})
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: qbroker token identity

Mints a bearer token for identity (32 random bytes). Prints two lines:
the token, for the client only (--token-file or $QBROKER_TOKEN), and the
line to append to the broker's --auth-tokens file, which holds only the
token's SHA-256. The broker re-reads the file within a second.`)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		fs.Output().(*helpWriter).flush(false)
		return usagef("want one identity")
	}
	tok, line, err := broker.MintToken(fs.Arg(0))
	if err != nil {
		return usageError{err}
	}
	fmt.Println(tok)
	fmt.Println(line)
	return nil
}

func runCerts(args []string) error {
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	fs.SetOutput(&helpWriter{out: os.Stdout, err: os.Stderr})
	dir := fs.String("dir", "qbroker-certs", "directory to write into (created)")
	client := fs.String("client", "dev-client", "the client certificate's common name: its identity in the rules")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: qbroker certs [flags]

Writes a development CA (ca.pem; its key is not kept), a server certificate
for 127.0.0.1, ::1 and localhost (server.pem, server-key.pem) and a client
certificate (client.pem, client-key.pem). For trying TLS out, not for
production. Existing files are never replaced.

flags:`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := tlsutil.Generate(*dir, *client); err != nil {
		return err
	}
	abs, _ := filepath.Abs(*dir)
	fmt.Printf("wrote %s: %s %s %s %s %s\n", abs, tlsutil.CAFile, tlsutil.ServerCertFile, tlsutil.ServerKeyFile, tlsutil.ClientCertFile, tlsutil.ClientKeyFile)
	return nil
}

// devSecurity prepares dir for 'qbroker dev --secure-dir': on first use
// the development certificates (client identity dev-client), a token for
// identity admin (its token in dir/admin.token) and a rules file granting
// both everything; then it points o at them and prints how to connect.
func devSecurity(dir string, o *serveOptions, out io.Writer) error {
	rules := filepath.Join(dir, "rules")
	tokens := filepath.Join(dir, "tokens")
	tokenFile := filepath.Join(dir, "admin.token")
	if _, err := os.Stat(rules); errors.Is(err, os.ErrNotExist) {
		if err := tlsutil.Generate(dir, "dev-client"); err != nil {
			return err
		}
		tok, line, err := broker.MintToken("admin")
		if err != nil {
			return err
		}
		if err := tlsutil.WriteFileAtomic(tokenFile, []byte(tok+"\n"), 0o600); err != nil {
			return err
		}
		if err := tlsutil.WriteFileAtomic(tokens, []byte(line+"\n"), 0o600); err != nil {
			return err
		}
		if err := tlsutil.WriteFileAtomic(rules, []byte("# identity  actions  patterns\nadmin       all      *\ndev-client  all      *\n"), 0o644); err != nil {
			return err
		}
	}
	s := &o.security
	s.tlsCert, s.tlsKey = filepath.Join(dir, tlsutil.ServerCertFile), filepath.Join(dir, tlsutil.ServerKeyFile)
	s.clientCA, s.rules, s.tokens = filepath.Join(dir, tlsutil.CAFile), rules, tokens
	addr := dialAddr(o.listen)
	fmt.Fprintf(out, "TLS and authentication on (files in %s). Clients:\n  qbroker queues --addr %s --tls-ca %s --token-file %s\n  qbroker queues --addr %s --tls-ca %s --tls-cert %s --tls-key %s\n",
		dir, addr, s.clientCA, tokenFile, addr, s.clientCA, filepath.Join(dir, tlsutil.ClientCertFile), filepath.Join(dir, tlsutil.ClientKeyFile))
	return nil
}

// dialAddr is the address a client on this machine dials to reach a
// broker listening on listen: an unspecified host (all interfaces) is
// reached on 127.0.0.1, a name the development certificate carries.
func dialAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return listen
}
