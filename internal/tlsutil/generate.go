package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority that issues certificates (ECDSA P-256).
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte // the certificate
}

// Cert is an issued certificate and its key, PEM-encoded.
type Cert struct {
	CertPEM, KeyPEM []byte
}

// NewCA makes a self-signed CA named name, valid for validity from now.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Leaf describes a certificate to issue.
type Leaf struct {
	CommonName string
	// Hosts are DNS names and IP addresses (subject alternative names).
	Hosts []string
	// Server and Client select the extended key usages.
	Server, Client bool
	// NotBefore and NotAfter default to a minute ago and a year from now.
	NotBefore, NotAfter time.Time
}

// Issue signs a certificate for l.
func (ca *CA) Issue(l Leaf) (Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Cert{}, err
	}
	if l.NotBefore.IsZero() {
		l.NotBefore = time.Now().Add(-time.Minute)
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = time.Now().Add(365 * 24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.CommonName},
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, h := range l.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Cert{}, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Cert{}, err
	}
	return Cert{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	}, nil
}

// Write writes the certificate and key to certFile and keyFile (the key
// readable by the owner only), each replaced atomically (a rename), so a
// reloading reader never sees half a file.
func (c Cert) Write(certFile, keyFile string) error {
	if err := WriteFileAtomic(certFile, c.CertPEM, 0o644); err != nil {
		return err
	}
	return WriteFileAtomic(keyFile, c.KeyPEM, 0o600)
}

// WriteFileAtomic writes data to a temporary file beside path, then
// renames it over path.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), perm)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n
}

// Dev file names written by Generate, in its directory.
const (
	CAFile         = "ca.pem"
	ServerCertFile = "server.pem"
	ServerKeyFile  = "server-key.pem"
	ClientCertFile = "client.pem"
	ClientKeyFile  = "client-key.pem"
)

// Generate writes a development CA (ca.pem; its key is not kept), a
// server certificate for 127.0.0.1, ::1 and localhost (server.pem,
// server-key.pem) and a client certificate with common name client
// (client.pem, client-key.pem) into dir, creating it. Existing files are
// kept: Generate fails rather than replace them.
func Generate(dir, client string) error {
	if client == "" {
		return errors.New("tls: generate: empty client name")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range []string{CAFile, ServerCertFile, ServerKeyFile, ClientCertFile, ClientKeyFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("tls: generate: %s exists; remove it or choose another directory", filepath.Join(dir, f))
		}
	}
	ca, err := NewCA("qbroker development CA", 2*365*24*time.Hour)
	if err != nil {
		return err
	}
	srv, err := ca.Issue(Leaf{CommonName: "qbroker", Hosts: []string{"127.0.0.1", "::1", "localhost"}, Server: true})
	if err != nil {
		return err
	}
	cli, err := ca.Issue(Leaf{CommonName: client, Client: true})
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(filepath.Join(dir, CAFile), ca.PEM, 0o644); err != nil {
		return err
	}
	if err := srv.Write(filepath.Join(dir, ServerCertFile), filepath.Join(dir, ServerKeyFile)); err != nil {
		return err
	}
	return cli.Write(filepath.Join(dir, ClientCertFile), filepath.Join(dir, ClientKeyFile))
}
