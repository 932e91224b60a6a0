package broker

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-zookeeper/zk"
)

// Health and the ZooKeeper session.
//
// The broker serves only with a ZooKeeper session. Losing it is logged at
// warn (the client reconnects; within the session timeout nothing is
// lost), an expiry or an outage longer than the session timeout at error
// (ephemeral registrations and leadership are gone by then), regaining it
// at info. CheckHealth and HealthHandler say why the broker is not
// serving; the gRPC health service only says that it is not.

// errUnhealthy wraps CheckHealth's reasons.
var errUnhealthy = errors.New("broker not serving")

// CheckHealth returns nil while the broker serves, otherwise why it does
// not: "no ZooKeeper session for 12s (state StateConnecting)" or "shutting
// down".
func (b *Broker) CheckHealth() error {
	if b.closing() {
		return fmt.Errorf("%w: shutting down", errUnhealthy)
	}
	if b.member.hasSession.Load() {
		return nil
	}
	since := time.Duration(0)
	if lost := b.member.lostAt.Load(); lost != 0 {
		since = time.Since(time.Unix(0, lost)).Round(time.Second)
	}
	st := zk.State(b.member.zkState.Load())
	if since >= b.cfg.SessionTimeout {
		return fmt.Errorf("%w: no ZooKeeper session for %v (state %v), longer than the session timeout %v",
			errUnhealthy, since, st, b.cfg.SessionTimeout)
	}
	return fmt.Errorf("%w: no ZooKeeper session for %v (state %v)", errUnhealthy, since, st)
}

// HealthHandler serves CheckHealth over HTTP (qbroker serve mounts it at
// /healthz on the metrics listener): 200 "ok", or 503 with the reason.
func (b *Broker) HealthHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := b.CheckHealth(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}

// outageRepeat is how often a continuing outage is logged again.
const outageRepeat = time.Minute
