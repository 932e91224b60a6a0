// Package tlsutil builds the TLS configurations of the broker and its
// clients from PEM files, reloading them when they change (package
// reload), and generates a local certificate authority with server and
// client certificates for trying TLS out (Generate).
package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/qbroker/qbroker/internal/reload"
)

// ServerConfig is what a TLS server needs: its certificate and key and,
// for mutual TLS, the CA that signs client certificates.
type ServerConfig struct {
	CertFile, KeyFile string
	// ClientCAFile, when set, verifies the client certificates offered;
	// with RequireClientCert a client without one is refused.
	ClientCAFile      string
	RequireClientCert bool
	Logger            *slog.Logger
}

// Server returns a TLS configuration whose certificate and client CA are
// re-read when their files change (looked at, at most once a second, by
// the next handshake). A replaced file that does not load keeps the
// previous certificate in use, and is logged.
func Server(c ServerConfig) (*tls.Config, error) {
	if c.CertFile == "" || c.KeyFile == "" {
		return nil, errors.New("tls: a certificate and a key are required")
	}
	if c.RequireClientCert && c.ClientCAFile == "" {
		return nil, errors.New("tls: requiring client certificates needs a client CA")
	}
	cert, err := reload.New(func() (*tls.Certificate, error) { return loadPair(c.CertFile, c.KeyFile) },
		0, c.Logger, c.CertFile, c.KeyFile)
	if err != nil {
		return nil, err
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	var cas *reload.Value[*x509.CertPool]
	if c.ClientCAFile != "" {
		if cas, err = reload.New(func() (*x509.CertPool, error) { return LoadPool(c.ClientCAFile) },
			0, c.Logger, c.ClientCAFile); err != nil {
			return nil, err
		}
		base.ClientAuth = tls.VerifyClientCertIfGiven
		if c.RequireClientCert {
			base.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	// Each handshake gets the configuration with the current files.
	cfg := base.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		hc := base.Clone()
		hc.Certificates = []tls.Certificate{*cert.Get()}
		if cas != nil {
			hc.ClientCAs = cas.Get()
		}
		return hc, nil
	}
	return cfg, nil
}

// ClientConfig is what a TLS client needs: the CA that signs the server's
// certificate (empty: the system's roots), optionally a client certificate
// and key for mutual TLS, and the name to verify the server's certificate
// against (empty: the host dialled).
type ClientConfig struct {
	CAFile            string
	CertFile, KeyFile string
	ServerName        string
	Logger            *slog.Logger
}

// Client returns a TLS configuration for dialling the broker. The client
// certificate is re-read when its files change.
func Client(c ClientConfig) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pool, err := LoadPool(c.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("tls: a client certificate needs both its certificate and its key file")
	}
	if c.CertFile != "" {
		cert, err := reload.New(func() (*tls.Certificate, error) { return loadPair(c.CertFile, c.KeyFile) },
			0, c.Logger, c.CertFile, c.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return cert.Get(), nil
		}
	}
	return cfg, nil
}

func loadPair(certFile, keyFile string) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: load %s and %s: %w", certFile, keyFile, err)
	}
	return &c, nil
}

// LoadPool reads PEM certificates into a pool.
func LoadPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", file)
	}
	return pool, nil
}
