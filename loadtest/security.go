package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/qbroker/qbroker/broker"
	qbroker "github.com/qbroker/qbroker/clients/go"
	"github.com/qbroker/qbroker/internal/tlsutil"
)

// Security is how the load test reaches brokers that serve TLS and
// require credentials (flags --tls-ca, --tls-cert, --tls-key,
// --tls-server-name, --token-file), or whether spawned brokers serve TLS
// with authentication on (--spawn-secure).
type Security struct {
	TLS         qbroker.TLSFiles `json:"-"`
	TokenFile   string           `json:"-"`
	SpawnSecure bool             `json:"spawn_secure,omitempty"`
}

func (s *Security) define(fs *flag.FlagSet) {
	fs.StringVar(&s.TLS.CAFile, "tls-ca", "", "dial the brokers over TLS, trusting these PEM CA certificates")
	fs.StringVar(&s.TLS.CertFile, "tls-cert", "", "client certificate (PEM) for brokers that require one")
	fs.StringVar(&s.TLS.KeyFile, "tls-key", "", "the client certificate's key (PEM)")
	fs.StringVar(&s.TLS.ServerName, "tls-server-name", "", "name the brokers' certificates must carry (default: the host dialled)")
	fs.StringVar(&s.TokenFile, "token-file", "", "file holding a bearer token sent with every call (needs --tls-ca)")
	fs.BoolVar(&s.SpawnSecure, "spawn-secure", false, "spawned brokers serve TLS (with a generated CA) with authentication on; the load test's clients use a token allowed everything")
}

func (s *Security) validate(spawn int) error {
	switch {
	case s.SpawnSecure && spawn == 0:
		return errors.New("--spawn-secure needs --spawn-brokers")
	case s.SpawnSecure && (s.TLS != qbroker.TLSFiles{} || s.TokenFile != ""):
		return errors.New("--spawn-secure makes its own certificates and token: no --tls-* or --token-file")
	case s.TokenFile != "" && s.TLS.CAFile == "":
		return errors.New("--token-file needs --tls-ca: a token is not sent in the clear")
	}
	return nil
}

// options are the client options for brokers reached as s says.
func (s *Security) options() ([]qbroker.Option, error) {
	var opts []qbroker.Option
	if s.TLS != (qbroker.TLSFiles{}) {
		opts = append(opts, qbroker.WithTLSFiles(s.TLS))
	}
	if s.TokenFile != "" {
		b, err := os.ReadFile(s.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		opts = append(opts, qbroker.WithToken(strings.TrimSpace(string(b))))
	}
	return opts, nil
}

// secureFiles writes, into dir, what --spawn-secure brokers serve with: a
// CA and certificates, a tokens file with one token for identity
// loadtest, and rules allowing it everything. It returns the brokers'
// extra serve flags and the security the clients then use.
func secureFiles(dir string) ([]string, Security, error) {
	if err := tlsutil.Generate(dir, "loadtest-client"); err != nil {
		return nil, Security{}, err
	}
	tok, line, err := broker.MintToken("loadtest")
	if err != nil {
		return nil, Security{}, err
	}
	files := map[string]string{"tokens": line + "\n", "rules": "loadtest all *\n", "loadtest.token": tok + "\n"}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			return nil, Security{}, err
		}
	}
	flags := []string{
		"--tls-cert", filepath.Join(dir, tlsutil.ServerCertFile), "--tls-key", filepath.Join(dir, tlsutil.ServerKeyFile),
		"--tls-client-ca", filepath.Join(dir, tlsutil.CAFile),
		"--auth-rules", filepath.Join(dir, "rules"), "--auth-tokens", filepath.Join(dir, "tokens"),
	}
	return flags, Security{TLS: qbroker.TLSFiles{CAFile: filepath.Join(dir, tlsutil.CAFile)}, TokenFile: filepath.Join(dir, "loadtest.token")}, nil
}

// metricsToken is the bearer token the brokers' /metrics is scraped with:
// the clients' token (--token-file, or the one --spawn-secure made); ""
// without one or when its file cannot be read (the scrape then reports
// the refusal).
func metricsToken(cfg *Config, topo *Topology) string {
	sec := cfg.Security
	if topo.Security != nil {
		sec = *topo.Security
	}
	if sec.TokenFile == "" {
		return ""
	}
	b, err := os.ReadFile(sec.TokenFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
