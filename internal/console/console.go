// Package console is the broker's web console: server-rendered HTML pages
// (html/template, no script) listing the queues with their counts and
// rates, a queue's page with its statistics, charts of its last hour
// (inline SVG), its head (the ready messages in delivery order, paged
// through Browse, none taken), a publish form, its dead letters with
// redrive, purge and delete, and the live brokers with the leader.
//
// Every read and every action is a call of the broker's own Queue service
// made in process through broker.Invoke, so it goes through the same
// validation, quotas, authorization and audit as a gRPC call. With
// authentication on, the console acts as the HTTP client's verified TLS
// client certificate (the metrics listener served with --metrics-tls and
// a client CA); without one every call is refused (Unauthenticated) and
// the page says why. Bearer tokens are not taken: a browser would have to
// keep one in a cookie.
//
// The console answers only requests whose Host is one of its names
// (hosts.go): a page of another site cannot read it or post to it by DNS
// rebinding. Actions are POST only, and carry a token in a hidden field
// that must be the HMAC, under a per-process random key, of the browser
// session's random id, kept in a SameSite=Strict cookie set with the page:
// a cross-site form has neither, and a token of one session does nothing
// in another. A request whose Origin header names another host is refused
// too. Purge and delete also need the queue's name typed into the form.
//
// The rates of the queues page are sampled by a goroutine while the pages
// are viewed (rates.go); it stops on its own a while after the last view,
// and Close stops it. The queue page's charts of the last hour are drawn
// from samples another goroutine takes from New until Close
// (history.go, chart.go): the broker's own counters, no ZooKeeper request.
//
// A Console is safe for concurrent use.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/qbroker/qbroker/broker"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Prefix is the path under which Handler serves the console.
const Prefix = "/console/"

// Config configures a Console.
type Config struct {
	// Broker serves every call.
	Broker *broker.Broker
	// Gatherer is the registry the broker's metrics are on: the queues'
	// publish and delivery rates come from its counters (this broker's
	// only). Nil: no rates.
	Gatherer prometheus.Gatherer
	// Logger; default discards.
	Logger *slog.Logger
	// Timeout bounds each page's calls; default 30 s.
	Timeout time.Duration
	// Hosts are the host names (each optionally with :port) the console
	// answers to besides localhost, loopback addresses, the address a
	// request reached and the host of Listen (see CheckHost).
	Hosts []string
	// Listen is the address the console is served on, if known.
	Listen string
	// ChartInterval is how often the queue charts are sampled from
	// Gatherer; default 10 s. The charts keep an hour of samples, or 360
	// of them when the interval is shorter.
	ChartInterval time.Duration
}

// Console serves the pages (Handler).
type Console struct {
	cfg   Config
	log   *slog.Logger
	pages map[string]*template.Template
	hosts hosts
	key   []byte   // per-process random key of the form tokens
	rates *rates   // nil without a Gatherer
	hist  *history // nil without a Gatherer
}

// sessionCookie carries the browser session's random id, whose HMAC is
// the form token.
const sessionCookie = "qbroker_console_session"

// maxForm bounds a form's body: a publish form holds a payload of at most
// zkqueue.HardMaxPayload bytes, which URL-encoding may triple.
const maxForm = 4 << 20

// New returns a console of cfg.Broker.
func New(cfg Config) (*Console, error) {
	if cfg.Broker == nil {
		return nil, errors.New("console: no broker")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.ChartInterval <= 0 {
		cfg.ChartInterval = chartEvery
	}
	hs, err := newHosts(cfg.Hosts, cfg.Listen)
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, log: cfg.Logger, pages: map[string]*template.Template{}, hosts: hs, key: make([]byte, 32)}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if _, err := rand.Read(c.key); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	for _, name := range []string{"queues", "queue", "brokers", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		c.pages[name] = t
	}
	if cfg.Gatherer != nil {
		c.rates = newRates(cfg.Gatherer, time.Now)
		c.rates.every = sampleEvery
		c.hist = newHistory(cfg.Gatherer, cfg.ChartInterval, time.Now)
		c.hist.start()
	}
	return c, nil
}

// Close stops the sampling of rates and of the charts' history, and
// waits for it. A console whose pages nobody views stops sampling rates
// on its own (rateIdle after the last view); the history is sampled
// until Close.
func (c *Console) Close() {
	if c.rates != nil {
		c.rates.close()
	}
	if c.hist != nil {
		c.hist.close()
	}
}

// Handler serves the console under Prefix.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET "+Prefix+"static/", http.StripPrefix(Prefix+"static/", http.FileServerFS(static)))
	mux.HandleFunc("GET "+Prefix+"{$}", c.queuesPage)
	mux.HandleFunc("POST "+Prefix+"queues", c.action(c.create))
	mux.HandleFunc("GET "+Prefix+"queues/{name}", c.queuePage)
	mux.HandleFunc("POST "+Prefix+"queues/{name}/publish", c.action(c.publish))
	mux.HandleFunc("POST "+Prefix+"queues/{name}/redrive", c.action(c.redrive))
	mux.HandleFunc("POST "+Prefix+"queues/{name}/purge", c.action(c.purge))
	mux.HandleFunc("POST "+Prefix+"queues/{name}/delete", c.action(c.deleteQueue))
	mux.HandleFunc("GET "+Prefix+"brokers", c.brokersPage)
	return secureHeaders(c.hosts.check(mux))
}

// secureHeaders keeps the pages out of caches and frames, and lets them
// load nothing but the console's own stylesheet.
func secureHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// call runs a Queue method as the HTTP client r (see broker.Invoke).
func (c *Console) call(r *http.Request, method string, req proto.Message) (proto.Message, error) {
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.Timeout)
	defer cancel()
	return c.cfg.Broker.Invoke(c.callerCtx(ctx, r), method, req)
}

// callerCtx describes the HTTP client of r to the broker: its address
// and its TLS state (the client certificate the handshake verified).
func (c *Console) callerCtx(ctx context.Context, r *http.Request) context.Context {
	var addr net.Addr
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		addr = net.TCPAddrFromAddrPort(ap)
	}
	return broker.CallerContext(ctx, addr, r.TLS, "")
}

// page is what every template gets.
type page struct {
	Title   string
	Nav     string // "queues" or "brokers"
	CSRF    string
	Who     string // the identity the console acts as
	AuthErr string // why calls are refused, with authentication on
	Flash   string
	Data    any
}

// newPage fills in the parts every page shows, and starts a browser
// session (its cookie) unless the request has one.
func (c *Console) newPage(w http.ResponseWriter, r *http.Request, title, nav string, data any) *page {
	p := &page{Title: title, Nav: nav, CSRF: c.formToken(c.session(w, r)), Data: data, Flash: flash(r.URL.Query())}
	id, on, err := c.cfg.Broker.Authenticate(c.callerCtx(r.Context(), r))
	switch {
	case !on:
	case err != nil:
		p.AuthErr = "Authentication is on and this connection has no verified client certificate: every call is refused. " +
			"Open the console over HTTPS (--metrics-tls, with --tls-client-ca) with a client certificate the rules allow."
	default:
		p.Who = id.Name
	}
	return p
}

func (c *Console) render(w http.ResponseWriter, code int, name string, p *page) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if err := c.pages[name].Execute(w, p); err != nil {
		c.log.Warn("console: render", "page", name, "err", err)
	}
}

// errorData is the error page's content.
type errorData struct {
	Code    string // the gRPC code's name, or "" for the console's own refusals
	Message string
	Back    string // where to go from there
}

// fail renders err (a gRPC status, or a console refusal made by
// refuse) with the HTTP status that matches its code.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, back string, err error) {
	var rf refusal
	if errors.As(err, &rf) {
		c.render(w, rf.status, "error", c.newPage(w, r, "Refused", "", errorData{Message: rf.msg, Back: back}))
		return
	}
	st := status.Convert(err)
	c.render(w, httpStatus(st.Code()), "error", c.newPage(w, r, st.Code().String(), "",
		errorData{Code: st.Code().String(), Message: st.Message(), Back: back}))
}

// refusal is a request the console refuses before calling the broker:
// a bad form value, a missing confirmation, a forged or stale form.
type refusal struct {
	status int
	msg    string
}

func (e refusal) Error() string { return e.msg }

func refuse(code int, format string, args ...any) error {
	return refusal{status: code, msg: fmt.Sprintf(format, args...)}
}

// httpStatus maps a gRPC code to the HTTP status of the page that shows
// it.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.FailedPrecondition, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unavailable, codes.Canceled:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Unimplemented:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

// action wraps a POST handler: the body bounded, the form parsed, the
// request checked against cross-site forgery. The handler returns where
// to go on success (a 303 redirect) or an error to render.
func (c *Console) action(h func(r *http.Request) (string, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		back := r.Header.Get("Referer")
		if u, err := url.Parse(back); err != nil || u.Host != r.Host {
			back = Prefix
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, back, refuse(http.StatusBadRequest, "cannot read the form: %v", err))
			return
		}
		if err := c.checkForgery(r); err != nil {
			c.fail(w, r, back, err)
			return
		}
		to, err := h(r)
		if err != nil {
			c.fail(w, r, back, err)
			return
		}
		http.Redirect(w, r, to, http.StatusSeeOther)
	}
}

// session returns the id of r's browser session, from its cookie, or a
// new random one whose cookie it sets: a session cookie (it ends with
// the browser's session), sent to the console's pages only, never by a
// cross-site request, unreadable by scripts.
func (c *Console) session(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(sessionCookie); err == nil && validSession(ck.Value) {
		return ck.Value
	}
	var id [32]byte
	_, _ = rand.Read(id[:]) // never fails: it crashes the program instead
	sid := hex.EncodeToString(id[:])
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: sid, Path: Prefix, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	return sid
}

// validSession reports whether s has the form of a session id.
func validSession(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// formToken is the action forms' token of session sid.
func (c *Console) formToken(sid string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte("qbroker console form token\x00" + sid))
	return hex.EncodeToString(m.Sum(nil))
}

// checkForgery refuses a POST from another site: its Origin, when sent,
// must be this host, and its form token must be its session's.
func (c *Console) checkForgery(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || u.Host != r.Host {
			return refuse(http.StatusForbidden, "refused: the form was sent from another site (Origin %q)", o)
		}
	}
	ck, err := r.Cookie(sessionCookie)
	if err != nil || !validSession(ck.Value) ||
		!hmac.Equal([]byte(r.PostForm.Get("csrf")), []byte(c.formToken(ck.Value))) {
		return refuse(http.StatusForbidden, "refused: the form's token is missing or stale (the broker restarted, or the page is of another browser session); reload the page and try again")
	}
	return nil
}

// flash turns the redirect's ?ok= into the message shown on the next
// page. Only known codes show: a link cannot make the console say
// anything it did not do.
func flash(q url.Values) string {
	n := q.Get("n")
	switch q.Get("ok") {
	case "created":
		return "Queue created."
	case "published":
		return "Published message " + safeID(q.Get("id")) + "."
	case "redriven":
		return "Moved " + safeCount(n) + " dead letter(s) back to the queue."
	case "purged":
		return "Purged " + safeCount(n) + " ready message(s)."
	case "deleted":
		return "Deleted queue " + safeID(q.Get("q")) + "."
	}
	return ""
}

func safeCount(s string) string {
	for _, r := range s {
		if r < '0' || r > '9' {
			return "?"
		}
	}
	if s == "" || len(s) > 12 {
		return "?"
	}
	return s
}

// safeID keeps names and message ids ([A-Za-z0-9._-]) and nothing else.
func safeID(s string) string {
	if len(s) > 200 {
		return "?"
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return "?"
		}
	}
	return s
}
