package qbroker

import (
	"context"
	"crypto/tls"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

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
// <token>") with every call. It needs TLS (WithTLS or WithTLSFiles): a
// token sent in the clear could be replayed by anyone who saw it.
func WithToken(token string) Option {
	return func(o *options) { o.token = token }
}

// bearer is a token as gRPC per-call credentials.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// securityOptions are the dial options for o's TLS and token.
func (o *options) securityOptions() ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	if o.tls != nil {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(o.tls)))
	}
	if o.token != "" {
		if o.tls == nil {
			return nil, errors.New("a bearer token needs TLS (WithTLS or WithTLSFiles)")
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(o.token)))
	}
	return opts, nil
}
