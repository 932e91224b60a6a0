package natsbridge

import (
	"fmt"

	"github.com/nats-io/nats.go"
)

// Auth holds the bridge's NATS credentials and TLS settings. At most one
// kind of credential is set: User and Password, Token, NKeySeedFile, or
// CredsFile. Credentials in the URL (nats://user:pass@host) work too, but
// show in the process's arguments; files do not.
type Auth struct {
	User     string
	Password string
	Token    string
	// NKeySeedFile is a file holding an nkey seed (SU...): the server
	// knows the user by its public key.
	NKeySeedFile string
	// CredsFile is a decentralized-auth credentials file (a user JWT and
	// its nkey seed), as nsc writes it.
	CredsFile string

	// TLS requires TLS. Setting CAFile or CertFile implies it.
	TLS bool
	// CAFile holds the PEM certificates that verify the server's
	// certificate; empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are the client's certificate and key, for a
	// server that verifies clients; both or neither.
	CertFile string
	KeyFile  string
}

// validate checks that at most one credential is set and that the client
// certificate comes with its key.
func (a Auth) validate() error {
	n := 0
	for _, set := range []bool{a.User != "" || a.Password != "", a.Token != "", a.NKeySeedFile != "", a.CredsFile != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return fmt.Errorf("%w: more than one NATS credential (user/password, token, nkey seed, creds file)", ErrInvalidConfig)
	case a.Password != "" && a.User == "":
		return fmt.Errorf("%w: a NATS password without a user", ErrInvalidConfig)
	case (a.CertFile == "") != (a.KeyFile == ""):
		return fmt.Errorf("%w: a NATS client certificate needs both its certificate and key files", ErrInvalidConfig)
	}
	return nil
}

// options returns the nats.go options for a.
func (a Auth) options() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case a.User != "":
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	case a.Token != "":
		opts = append(opts, nats.Token(a.Token))
	case a.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(a.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nkey seed: %v", ErrInvalidConfig, err)
		}
		opts = append(opts, o)
	case a.CredsFile != "":
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	}
	if a.TLS || a.CAFile != "" || a.CertFile != "" {
		opts = append(opts, nats.Secure())
	}
	if a.CAFile != "" {
		opts = append(opts, nats.RootCAs(a.CAFile))
	}
	if a.CertFile != "" {
		opts = append(opts, nats.ClientCert(a.CertFile, a.KeyFile))
	}
	return opts, nil
}
