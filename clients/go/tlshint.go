package qbroker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TLSMismatch is how a client and a broker disagree on TLS.
type TLSMismatch int

const (
	// BrokerSpeaksTLS: the client dialled without TLS a broker that
	// serves TLS.
	BrokerSpeaksTLS TLSMismatch = iota + 1
	// BrokerWithoutTLS: the client dialled with TLS a broker that serves
	// plaintext gRPC.
	BrokerWithoutTLS
	// ClientCertRequired: the broker requires a client certificate
	// (mutual TLS) and the client presented none.
	ClientCertRequired
)

// TLSMismatchError is a call that failed with ErrUnavailable because the
// client and the broker at Addr disagree on TLS: after such a failure the
// client asks the broker (a TCP connection and a TLS handshake) what it
// speaks, so that the error says what to change instead of reporting an
// opaque transport error. errors.Is matches it against ErrUnavailable.
type TLSMismatchError struct {
	Addr string
	Kind TLSMismatch
	Err  error // the call's error
}

func (e *TLSMismatchError) Error() string {
	var hint string
	switch e.Kind {
	case BrokerSpeaksTLS:
		hint = "the broker at %s speaks TLS: dial it with WithTLSFiles (CAFile: the CA that signed its certificate) or WithTLS"
	case BrokerWithoutTLS:
		hint = "the broker at %s does not speak TLS (plaintext gRPC): dial it without WithTLS or WithTLSFiles (and without WithToken, which needs TLS), or check the address"
	case ClientCertRequired:
		hint = "the broker at %s requires a client certificate (mutual TLS): give one with WithTLSFiles (CertFile, KeyFile) or WithTLS, signed by a CA the broker trusts"
	default:
		hint = "the broker at %s and this client disagree on TLS"
	}
	return fmt.Sprintf(hint+": %v", e.Addr, e.Err)
}

func (e *TLSMismatchError) Unwrap() error { return e.Err }

// tlsProbeTimeout bounds the probe of each broker address; tlsProbeReuse
// is how long a probe's finding answers later failures (a consumer
// retrying does not probe at every attempt).
const (
	tlsProbeTimeout = 2 * time.Second
	tlsProbeReuse   = 2 * time.Second
)

// tlsHinter explains calls that failed with Unavailable by probing the
// brokers' addresses for a TLS mismatch. It is safe for concurrent use.
type tlsHinter struct {
	addrs  []string    // static addresses; empty for a target URI
	tls    *tls.Config // the client's; nil without TLS
	mu     sync.Mutex
	at     time.Time // of the last probe
	result *TLSMismatchError
}

func newTLSHinter(o *options) *tlsHinter {
	h := &tlsHinter{tls: o.tls}
	for _, a := range o.addrs {
		if !strings.Contains(a, "://") {
			h.addrs = append(h.addrs, a)
		}
	}
	return h
}

func (h *tlsHinter) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return h.explain(ctx, invoker(ctx, method, req, reply, cc, opts...))
}

func (h *tlsHinter) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, h.explain(ctx, err)
	}
	return s, nil
}

// explain returns err, or a *TLSMismatchError wrapping it when err is
// Unavailable and a broker address disagrees with the client on TLS.
func (h *tlsHinter) explain(ctx context.Context, err error) error {
	if status.Code(err) != codes.Unavailable || len(h.addrs) == 0 || errors.Is(ctx.Err(), context.Canceled) {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.at) > tlsProbeReuse {
		h.result = h.probeAll(context.WithoutCancel(ctx))
		h.at = time.Now()
	}
	if h.result == nil {
		return err
	}
	return &TLSMismatchError{Addr: h.result.Addr, Kind: h.result.Kind, Err: convErr(err)}
}

// probeAll probes every address and returns the first mismatch found.
func (h *tlsHinter) probeAll(ctx context.Context) *TLSMismatchError {
	found := make([]TLSMismatch, len(h.addrs))
	var wg sync.WaitGroup
	for i, a := range h.addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, tlsProbeTimeout)
			defer cancel()
			found[i] = probeTLS(pctx, a, h.tls)
		}()
	}
	wg.Wait()
	for i, k := range found {
		if k != 0 {
			return &TLSMismatchError{Addr: h.addrs[i], Kind: k}
		}
	}
	return nil
}

// probeTLS connects to addr and finds whether the broker there speaks TLS
// when the client (TLS config c, nil without TLS) does not, or the
// reverse, or requires a client certificate c lacks. 0: no mismatch found
// (or the broker could not be reached).
func probeTLS(ctx context.Context, addr string, c *tls.Config) TLSMismatch {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	host, _, _ := net.SplitHostPort(addr)
	// The probe asks only what the broker speaks: the certificate it
	// shows is not checked here (the call itself checks it).
	var cfg *tls.Config
	if c == nil {
		cfg = &tls.Config{ServerName: host, InsecureSkipVerify: true, NextProtos: []string{"h2"}}
	} else {
		cfg = c.Clone()
		cfg.InsecureSkipVerify, cfg.VerifyPeerCertificate, cfg.VerifyConnection = true, nil, nil
		cfg.NextProtos = []string{"h2"}
		if cfg.ServerName == "" {
			cfg.ServerName = host
		}
	}
	tc := tls.Client(conn, cfg)
	err = tc.HandshakeContext(ctx)
	if c == nil {
		// A handshake, or a TLS alert refusing it: the broker speaks TLS.
		if _, alert := remoteAlert(err); err == nil || alert {
			return BrokerSpeaksTLS
		}
		return 0
	}
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) {
		return BrokerWithoutTLS
	}
	if len(c.Certificates) > 0 || c.GetClientCertificate != nil {
		return 0
	}
	if err == nil {
		// With TLS 1.3 the broker refuses a missing certificate after
		// the client's side of the handshake: on the first read.
		_, err = tc.Read(make([]byte, 1))
	}
	// TLS 1.3's certificate_required alert, or TLS 1.2's bad_certificate.
	if msg, ok := remoteAlert(err); ok && (strings.Contains(msg, "certificate required") || strings.Contains(msg, "bad certificate")) {
		return ClientCertRequired
	}
	return 0
}

// remoteAlert returns the text of the TLS alert the peer sent, which
// crypto/tls reports as a *net.OpError "remote error" (its alert type is
// unexported).
func remoteAlert(err error) (string, bool) {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "remote error" && oe.Err != nil {
		return oe.Err.Error(), true
	}
	return "", false
}
