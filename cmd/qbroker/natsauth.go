package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/qbroker/qbroker/internal/natsbridge"
)

// natsAuthOptions are the event bridge's NATS credential and TLS flags.
// Secrets come from files, never flags, so that they stay out of ps.
type natsAuthOptions struct {
	user         string
	passwordFile string
	tokenFile    string
	nkeySeedFile string
	credsFile    string
	tls          bool
	caFile       string
	certFile     string
	keyFile      string
}

func (o *natsAuthOptions) register(fs *flag.FlagSet, e *envDefaults) {
	fs.StringVar(&o.user, "nats-user", env("NATS_USER", ""), "NATS user, with --nats-password-file ($QBROKER_NATS_USER)")
	fs.StringVar(&o.passwordFile, "nats-password-file", env("NATS_PASSWORD_FILE", ""), "file holding the NATS user's password ($QBROKER_NATS_PASSWORD_FILE)")
	fs.StringVar(&o.tokenFile, "nats-token-file", env("NATS_TOKEN_FILE", ""), "file holding a NATS token ($QBROKER_NATS_TOKEN_FILE)")
	fs.StringVar(&o.nkeySeedFile, "nats-nkey-seed", env("NATS_NKEY_SEED", ""), "file holding a NATS nkey user seed ($QBROKER_NATS_NKEY_SEED)")
	fs.StringVar(&o.credsFile, "nats-creds", env("NATS_CREDS", ""), "NATS credentials file (user JWT and seed) ($QBROKER_NATS_CREDS)")
	fs.BoolVar(&o.tls, "nats-tls", e.bool("NATS_TLS", false), "require TLS to NATS (implied by --nats-ca and --nats-cert) ($QBROKER_NATS_TLS)")
	fs.StringVar(&o.caFile, "nats-ca", env("NATS_CA", ""), "PEM CA certificates that verify the NATS server; default the system's ($QBROKER_NATS_CA)")
	fs.StringVar(&o.certFile, "nats-cert", env("NATS_CERT", ""), "PEM client certificate for NATS, with --nats-key ($QBROKER_NATS_CERT)")
	fs.StringVar(&o.keyFile, "nats-key", env("NATS_KEY", ""), "PEM key of --nats-cert ($QBROKER_NATS_KEY)")
}

// auth reads the secret files into the bridge's Auth; the bridge checks
// the combination.
func (o *natsAuthOptions) auth() (natsbridge.Auth, error) {
	a := natsbridge.Auth{User: o.user, NKeySeedFile: o.nkeySeedFile, CredsFile: o.credsFile,
		TLS: o.tls, CAFile: o.caFile, CertFile: o.certFile, KeyFile: o.keyFile}
	var err error
	if a.Password, err = readSecret("--nats-password-file", o.passwordFile); err != nil {
		return a, err
	}
	if a.Token, err = readSecret("--nats-token-file", o.tokenFile); err != nil {
		return a, err
	}
	if a.Password != "" && a.User == "" {
		return a, fmt.Errorf("--nats-password-file needs --nats-user")
	}
	return a, nil
}

// readSecret returns the first line of file, trimmed; "" for no file.
func readSecret(flagName, file string) (string, error) {
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flagName, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if line = strings.TrimSpace(line); line == "" {
		return "", fmt.Errorf("%s: %s is empty", flagName, file)
	}
	return line, nil
}
