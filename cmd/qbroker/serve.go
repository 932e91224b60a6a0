package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/connlimit"
	"github.com/qbroker/qbroker/internal/events"
)

func init() {
	register(command{name: "serve", usage: "run a broker (flags or QBROKER_* env)", run: func(args []string) error {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		o := serveFlags(fs)
		fs.Usage = func() {
			fmt.Fprintln(fs.Output(), "usage: qbroker serve [flags]\n\nRuns a stateless broker; all state lives in ZooKeeper.\nEvery flag defaults to the environment variable shown.\n\nflags:")
			fs.PrintDefaults()
		}
		if err := fs.Parse(args); err != nil {
			return flagErr(err)
		}
		return serve(o)
	}})
}

// flagErr turns --help into a clean exit.
func flagErr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	return err
}

type serveOptions struct {
	zk             string
	root           string
	listen         string
	metricsListen  string
	id             string
	maxPayload     int
	maxBatchBytes  int
	maxBatchCount  int
	maxDepth       int
	zkSessions     int
	visibility     time.Duration
	sweep          time.Duration
	sessionTimeout time.Duration
	shutdown       time.Duration
	limits         limitOptions
	pprof          bool
	logFormat      string
	logLevel       string
	nats           natsOptions
}

// limitOptions are the stream and connection limits.
type limitOptions struct {
	maxStreams        int
	firstMessage      time.Duration
	maxStreamsPerConn int
	maxConns          int
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
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(env(name, "")); err == nil {
		return v
	}
	return def
}

func envDur(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(env(name, "")); err == nil {
		return v
	}
	return def
}

func envBool(name string, def bool) bool {
	if v, err := strconv.ParseBool(env(name, "")); err == nil {
		return v
	}
	return def
}

func serveFlags(fs *flag.FlagSet) *serveOptions {
	o := &serveOptions{}
	fs.StringVar(&o.zk, "zk", env("ZK", "127.0.0.1:2181"), "ZooKeeper servers, comma-separated host:port ($QBROKER_ZK)")
	fs.StringVar(&o.root, "root", env("ROOT", "/qbroker"), "znode under which all state lives ($QBROKER_ROOT)")
	fs.StringVar(&o.listen, "listen", env("LISTEN", "127.0.0.1:7070"), "gRPC listen address ($QBROKER_LISTEN)")
	fs.StringVar(&o.metricsListen, "metrics-listen", env("METRICS_LISTEN", "127.0.0.1:9090"), "HTTP address for /metrics; empty disables ($QBROKER_METRICS_LISTEN)")
	fs.StringVar(&o.id, "id", env("ID", ""), "broker id; default <hostname>-<random> ($QBROKER_ID)")
	fs.IntVar(&o.maxPayload, "max-payload", envInt("MAX_PAYLOAD", 512<<10), "largest message payload in bytes ($QBROKER_MAX_PAYLOAD)")
	fs.IntVar(&o.maxBatchBytes, "max-batch-bytes", envInt("MAX_BATCH_BYTES", 900<<10), "largest publish batch in bytes ($QBROKER_MAX_BATCH_BYTES)")
	fs.IntVar(&o.maxBatchCount, "max-batch-count", envInt("MAX_BATCH_COUNT", 1000), "most messages in a publish batch ($QBROKER_MAX_BATCH_COUNT)")
	fs.IntVar(&o.maxDepth, "max-depth", envInt("MAX_DEPTH", 100_000), "most ready messages per queue; publishing beyond fails with ResourceExhausted ($QBROKER_MAX_DEPTH)")
	fs.DurationVar(&o.visibility, "visibility-timeout", envDur("VISIBILITY_TIMEOUT", 30*time.Second), "default lease of queues created without one ($QBROKER_VISIBILITY_TIMEOUT)")
	fs.DurationVar(&o.sweep, "sweep-interval", envDur("SWEEP_INTERVAL", time.Second), "how often the leader releases expired leases ($QBROKER_SWEEP_INTERVAL)")
	fs.IntVar(&o.zkSessions, "zk-sessions", envInt("ZK_SESSIONS", 0), "ZooKeeper sessions: 1 for watches and registration, the rest split between writes and reads (0: default) ($QBROKER_ZK_SESSIONS)")
	fs.DurationVar(&o.sessionTimeout, "session-timeout", envDur("SESSION_TIMEOUT", 10*time.Second), "ZooKeeper session timeout ($QBROKER_SESSION_TIMEOUT)")
	fs.DurationVar(&o.shutdown, "shutdown-timeout", envDur("SHUTDOWN_TIMEOUT", 10*time.Second), "graceful shutdown bound ($QBROKER_SHUTDOWN_TIMEOUT)")
	fs.IntVar(&o.limits.maxStreams, "max-streams", envInt("MAX_STREAMS", 10000), "most Consume and JoinSync streams open at once; more are refused with ResourceExhausted ($QBROKER_MAX_STREAMS)")
	fs.DurationVar(&o.limits.firstMessage, "stream-first-message-timeout", envDur("STREAM_FIRST_MESSAGE_TIMEOUT", 10*time.Second), "a Consume stream must send its subscribe request within this ($QBROKER_STREAM_FIRST_MESSAGE_TIMEOUT)")
	fs.IntVar(&o.limits.maxStreamsPerConn, "max-streams-per-conn", envInt("MAX_STREAMS_PER_CONN", 1000), "most concurrent calls and streams on one client connection ($QBROKER_MAX_STREAMS_PER_CONN)")
	fs.IntVar(&o.limits.maxConns, "max-conns", envInt("MAX_CONNS", 0), "most open client connections; 0: the open-file limit (raised to its hard limit) less a tenth ($QBROKER_MAX_CONNS)")
	fs.IntVar(&o.limits.maxConnsPerIP, "max-conns-per-ip", envInt("MAX_CONNS_PER_IP", 0), "most open connections from one client IP address; 0: no limit ($QBROKER_MAX_CONNS_PER_IP)")
	fs.DurationVar(&o.limits.handshake, "handshake-timeout", envDur("HANDSHAKE_TIMEOUT", 10*time.Second), "a new connection that sends nothing within this, or does not complete the HTTP/2 handshake within twice this, is closed ($QBROKER_HANDSHAKE_TIMEOUT)")
	fs.DurationVar(&o.limits.maxConnIdle, "max-connection-idle", envDur("MAX_CONNECTION_IDLE", 5*time.Minute), "a client connection without calls for this long is closed; clients reconnect ($QBROKER_MAX_CONNECTION_IDLE)")
	fs.BoolVar(&o.pprof, "pprof", envBool("PPROF", false), "serve Go profiles at /debug/pprof/ on --metrics-listen ($QBROKER_PPROF)")
	fs.StringVar(&o.logFormat, "log-format", env("LOG_FORMAT", "text"), "log format: text or json ($QBROKER_LOG_FORMAT)")
	fs.StringVar(&o.logLevel, "log-level", env("LOG_LEVEL", "info"), "log level: debug, info, warn, error ($QBROKER_LOG_LEVEL)")
	fs.StringVar(&o.nats.url, "nats-url", env("NATS_URL", ""), "NATS server URL; enables the event bridge ($QBROKER_NATS_URL)")
	fs.StringVar(&o.nats.prefix, "nats-prefix", env("NATS_PREFIX", "qbroker"), "event subject prefix: <prefix>.<queue>.<event> ($QBROKER_NATS_PREFIX)")
	fs.BoolVar(&o.nats.jetstream, "nats-jetstream", envBool("NATS_JETSTREAM", false), "publish events to a JetStream stream with Nats-Msg-Id dedup ($QBROKER_NATS_JETSTREAM)")
	fs.StringVar(&o.nats.stream, "nats-stream", env("NATS_STREAM", "QBROKER_EVENTS"), "JetStream stream name ($QBROKER_NATS_STREAM)")
	fs.BoolVar(&o.nats.payload, "nats-payload", envBool("NATS_PAYLOAD", false), "include message payloads in events ($QBROKER_NATS_PAYLOAD)")
	fs.IntVar(&o.nats.maxPayload, "nats-max-payload", envInt("NATS_MAX_PAYLOAD", 4096), "largest payload included in an event ($QBROKER_NATS_MAX_PAYLOAD)")
	fs.IntVar(&o.nats.buffer, "nats-buffer", envInt("NATS_BUFFER", 8192), "events buffered before dropping ($QBROKER_NATS_BUFFER)")
	return o
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

// serve runs a broker until SIGINT/SIGTERM, then shuts down in order:
// health NOT_SERVING and streams ended (in-flight leases released),
// GracefulStop (forced Stop after --shutdown-timeout), ZooKeeper sessions
// closed, event bridge drained.
func serve(o *serveOptions) error {
	log, err := newLogger(o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return serveCtx(ctx, o, log)
}

// serveCtx runs a broker until ctx ends (see serve).
func serveCtx(ctx context.Context, o *serveOptions, log *slog.Logger) error {
	var err error
	// Every connection is a file: use all the process may open, and
	// bound the connections below it (--max-conns).
	if files, err := connlimit.RaiseFileLimit(); err != nil {
		log.Warn("cannot raise the open-file limit", "err", err, "limit", files)
	} else {
		log.Debug("open-file limit", "limit", files)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var sink events.Sink
	var closeSink func(context.Context)
	if o.nats.url != "" {
		sink, closeSink, err = newEventBridge(o, reg, log)
		if err != nil {
			return err
		}
	}

	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	b, err := broker.New(startCtx, broker.Config{
		ZooKeeper:           strings.Split(o.zk, ","),
		Root:                o.root,
		ID:                  o.id,
		SessionTimeout:      o.sessionTimeout,
		MaxPayload:          o.maxPayload,
		MaxBatchBytes:       o.maxBatchBytes,
		MaxBatchCount:       o.maxBatchCount,
		MaxDepth:            o.maxDepth,
		ZKSessions:          o.zkSessions,
		DefaultVisibility:   o.visibility,
		SweepInterval:       o.sweep,
		MaxStreams:          o.limits.maxStreams,
		FirstMessageTimeout: o.limits.firstMessage,
		MaxStreamsPerConn:   o.limits.maxStreamsPerConn,
		MaxConns:            o.limits.maxConns,
		MaxConnsPerIP:       o.limits.maxConnsPerIP,
		HandshakeTimeout:    o.limits.handshake,
		MaxConnectionIdle:   o.limits.maxConnIdle,
		Logger:              log,
		Registerer:          reg,
		Events:              sink,
	})
	cancel()
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", o.listen)
	if err != nil {
		b.Close()
		return err
	}
	lis = b.LimitListener(lis)
	srv := b.GRPCServer()
	log.Info("serving", "listen", lis.Addr().String(), "metrics", o.metricsListen, "broker", b.ID())

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(lis) })
	var hs *http.Server
	if o.metricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.Handle("/healthz", b.HealthHandler())
		if o.pprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		hs = &http.Server{Addr: o.metricsListen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := hs.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down")
		// NOT_SERVING and end the streams (their leases are released),
		// then drain unary calls, then close the ZooKeeper sessions.
		b.Shutdown()
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(o.shutdown):
			srv.Stop()
			<-done
		}
		b.Close()
		if hs != nil {
			sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
			_ = hs.Shutdown(sctx)
			c()
		}
		if closeSink != nil {
			sctx, c := context.WithTimeout(context.Background(), o.shutdown)
			closeSink(sctx)
			c()
		}
		return nil
	})
	return g.Wait()
}
