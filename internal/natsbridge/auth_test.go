package natsbridge

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/qbroker/qbroker/internal/events"
)

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files in a test directory.
type testPKI struct {
	dir                 string
	ca                  *x509.CertPool
	caFile              string
	serverCert          tls.Certificate
	clientCert, clientK string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: dir, ca: x509.NewCertPool(), caFile: filepath.Join(dir, "ca.pem")}
	p.ca.AddCert(caCert)
	writePEM(t, p.caFile, "CERTIFICATE", caDER)

	issue := func(serial int64, name string, usage x509.ExtKeyUsage, ips []net.IP) (certPEM, keyPEM []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	}
	sc, sk := issue(2, "nats", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	if p.serverCert, err = tls.X509KeyPair(sc, sk); err != nil {
		t.Fatal(err)
	}
	cc, ck := issue(3, "qbroker", x509.ExtKeyUsageClientAuth, nil)
	p.clientCert, p.clientK = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	writeFile(t, p.clientCert, cc)
	writeFile(t, p.clientK, ck)
	return p
}

func writePEM(t *testing.T, name, typ string, der []byte) {
	t.Helper()
	writeFile(t, name, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func writeFile(t *testing.T, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(name, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// runSecureServer starts a nats-server that requires TLS with a client
// certificate from p's CA, and the credentials opts sets.
func runSecureServer(t *testing.T, p *testPKI, opts server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	opts.TLS, opts.TLSVerify, opts.TLSTimeout = true, true, 5
	opts.TLSConfig = &tls.Config{
		Certificates: []tls.Certificate{p.serverCert},
		ClientCAs:    p.ca,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}
	srv, err := server.NewServer(&opts)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready after 10s")
	}
	return srv
}

// subscribeWith is subscribe for a server that needs credentials and TLS.
func subscribeWith(t *testing.T, url, subject string, opts ...nats.Option) <-chan received {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("subscriber connect: %v", err)
	}
	t.Cleanup(nc.Close)
	out := make(chan received, 100)
	if _, err := nc.Subscribe(subject, func(m *nats.Msg) {
		r := received{subject: m.Subject, header: m.Header}
		_ = json.Unmarshal(m.Data, &r.event)
		out <- r
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The bridge delivers events to a server that requires TLS with a client
// certificate and authenticates it by user and password, by token or by
// nkey.
func TestBridgeAuthAndTLS(t *testing.T) {
	p := newTestPKI(t)
	seed, pub := newNkey(t)
	seedFile := filepath.Join(p.dir, "user.nk")
	writeFile(t, seedFile, seed)
	cases := []struct {
		name   string
		server server.Options
		auth   Auth
		sub    nats.Option
	}{
		{"user and password", server.Options{Username: "qb", Password: "pw"},
			Auth{User: "qb", Password: "pw"}, nats.UserInfo("qb", "pw")},
		{"token", server.Options{Authorization: "t0ken"}, Auth{Token: "t0ken"}, nats.Token("t0ken")},
		{"nkey", server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}}, Auth{NKeySeedFile: seedFile}, nkeyOption(t, seedFile)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := runSecureServer(t, p, c.server)
			url := "tls://" + srv.Addr().String()
			sub := subscribeWith(t, url, "qbroker.>", c.sub, nats.RootCAs(p.caFile), nats.ClientCert(p.clientCert, p.clientK))
			auth := c.auth
			auth.CAFile, auth.CertFile, auth.KeyFile = p.caFile, p.clientCert, p.clientK
			b, _ := newBridge(t, Config{URL: url, Auth: auth})
			b.Emit(testEvent("orders", events.Published, 1))
			if r := receive(t, sub, 1, 20*time.Second)[0]; r.subject != "qbroker.orders.published" {
				t.Fatalf("subject %q, want qbroker.orders.published", r.subject)
			}
			closeBridge(t, b)
		})
	}
}

// Wrong or missing credentials, or no client certificate, get no
// connection: nats.go refuses the connect.
func TestBridgeAuthRefused(t *testing.T) {
	p := newTestPKI(t)
	srv := runSecureServer(t, p, server.Options{Username: "qb", Password: "pw"})
	url := "tls://" + srv.Addr().String()
	for name, opts := range map[string][]nats.Option{
		"wrong password":        optionsOf(t, Auth{User: "qb", Password: "nope", CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.clientK}),
		"no client certificate": optionsOf(t, Auth{User: "qb", Password: "pw", CAFile: p.caFile}),
		"unknown CA":            optionsOf(t, Auth{User: "qb", Password: "pw", TLS: true, CertFile: p.clientCert, KeyFile: p.clientK}),
	} {
		nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second))...)
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected, want a refusal", name)
		}
	}
	if _, err := New(Config{URL: url, Auth: Auth{User: "a", Password: "b", Token: "c"}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("two credentials: got %v, want ErrInvalidConfig", err)
	}
	if _, err := New(Config{URL: url, Auth: Auth{CertFile: p.clientCert}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("certificate without key: got %v, want ErrInvalidConfig", err)
	}
}

func optionsOf(t *testing.T, a Auth) []nats.Option {
	t.Helper()
	opts, err := a.options()
	if err != nil {
		t.Fatal(err)
	}
	return opts
}

func newNkey(t *testing.T) (seed []byte, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	if seed, err = kp.Seed(); err != nil {
		t.Fatal(err)
	}
	if pub, err = kp.PublicKey(); err != nil {
		t.Fatal(err)
	}
	return seed, pub
}

func nkeyOption(t *testing.T, seedFile string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
