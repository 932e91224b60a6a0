package qbroker

import (
	"context"
	"crypto/tls"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/qbroker/qbroker/internal/tlsutil"
)

// WithTLS dials the brokers over TLS with cfg (its RootCAs verify the
// brokers' certificates; Certificates or GetClientCertificate present a
// client certificate for mutual TLS). By default the client dials without
// TLS.
func WithTLS(cfg *tls.Config) Option {
	return func(o *options) { o.tls = cfg.Clone() }
}

// TLSFiles names PEM files for WithTLSFiles.
type TLSFiles struct {
	// CAFile holds the CA certificates that sign the brokers'
	// certificates; empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate and its key, for
	// brokers that require one (mutual TLS); re-read when they change.
	CertFile, KeyFile string
	// ServerName is the name the brokers' certificate must carry; empty:
	// the host of the address dialled.
	ServerName string
}

// WithTLSFiles dials the brokers over TLS configured from files. A file
// that cannot be read fails Dial with ErrInvalidArgument.
func WithTLSFiles(f TLSFiles) Option {
	return func(o *options) {
		cfg, err := tlsutil.Client(tlsutil.ClientConfig{CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile, ServerName: f.ServerName})
		if err != nil {
			o.optErr = errors.Join(o.optErr, err)
			return
		}
		o.tls = cfg
	}
}

// WithToken sends token as a bearer token ("authorization: Bearer
// <token>") with every call: a token of the brokers' tokens file, or a
// JWT. It needs TLS (WithTLS or WithTLSFiles): a token sent in the clear
// could be replayed by anyone who saw it.
func WithToken(token string) Option {
	return func(o *options) { o.token, o.tokenSource = token, nil }
}

// WithTokenSource is WithToken with a token that changes, such as a JWT
// of an identity provider: source is called for each call and each
// stream as it opens (it should return a cached token, and a fresh one
// before that expires). An error fails the call with ErrUnauthenticated.
// A stream keeps the token it opened with, and the broker ends it
// (ErrUnauthenticated) when that token expires or is revoked: open it
// again to go on with the current token. Needs TLS, as WithToken does.
func WithTokenSource(source func(ctx context.Context) (string, error)) Option {
	return func(o *options) { o.token, o.tokenSource = "", source }
}

// bearer is a token source as gRPC per-call credentials.
type bearer func(ctx context.Context) (string, error)

func (b bearer) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	tok, err := b(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "token source: %v", err)
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// securityOptions are the dial options for o's TLS and token.
func (o *options) securityOptions() ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	if o.tls != nil {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(o.tls)))
	}
	src := o.tokenSource
	if o.token != "" {
		tok := o.token
		src = func(context.Context) (string, error) { return tok, nil }
	}
	if src != nil {
		if o.tls == nil {
			return nil, errors.New("a bearer token needs TLS (WithTLS or WithTLSFiles)")
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(src)))
	}
	return opts, nil
}
