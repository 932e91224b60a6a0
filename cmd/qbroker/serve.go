package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/connlimit"
	"github.com/qbroker/qbroker/internal/console"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/zkqueue"
)

func init() {
	register(command{name: "serve", usage: "run a broker (flags or QBROKER_* env)", run: func(args []string) error {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(&helpWriter{out: os.Stdout, err: os.Stderr})
		o := serveFlags(fs)
		fs.Usage = func() {
			fmt.Fprintln(fs.Output(), "usage: qbroker serve [flags]\n\nRuns a stateless broker; all state lives in ZooKeeper.\nEvery flag defaults to the environment variable shown.\n\nflags:")
			fs.PrintDefaults()
		}
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if err := o.validate(); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		return serve(ctx, o)
	}})
}

type serveOptions struct {
	env            envDefaults // QBROKER_* values that did not parse
	zk             string
	root           string
	listen         string
	metricsListen  string
	id             string
	maxPayload     int
	maxBatchBytes  int
	maxBatchCount  int
	maxDepth       int
	maxDelay       time.Duration
	zkDataBudget   int
	maxQueues      int
	segmentSize    int
	zkSessions     int
	claimAhead     bool
	visibility     time.Duration
	sweep          time.Duration
	sessionTimeout time.Duration
	zkConnect      time.Duration
	shutdown       time.Duration
	limits         limitOptions
	pprof          bool
	console        bool
	consoleHosts   hostList
	logFormat      string
	logLevel       string
	nats           natsOptions
	zkAuth         zkAuthOptions
	security       securityOptions // TLS, authentication, exposure (security.go)
	bound          boundListeners  // bound before serve is called (dev.go)
}

// limitOptions are the stream and connection limits.
type limitOptions struct {
	maxStreams        int
	maxStreamsPerID   int
	firstMessage      time.Duration
	maxStreamsPerConn int
	maxConns          int
	maxConnsPerID     int
	maxConnsPerIP     int
	handshake         time.Duration
	maxConnIdle       time.Duration
}

type natsOptions struct {
	url        string
	prefix     string
	jetstream  bool
	stream     string
	payload    bool
	maxPayload int
	buffer     int
	auth       natsAuthOptions
}

// envDefaults reads flag defaults from QBROKER_* variables. A value that
// does not parse leaves the default in place and is remembered: err
// reports it, so that a typo never silently becomes a default.
type envDefaults struct {
	errs []error
}

func (e *envDefaults) lookup(name string) (string, bool) {
	return os.LookupEnv("QBROKER_" + name)
}

func (e *envDefaults) bad(name, v, want string) {
	e.errs = append(e.errs, fmt.Errorf("$QBROKER_%s=%q: want %s", name, v, want))
}

func (e *envDefaults) int(name string, def int) int {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		e.bad(name, v, "an integer")
		return def
	}
	return n
}

func (e *envDefaults) dur(name string, def time.Duration) time.Duration {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		e.bad(name, v, "a duration such as 30s")
		return def
	}
	return d
}

func (e *envDefaults) bool(name string, def bool) bool {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.bad(name, v, "true or false")
		return def
	}
	return b
}

// err returns the bad QBROKER_* values, as a usageError.
func (e *envDefaults) err() error {
	if len(e.errs) == 0 {
		return nil
	}
	return usageError{errors.Join(e.errs...)}
}

func serveFlags(fs *flag.FlagSet) *serveOptions {
	o := &serveOptions{}
	e := &o.env
	fs.StringVar(&o.zk, "zk", env("ZK", "127.0.0.1:2181"), "ZooKeeper servers, comma-separated host:port ($QBROKER_ZK)")
	fs.StringVar(&o.root, "root", env("ROOT", "/qbroker"), "znode under which all state lives ($QBROKER_ROOT)")
	fs.StringVar(&o.listen, "listen", env("LISTEN", "127.0.0.1:7070"), "gRPC listen address ($QBROKER_LISTEN)")
	fs.StringVar(&o.metricsListen, "metrics-listen", env("METRICS_LISTEN", "127.0.0.1:9090"), "HTTP address for /metrics; empty disables ($QBROKER_METRICS_LISTEN)")
	fs.StringVar(&o.id, "id", env("ID", ""), "broker id; default <hostname>-<random> ($QBROKER_ID)")
	fs.IntVar(&o.maxPayload, "max-payload", e.int("MAX_PAYLOAD", 512<<10), fmt.Sprintf("largest message payload in bytes, at most %d ($QBROKER_MAX_PAYLOAD)", zkqueue.HardMaxPayload))
	fs.IntVar(&o.maxBatchBytes, "max-batch-bytes", e.int("MAX_BATCH_BYTES", 0), "largest publish batch in bytes: the payloads plus 207 bytes and the queue name per message (its header and node path); 0 means 921600, or --max-payload when larger ($QBROKER_MAX_BATCH_BYTES)")
	fs.IntVar(&o.maxBatchCount, "max-batch-count", e.int("MAX_BATCH_COUNT", 1000), "most messages in a publish batch ($QBROKER_MAX_BATCH_COUNT)")
	fs.IntVar(&o.maxDepth, "max-depth", e.int("MAX_DEPTH", 0), "most ready messages per queue, for every queue; publishing beyond fails with ResourceExhausted; 0: none but the queue's own max_depth ($QBROKER_MAX_DEPTH)")
	fs.DurationVar(&o.maxDelay, "max-delay", e.dur("MAX_DELAY", broker.DefaultMaxDelay), fmt.Sprintf("longest delivery delay of a published message, at most %v ($QBROKER_MAX_DELAY)", broker.HardMaxDelay))
	fs.IntVar(&o.zkDataBudget, "zk-data-budget", e.int("ZK_DATA_BUDGET", broker.DefaultZKDataBudget>>20), "MiB of data ZooKeeper may hold (twice its approximate data size, from mntr, plus 384 bytes per znode); publishing beyond fails with ResourceExhausted; at most a quarter of ZooKeeper's heap (-Xmx); 0: no budget ($QBROKER_ZK_DATA_BUDGET)")
	fs.IntVar(&o.segmentSize, "segment-size", e.int("SEGMENT_SIZE", zkqueue.DefaultSegmentSize), "messages per queue segment, at most 50000: consumers list one segment at a time; use the same on every broker ($QBROKER_SEGMENT_SIZE)")
	fs.IntVar(&o.maxQueues, "max-queues", e.int("MAX_QUEUES", 10_000), "most queues, at most 20000; creating beyond fails with ResourceExhausted ($QBROKER_MAX_QUEUES)")
	fs.DurationVar(&o.visibility, "visibility-timeout", e.dur("VISIBILITY_TIMEOUT", 30*time.Second), "default lease of queues created without one ($QBROKER_VISIBILITY_TIMEOUT)")
	fs.DurationVar(&o.sweep, "sweep-interval", e.dur("SWEEP_INTERVAL", time.Second), "how often the leader releases expired leases ($QBROKER_SWEEP_INTERVAL)")
	fs.BoolVar(&o.claimAhead, "claim-ahead", e.bool("CLAIM_AHEAD", true), "at-least-once Consume streams with a prefetch of at most 16, and Receive calls of at most 16 messages that may wait, take messages claimed ahead of their credit; --claim-ahead=false: each claims for itself ($QBROKER_CLAIM_AHEAD)")
	fs.IntVar(&o.zkSessions, "zk-sessions", e.int("ZK_SESSIONS", 0), "ZooKeeper sessions: 1 for watches and registration, the rest split between writes and reads (0: default) ($QBROKER_ZK_SESSIONS)")
	fs.DurationVar(&o.sessionTimeout, "session-timeout", e.dur("SESSION_TIMEOUT", 10*time.Second), "ZooKeeper session timeout ($QBROKER_SESSION_TIMEOUT)")
	fs.DurationVar(&o.zkConnect, "zk-connect-timeout", e.dur("ZK_CONNECT_TIMEOUT", 30*time.Second), "at start, give up when no ZooKeeper server of --zk gives a session within this; the wait is reported every few seconds ($QBROKER_ZK_CONNECT_TIMEOUT)")
	fs.DurationVar(&o.shutdown, "shutdown-timeout", e.dur("SHUTDOWN_TIMEOUT", 10*time.Second), "graceful shutdown bound ($QBROKER_SHUTDOWN_TIMEOUT)")
	fs.IntVar(&o.limits.maxStreams, "max-streams", e.int("MAX_STREAMS", 10000), "most Consume and JoinSync streams open at once; more are refused with ResourceExhausted ($QBROKER_MAX_STREAMS)")
	fs.IntVar(&o.limits.maxStreamsPerID, "max-streams-per-identity", e.int("MAX_STREAMS_PER_IDENTITY", 0), "most of those streams one client may hold: one identity with auth on, else one IP address; 0: a tenth of --max-streams ($QBROKER_MAX_STREAMS_PER_IDENTITY)")
	fs.DurationVar(&o.limits.firstMessage, "stream-first-message-timeout", e.dur("STREAM_FIRST_MESSAGE_TIMEOUT", 10*time.Second), "a Consume stream must send its subscribe request within this ($QBROKER_STREAM_FIRST_MESSAGE_TIMEOUT)")
	fs.IntVar(&o.limits.maxStreamsPerConn, "max-streams-per-conn", e.int("MAX_STREAMS_PER_CONN", 1000), "most concurrent calls and streams on one client connection ($QBROKER_MAX_STREAMS_PER_CONN)")
	fs.IntVar(&o.limits.maxConns, "max-conns", e.int("MAX_CONNS", 0), "most open client connections; 0: the open-file limit (raised to its hard limit) less a tenth ($QBROKER_MAX_CONNS)")
	fs.IntVar(&o.limits.maxConnsPerID, "max-conns-per-identity", e.int("MAX_CONNS_PER_IDENTITY", 0), "most connections one client may make calls on: one identity with auth on, else one IP address; 0: a tenth of --max-conns ($QBROKER_MAX_CONNS_PER_IDENTITY)")
	fs.IntVar(&o.limits.maxConnsPerIP, "max-conns-per-ip", e.int("MAX_CONNS_PER_IP", 0), "most open connections from one client IP address; 0: no limit ($QBROKER_MAX_CONNS_PER_IP)")
	fs.DurationVar(&o.limits.handshake, "handshake-timeout", e.dur("HANDSHAKE_TIMEOUT", 10*time.Second), "a new connection that sends nothing within this, or does not complete the HTTP/2 handshake within twice this, is closed ($QBROKER_HANDSHAKE_TIMEOUT)")
	fs.DurationVar(&o.limits.maxConnIdle, "max-connection-idle", e.dur("MAX_CONNECTION_IDLE", 5*time.Minute), "a client connection without calls for this long is closed; clients reconnect ($QBROKER_MAX_CONNECTION_IDLE)")
	fs.BoolVar(&o.pprof, "pprof", e.bool("PPROF", false), "serve Go profiles at /debug/pprof/ on --metrics-listen (off by default except in dev); with authentication on, to identities granted the debug action ($QBROKER_PPROF)")
	fs.BoolVar(&o.console, "console", e.bool("CONSOLE", true), "serve the web console at /console/ on --metrics-listen; with authentication on it acts as the client certificate of --metrics-tls ($QBROKER_CONSOLE)")
	o.consoleHosts = consoleHosts(e)
	fs.Var(&o.consoleHosts, "console-host", "a host name (optionally :port) the web console answers to besides localhost, loopback addresses and --metrics-listen; others get 421 (against DNS rebinding); repeat or separate with commas ($QBROKER_CONSOLE_HOSTS)")
	fs.StringVar(&o.logFormat, "log-format", env("LOG_FORMAT", "text"), "log format: text or json ($QBROKER_LOG_FORMAT)")
	fs.StringVar(&o.logLevel, "log-level", env("LOG_LEVEL", "info"), "log level: debug, info, warn, error ($QBROKER_LOG_LEVEL)")
	fs.StringVar(&o.nats.url, "nats-url", env("NATS_URL", ""), "NATS server URL; enables the event bridge ($QBROKER_NATS_URL)")
	fs.StringVar(&o.nats.prefix, "nats-prefix", env("NATS_PREFIX", "qbroker"), "event subject prefix: <prefix>.<queue>.<event> ($QBROKER_NATS_PREFIX)")
	fs.BoolVar(&o.nats.jetstream, "nats-jetstream", e.bool("NATS_JETSTREAM", false), "publish events to a JetStream stream with Nats-Msg-Id dedup ($QBROKER_NATS_JETSTREAM)")
	fs.StringVar(&o.nats.stream, "nats-stream", env("NATS_STREAM", "QBROKER_EVENTS"), "JetStream stream name ($QBROKER_NATS_STREAM)")
	fs.BoolVar(&o.nats.payload, "nats-payload", e.bool("NATS_PAYLOAD", false), "include message payloads in events ($QBROKER_NATS_PAYLOAD)")
	fs.IntVar(&o.nats.maxPayload, "nats-max-payload", e.int("NATS_MAX_PAYLOAD", 4096), "largest payload included in an event ($QBROKER_NATS_MAX_PAYLOAD)")
	fs.IntVar(&o.nats.buffer, "nats-buffer", e.int("NATS_BUFFER", 8192), "events buffered before dropping ($QBROKER_NATS_BUFFER)")
	o.zkAuth.register(fs, e)
	o.nats.auth.register(fs, e)
	o.security.define(fs, e)
	return o
}

// validate reports bad QBROKER_* values and flag values, naming them, as
// a usageError; the broker checks the rest of its Config.
func (o *serveOptions) validate() error {
	if err := o.env.err(); err != nil {
		return err
	}
	var errs []error
	positive := func(flag, env string, d time.Duration) {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("--%s (or $QBROKER_%s) %v: want a positive duration", flag, env, d))
		}
	}
	positive("visibility-timeout", "VISIBILITY_TIMEOUT", o.visibility)
	positive("sweep-interval", "SWEEP_INTERVAL", o.sweep)
	positive("session-timeout", "SESSION_TIMEOUT", o.sessionTimeout)
	positive("zk-connect-timeout", "ZK_CONNECT_TIMEOUT", o.zkConnect)
	positive("shutdown-timeout", "SHUTDOWN_TIMEOUT", o.shutdown)
	positive("max-delay", "MAX_DELAY", o.maxDelay)
	notNegative := func(flag, env string, n int) {
		if n < 0 {
			errs = append(errs, fmt.Errorf("--%s (or $QBROKER_%s) %d: want 0 or more", flag, env, n))
		}
	}
	notNegative("max-payload", "MAX_PAYLOAD", o.maxPayload)
	notNegative("max-batch-bytes", "MAX_BATCH_BYTES", o.maxBatchBytes)
	notNegative("max-batch-count", "MAX_BATCH_COUNT", o.maxBatchCount)
	notNegative("max-depth", "MAX_DEPTH", o.maxDepth)
	notNegative("zk-data-budget", "ZK_DATA_BUDGET", o.zkDataBudget)
	notNegative("zk-sessions", "ZK_SESSIONS", o.zkSessions)
	notNegative("nats-max-payload", "NATS_MAX_PAYLOAD", o.nats.maxPayload)
	notNegative("nats-buffer", "NATS_BUFFER", o.nats.buffer)
	if o.maxPayload > zkqueue.HardMaxPayload {
		errs = append(errs, fmt.Errorf("--max-payload (or $QBROKER_MAX_PAYLOAD) %d: at most %d (a ZooKeeper node's data)", o.maxPayload, zkqueue.HardMaxPayload))
	}
	if o.maxBatchBytes > 0 && o.maxBatchBytes < o.maxPayload {
		errs = append(errs, fmt.Errorf("--max-batch-bytes %d < --max-payload %d: a batch could not hold one message of the largest payload", o.maxBatchBytes, o.maxPayload))
	}
	if _, err := newLogger(o.logFormat, o.logLevel); err != nil {
		errs = append(errs, err)
	}
	if err := o.zkAuth.validate(o.root, o.security.insecure); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, o.security.validate(o.listen, o.metricsListen)...)
	if o.console && o.metricsListen != "" && !isLoopback(o.metricsListen) && o.security.rules == "" && !o.security.insecure {
		// Without authentication the console lets whoever reaches it
		// purge and delete every queue.
		errs = append(errs, fmt.Errorf("--metrics-listen %s is not a loopback address: the web console there needs --auth-rules (or --console=false, or --insecure)", o.metricsListen))
	}
	if len(errs) > 0 {
		return usageError{errors.Join(errs...)}
	}
	return nil
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// serve runs a broker until ctx ends (SIGINT/SIGTERM), then shuts down in
// order: health NOT_SERVING and streams ended (in-flight leases released),
// GracefulStop (forced Stop after --shutdown-timeout), ZooKeeper sessions
// closed, event bridge drained.
func serve(ctx context.Context, o *serveOptions) error {
	log, err := newLogger(o.logFormat, o.logLevel)
	if err != nil {
		return usageError{err}
	}
	return serveCtx(ctx, o, log)
}

// serveCtx runs a broker until ctx ends (see serve).
func serveCtx(ctx context.Context, o *serveOptions, log *slog.Logger) error {
	raiseFileLimit(log)
	o.security.logExposure(log, o.listen, o.metricsListen)
	o.zkAuth.logExposure(log, o.root)
	tlsCfg, err := o.security.serverTLS(log)
	if err != nil {
		return err
	}
	auth, err := o.security.auth(log)
	if err != nil {
		return err
	}

	// The ports are bound before anything connects to ZooKeeper: one in
	// use fails the start at once.
	lis, mlis, err := o.listeners()
	if err != nil {
		return err
	}
	defer lis.Close() // closed already once served; a second Close is harmless
	if mlis != nil {
		defer mlis.Close()
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	b, stopSink, err := o.startBroker(ctx, log, reg, auth)
	if err != nil {
		return err
	}
	var hs *http.Server
	if mlis != nil {
		if hs, err = o.metricsServer(reg, b, log, tlsCfg); err != nil {
			b.Close()
			stopSink()
			return err
		}
	}
	lis = b.LimitListener(lis)
	var srvOpts []grpc.ServerOption
	if tlsCfg != nil {
		srvOpts = append(srvOpts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	srv := b.GRPCServer(srvOpts...)
	log.Info("serving", "listen", lis.Addr().String(), "metrics", o.metricsListen, "broker", b.ID(),
		"tls", tlsCfg != nil, "auth", auth != nil)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(lis) })
	if hs != nil {
		g.Go(func() error {
			serveHTTP := func() error { return hs.Serve(mlis) }
			if hs.TLSConfig != nil {
				serveHTTP = func() error { return hs.ServeTLS(mlis, "", "") }
			}
			if err := serveHTTP(); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down")
		b.Stop(srv, o.shutdown)
		if hs != nil {
			sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
			_ = hs.Shutdown(sctx)
			c()
		}
		stopSink()
		return nil
	})
	return g.Wait()
}

// raiseFileLimit lets the process open all the files it may: every
// connection is one (--max-conns bounds them below the limit).
func raiseFileLimit(log *slog.Logger) {
	if files, err := connlimit.RaiseFileLimit(); err != nil {
		log.Warn("cannot raise the open-file limit", "err", err, "limit", files)
	} else {
		log.Debug("open-file limit", "limit", files)
	}
}

// startBroker starts the event bridge (when configured) and the broker,
// its metrics on reg. stopSink flushes and closes the bridge: call it
// once the broker has stopped.
func (o *serveOptions) startBroker(ctx context.Context, log *slog.Logger, reg prometheus.Registerer, auth *broker.Auth) (b *broker.Broker, stopSink func(), err error) {
	sink, closeSink, err := newEventBridge(o, reg, log)
	if err != nil {
		return nil, nil, err
	}
	stopSink = func() {
		if closeSink != nil {
			sctx, c := context.WithTimeout(context.Background(), o.shutdown)
			closeSink(sctx)
			c()
		}
	}
	cfg := o.brokerConfig(log, reg, sink)
	if cfg.ZKDigest, err = o.zkAuth.digest(); err != nil {
		stopSink()
		return nil, nil, err
	}
	cfg.Auth = auth
	startCtx, cancel := context.WithTimeout(ctx, o.zkConnect)
	defer cancel()
	wait := startZKWait(startCtx, log, cfg.ZooKeeper, o.zkConnect)
	b, err = broker.New(startCtx, cfg)
	if err = wait.stop(startCtx, err); err != nil {
		stopSink()
		return nil, nil, err
	}
	return b, stopSink, nil
}

// metricsServer is the HTTP server of --metrics-listen (over TLS with
// --metrics-tls).
func (o *serveOptions) metricsServer(reg *prometheus.Registry, b *broker.Broker, log *slog.Logger, tlsCfg *tls.Config) (*http.Server, error) {
	h, closeHandler, err := o.metricsHandler(reg, b, log)
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second} // serves the listener bound at start
	hs.RegisterOnShutdown(closeHandler)
	if o.security.metricsTLS {
		hs.TLSConfig = tlsCfg.Clone()
	}
	return hs, nil
}

// listeners binds --listen and, when set, --metrics-listen (or returns
// those bound already).
func (o *serveOptions) listeners() (lis, metrics net.Listener, err error) {
	if o.bound.lis != nil {
		return o.bound.lis, o.bound.metrics, nil
	}
	if lis, err = net.Listen("tcp", o.listen); err != nil {
		return nil, nil, fmt.Errorf("--listen %s: %w (is another broker, such as make run, on it? pass --listen with another port)", o.listen, err)
	}
	if o.metricsListen != "" {
		if metrics, err = net.Listen("tcp", o.metricsListen); err != nil {
			lis.Close()
			return nil, nil, fmt.Errorf("--metrics-listen %s: %w (pass --metrics-listen with another port, or \"\" for none)", o.metricsListen, err)
		}
	}
	return lis, metrics, nil
}

// brokerConfig is the broker's Config from the options, logging to log,
// registering its metrics on reg and emitting events to sink (nil: none).
func (o *serveOptions) brokerConfig(log *slog.Logger, reg prometheus.Registerer, sink events.Sink) broker.Config {
	return broker.Config{
		ZooKeeper:           strings.Split(o.zk, ","),
		Root:                o.root,
		ID:                  o.id,
		SessionTimeout:      o.sessionTimeout,
		MaxPayload:          o.maxPayload,
		MaxBatchBytes:       o.maxBatchBytes,
		MaxBatchCount:       o.maxBatchCount,
		MaxDepth:            o.maxDepth,
		MaxDelay:            o.maxDelay,
		ZKDataBudget:        budgetBytes(o.zkDataBudget),
		MaxQueues:           o.maxQueues,
		SegmentSize:         o.segmentSize,
		ZKSessions:          o.zkSessions,
		ClaimAhead:          o.claimAhead,
		DefaultVisibility:   o.visibility,
		SweepInterval:       o.sweep,
		MaxStreams:          o.limits.maxStreams,
		FirstMessageTimeout: o.limits.firstMessage,
		MaxStreamsPerConn:   o.limits.maxStreamsPerConn,
		MaxConns:            o.limits.maxConns,
		MaxConnsPerIP:       o.limits.maxConnsPerIP,
		HandshakeTimeout:    o.limits.handshake,
		MaxConnectionIdle:   o.limits.maxConnIdle,
		ZKWorldRead:         o.zkAuth.worldRead,
		ZKMigrateACL:        o.zkAuth.migrate,
		Logger:              log,
		Registerer:          reg,
		Events:              sink,

		// What one client (identity, or address without auth) may hold.
		MaxStreamsPerIdentity: o.limits.maxStreamsPerID,
		MaxConnsPerIdentity:   o.limits.maxConnsPerID,
	}
}

// metricsHandler serves /metrics from reg, /healthz from b, with
// --console the web console at /console/ (and / leads there) and, with
// --pprof, the Go profiles at /debug/pprof/; with authentication on,
// /metrics and the profiles need an identity (see httpAuth). The returned
// func stops what the handler runs (the console's samplers).
func (o *serveOptions) metricsHandler(reg *prometheus.Registry, b *broker.Broker, log *slog.Logger) (http.Handler, func(), error) {
	mux := http.NewServeMux()
	closeHandler := func() {}
	auth := httpAuth{b: b}
	mux.Handle("/metrics", auth.metrics(reg))
	mux.Handle("/healthz", b.HealthHandler())
	if o.console {
		c, err := console.New(console.Config{Broker: b, Gatherer: reg, Logger: log, Hosts: o.consoleHosts.names, Listen: o.metricsListen})
		if err != nil {
			return nil, nil, err
		}
		closeHandler = c.Close
		mux.Handle(console.Prefix, c.Handler())
		mux.Handle("GET /{$}", http.RedirectHandler(console.Prefix, http.StatusFound))
	}
	if o.pprof {
		auth.pprof(mux)
	}
	return mux, closeHandler, nil
}

// budgetBytes turns --zk-data-budget (MiB, 0 none) into
// Config.ZKDataBudget (bytes, negative none).
func budgetBytes(mib int) int64 {
	if mib == 0 {
		return -1
	}
	return int64(mib) << 20
}
