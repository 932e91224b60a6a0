package broker

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/qbroker/qbroker/internal/reload"
)

// With authentication on, a stream is authorized when it opens and for
// each request it sends; what it was granted then must not outlive the
// credential or the rule that granted it. The broker keeps its open
// streams (Consume, JoinSync, Lock, Campaign, Observe, any other) in an
// authStreams and re-checks them all whenever the tokens file, the JWKS
// file or the rules file was reloaded, and a stream whose credential
// expires (a JWT's exp, a client certificate's NotAfter) when it does. A
// stream no longer allowed ends as a denied request ends it
// (checkedStream): its context is cancelled, so its handler stops and
// cleans up as on any end (a Lock stream unlocks, a Consume stream
// releases its unsettled leases), it sends nothing more, and the client
// gets Unauthenticated (credential revoked or expired) or PermissionDenied
// (rules), naming why.

// authWatchInterval is how often the broker looks for changed files and
// expired credentials: the files' own reload interval.
const authWatchInterval = reload.DefaultInterval

// authStreams are a broker's open authenticated streams.
type authStreams struct {
	mu sync.Mutex
	m  map[*authStream]struct{}
}

// authStream is one open stream and what it was authenticated with.
type authStream struct {
	ctx    context.Context // the stream's own: its metadata and peer hold its credential
	id     Identity
	method string
	w      *checkedStream
}

func (s *authStreams) add(st *authStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[*authStream]struct{}{}
	}
	s.m[st] = struct{}{}
}

func (s *authStreams) remove(st *authStream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, st)
}

func (s *authStreams) list() []*authStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*authStream, 0, len(s.m))
	for st := range s.m {
		out = append(out, st)
	}
	return out
}

// runAuthWatch re-checks the open streams when the files change and when
// a stream's credential expires, until Shutdown.
func (gt *gate) runAuthWatch() {
	b := gt.b
	defer b.wg.Done()
	a := b.cfg.Auth
	gen := a.generation()
	t := time.NewTicker(authWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		g := a.generation()
		gt.recheckStreams(g != gen, time.Now())
		gen = g
	}
}

// recheckStreams ends the open streams no longer allowed: all of them
// are checked when changed, else only those whose credential expired by
// now.
func (gt *gate) recheckStreams(changed bool, now time.Time) {
	b := gt.b
	for _, st := range gt.authStreams.list() {
		if !changed && (st.id.until.IsZero() || now.Before(st.id.until)) {
			continue
		}
		if err := gt.recheck(st); err != nil {
			gt.warnings.warn(b.log, "auth:revoked", "open stream ended: no longer allowed", "method", st.method,
				"identity", st.id.Name, "via", st.id.Via, "err", status.Convert(err).Message())
			st.w.end(err)
		}
	}
}

// recheck authenticates st's credential again and checks what st was
// granted against the current rules.
func (gt *gate) recheck(st *authStream) error {
	b := gt.b
	a := b.cfg.Auth
	id, err := a.authenticate(st.ctx)
	if err == nil && id.Name != st.id.Name {
		err = status.Errorf(codes.Unauthenticated, "it now names identity %s", id.Name)
	}
	if err != nil {
		switch st.id.Via {
		case "token":
			return status.Errorf(codes.Unauthenticated, "token for identity %s was revoked", st.id.Name)
		case "jwt":
			return status.Errorf(codes.Unauthenticated, "JWT for identity %s is no longer valid: %s", st.id.Name, status.Convert(err).Message())
		default:
			return status.Errorf(codes.Unauthenticated, "client certificate for identity %s is no longer valid: %s", st.id.Name, status.Convert(err).Message())
		}
	}
	rules := a.rules.Get()
	for _, g := range st.w.grantedAccess() {
		if !rules.Allowed(id.Name, g.action, g.name) {
			return status.Errorf(codes.PermissionDenied, "rules no longer allow %s to %s %s %q", id.Name, g.action, g.kind, printable(g.name))
		}
	}
	return nil
}
