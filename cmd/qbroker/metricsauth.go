package main

import (
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/qbroker/qbroker/broker"
)

// httpAuth puts the metrics listener's /metrics and /debug/pprof/ behind
// the broker's authentication when it is on: the client certificate the
// HTTPS handshake verified (--metrics-tls with --tls-client-ca) or an
// "Authorization: Bearer <token>" header of the tokens file, as for a gRPC
// call. /metrics answers any identity, but only with the queue series of
// the queues its rules let it view; the profiles need the debug action.
type httpAuth struct {
	b *broker.Broker
}

// identify authenticates r. on is false without authentication; a
// refusal has been answered (401) when ok is false.
func (a httpAuth) identify(w http.ResponseWriter, r *http.Request) (id broker.Identity, on, ok bool) {
	var addr net.Addr
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		addr = net.TCPAddrFromAddrPort(ap)
	}
	token := ""
	if h := r.Header.Get("Authorization"); h != "" {
		var bearer bool
		if token, bearer = strings.CutPrefix(h, "Bearer "); !bearer || token == "" {
			token = "-" // not a bearer token: refused as an invalid one
		}
	}
	id, on, err := a.b.Authenticate(broker.CallerContext(r.Context(), addr, r.TLS, token))
	if !on {
		return id, false, true
	}
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="qbroker"`)
		http.Error(w, "authentication is on: send a client certificate (--metrics-tls with --tls-client-ca) "+
			"or an \"Authorization: Bearer <token>\" header with a token of --auth-tokens", http.StatusUnauthorized)
		return id, true, false
	}
	return id, true, true
}

// metrics serves reg's metrics; with authentication on, only to an
// identity, and without the series of queues it may not view.
func (a httpAuth) metrics(reg *prometheus.Registry) http.Handler {
	all := promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, on, ok := a.identify(w, r)
		switch {
		case !ok:
		case !on:
			all.ServeHTTP(w, r)
		default:
			g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
				mfs, err := reg.Gather()
				return a.viewable(id, mfs), err
			})
			promhttp.HandlerFor(g, promhttp.HandlerOpts{}).ServeHTTP(w, r)
		}
	})
}

// viewable drops from mfs the series whose queue label names a queue id
// may not view (and the families left without series).
func (a httpAuth) viewable(id broker.Identity, mfs []*dto.MetricFamily) []*dto.MetricFamily {
	allowed := map[string]bool{}
	may := func(q string) bool {
		ok, seen := allowed[q]
		if !seen {
			ok = a.b.Allowed(id, broker.ActView, q)
			allowed[q] = ok
		}
		return ok
	}
	out := mfs[:0]
	for _, mf := range mfs {
		ms := mf.Metric[:0]
		for _, m := range mf.Metric {
			if q, labelled := queueLabel(m); !labelled || may(q) {
				ms = append(ms, m)
			}
		}
		if len(ms) > 0 {
			mf.Metric = ms
			out = append(out, mf)
		}
	}
	return out
}

func queueLabel(m *dto.Metric) (string, bool) {
	for _, l := range m.GetLabel() {
		if l.GetName() == "queue" {
			return l.GetValue(), true
		}
	}
	return "", false
}

// pprof serves the Go profiles; with authentication on, only to an
// identity the rules grant the debug action (name pprof).
func (a httpAuth) pprof(mux *http.ServeMux) {
	guard := func(h http.HandlerFunc) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id, on, ok := a.identify(w, r)
			switch {
			case !ok:
			case on && !a.b.Allowed(id, broker.ActDebug, broker.DebugName):
				http.Error(w, "identity "+id.Name+" may not read the Go profiles: its rules need the debug action (\""+
					id.Name+" debug pprof\")", http.StatusForbidden)
			default:
				h(w, r)
			}
		})
	}
	mux.Handle("/debug/pprof/", guard(pprof.Index))
	mux.Handle("/debug/pprof/cmdline", guard(pprof.Cmdline))
	mux.Handle("/debug/pprof/profile", guard(pprof.Profile))
	mux.Handle("/debug/pprof/symbol", guard(pprof.Symbol))
	mux.Handle("/debug/pprof/trace", guard(pprof.Trace))
}
