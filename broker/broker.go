package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/internal/connlimit"
	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/internal/layout"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/zkqueue"
)

// Config configures a Broker. Zero fields take the defaults noted.
type Config struct {
	// ZooKeeper is the list of ZooKeeper servers, host:port. Required.
	ZooKeeper []string
	// Root is the znode under which all state lives; default "/qbroker".
	Root string
	// ID names this broker in the registry and in events; default
	// <hostname>-<random>.
	ID string
	// SessionTimeout of the ZooKeeper session; default 10s.
	SessionTimeout time.Duration
	// ZKDigest, "user:password", authenticates every ZooKeeper session of
	// the broker (digest scheme) and gives every node the broker creates
	// an ACL that lets only that identity write (zkauth.go). Empty: no
	// authentication, nodes open to anyone.
	ZKDigest string
	// ZKWorldRead (with ZKDigest) lets anyone read the broker's nodes.
	ZKWorldRead bool
	// ZKMigrateACL (with ZKDigest) sets the brokers' ACL on an existing
	// root, and everything below it, that is open to anyone, instead of
	// refusing to start.
	ZKMigrateACL bool
	// ZKSessions is the number of ZooKeeper sessions the broker opens
	// (default 5). The first carries watches, scans, ephemeral nodes and
	// health; the others are split between group-commit writes and
	// claims' reads. Reads and writes use different sessions because
	// ZooKeeper answers a session's read only after that session's
	// earlier writes have committed; several sessions because one client
	// session tops out well below what ZooKeeper serves.
	ZKSessions int
	// ClaimAhead makes at-least-once Consume streams with a prefetch of
	// at most 16, and Receive calls of at most 16 messages that may wait,
	// take their deliveries from a small buffer of messages the broker
	// claims ahead of their credit (ahead.go). Off in a zero Config;
	// qbroker serve turns it on unless --claim-ahead=false.
	ClaimAhead bool
	// MaxPayload, MaxBatchBytes, MaxBatchCount: publish limits (defaults
	// 512 KiB, 900 KiB or MaxPayload when larger, 1000). MaxPayload is at
	// most zkqueue.HardMaxPayload (1008 KiB); MaxBatchBytes is at least
	// MaxPayload and at most HardMaxPayload, and counts each message's
	// payload plus its overhead in the ZooKeeper transaction
	// (zkqueue.Queue.MessageOverhead: 207 bytes plus the queue name's length
	// under the default root). The gRPC server accepts requests up to the
	// larger of the two plus requestSlack; larger ones fail with
	// ResourceExhausted before the broker sees them.
	MaxPayload    int
	MaxBatchBytes int
	MaxBatchCount int
	// MaxDepth, when set, bounds every queue's ready messages: publishing
	// beyond it fails with ResourceExhausted. Default 0: no bound but a
	// queue's own quota (CreateQueue's max_depth) and ZKDataBudget.
	MaxDepth int
	// MaxDelay bounds a message's delivery delay (OutMessage.delay or
	// deliver_at); default DefaultMaxDelay, at most HardMaxDelay.
	MaxDelay time.Duration
	// ZKDataBudget bounds what ZooKeeper holds, in bytes of estimated heap
	// (see zkMemory: DataCharge times its approximate data size plus
	// NodeCharge per znode, from mntr): publishing beyond it fails with ResourceExhausted, so
	// that ZooKeeper never runs out of heap. Default DefaultZKDataBudget,
	// which fits a ZooKeeper heap of 1 GiB (zkserver.DataBudget);
	// negative: no budget.
	ZKDataBudget int64
	// MaxQueues bounds the number of queues (default 10,000, at most
	// 20,000: the list of queues is read in one packet of at most 4 MiB).
	// CreateQueue beyond it fails with ResourceExhausted; concurrent
	// creates may pass it by their number.
	MaxQueues int
	// SegmentSize is the number of messages after which a queue's segment
	// is sealed and the next started (zkqueue.WithSegmentSize; default
	// zkqueue.DefaultSegmentSize, at most zkqueue.MaxSegmentSize).
	// Consumers list one segment at a time. Every broker of a deployment
	// should use the same size.
	SegmentSize int
	// DefaultVisibility is the lease of queues created without one;
	// default 30s.
	DefaultVisibility time.Duration
	// SweepInterval is how often the leader releases expired leases;
	// default 1s. It bounds how late an expired lease is redelivered.
	SweepInterval time.Duration
	// StatsInterval is how often queue gauges are refreshed; default 10s.
	StatsInterval time.Duration
	// MaxQueueLabels caps the distinct queue label values; default 1000.
	MaxQueueLabels int
	// MaxStreams caps the Consume and JoinSync streams open on this
	// broker; default 10000. Streams beyond it are refused with
	// ResourceExhausted.
	MaxStreams int
	// FirstMessageTimeout is how long a Consume stream may take to send
	// its subscribe request; default 10s. A stream that has not sent it
	// by then ends with InvalidArgument, freeing its place.
	FirstMessageTimeout time.Duration
	// MaxStreamsPerIdentity caps the streams MaxStreams counts that one
	// client may hold: with Auth, one authenticated identity; without,
	// one client IP address. Default: a tenth of MaxStreams (at least 1).
	// Streams beyond it are refused with ResourceExhausted naming it.
	MaxStreamsPerIdentity int
	// MaxStreamsPerConn bounds the concurrent calls and streams of one
	// client connection (HTTP/2 MAX_CONCURRENT_STREAMS); default 1000.
	MaxStreamsPerConn int
	// MaxConns bounds the open client connections of listeners wrapped
	// by LimitListener; default: the process's open-file limit less a
	// headroom of a tenth (connlimit.DefaultMax).
	MaxConns int
	// MaxConnsPerIdentity caps the client connections one client may make
	// calls on: with Auth, one authenticated identity; without, one
	// client IP address. A connection counts for a client from its first
	// call to its end; a call that would exceed the bound is refused with
	// ResourceExhausted naming it, and its connection stays unproven (a
	// LimitListener closes it first to make room). Default: a tenth of
	// MaxConns (at least 1). It applies to every listener the broker's
	// GRPCServer serves.
	MaxConnsPerIdentity int
	// MaxConnsPerIP bounds the open connections of one client IP address
	// (LimitListener); default 0, no bound (clients behind one NAT or
	// proxy share an address).
	MaxConnsPerIP int
	// HandshakeTimeout is how long a new connection may stay silent
	// (LimitListener); it has twice that to complete the HTTP/2
	// handshake. Default 10s.
	HandshakeTimeout time.Duration
	// MaxConnectionIdle closes (GOAWAY) a client connection without calls
	// for this long; clients reconnect on their next call. Default 5m.
	MaxConnectionIdle time.Duration
	// Logger; default discards.
	Logger *slog.Logger
	// Registerer receives the broker's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Events receives queue events (the NATS bridge); nil: none are built.
	Events events.Sink
	// Auth, when set, requires every call but health checks to
	// authenticate (a verified client certificate or a bearer token) and
	// allows only what its rules grant. Nil: every call is allowed. Either
	// way, queue creation, deletion, purge and redrive are logged at info
	// (audit), with the identity when there is one.
	Auth *Auth
}

func (c *Config) setDefaults() error {
	if len(c.ZooKeeper) == 0 {
		return errors.New("broker: no ZooKeeper servers configured")
	}
	if err := c.setIdentity(); err != nil {
		return err
	}
	if err := c.setStoreDefaults(); err != nil {
		return err
	}
	if err := c.setStreamDefaults(); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c.setPublishLimits()
}

// setIdentity defaults and checks Root and ID.
func (c *Config) setIdentity() error {
	if c.Root == "" {
		c.Root = "/qbroker"
	}
	if _, err := layout.New(c.Root); err != nil {
		return fmt.Errorf("broker: %w (--root)", err)
	}
	if c.ID == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = rand.Read(b[:])
		c.ID = host + "-" + hex.EncodeToString(b[:])
	}
	if err := validName("broker id (--id)", c.ID); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	return nil
}

// durationDefault is a duration setting, named as a user of qbroker serve
// knows it (its flag), and its default.
type durationDefault struct {
	name string
	d    *time.Duration
	v    time.Duration
}

// setDurations gives every zero duration its default, then reports the
// first negative one: all defaults are applied even when one is bad.
func setDurations(ds ...durationDefault) error {
	var first error
	for _, dd := range ds {
		if *dd.d == 0 {
			*dd.d = dd.v
		}
		if *dd.d < 0 && first == nil {
			first = fmt.Errorf("broker: %s %v: want a positive duration", dd.name, *dd.d)
		}
	}
	return first
}

// setStoreDefaults defaults and checks what bounds the broker's use of
// ZooKeeper: session and lease timings, queue depth and count, sessions.
func (c *Config) setStoreDefaults() error {
	if err := setDurations(
		durationDefault{"session timeout (--session-timeout)", &c.SessionTimeout, 10 * time.Second},
		durationDefault{"default visibility timeout (--visibility-timeout)", &c.DefaultVisibility, 30 * time.Second},
		durationDefault{"sweep interval (--sweep-interval)", &c.SweepInterval, time.Second},
		durationDefault{"stats interval", &c.StatsInterval, 10 * time.Second},
	); err != nil {
		return err
	}
	if c.DefaultVisibility < minVisibility || c.DefaultVisibility > maxVisibility {
		return fmt.Errorf("broker: default visibility timeout %v out of range [%v, %v] (--visibility-timeout)", c.DefaultVisibility, minVisibility, maxVisibility)
	}
	if c.MaxDepth < 0 {
		return fmt.Errorf("broker: max depth %d: want 0 (none) or more (--max-depth)", c.MaxDepth)
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = DefaultMaxDelay
	}
	if c.MaxDelay < 0 || c.MaxDelay > HardMaxDelay {
		return fmt.Errorf("broker: max delay %v out of range (0, %v] (--max-delay)", c.MaxDelay, HardMaxDelay)
	}
	if c.ZKDataBudget == 0 {
		c.ZKDataBudget = DefaultZKDataBudget
	}
	if c.MaxQueues == 0 {
		c.MaxQueues = 10_000
	}
	if c.MaxQueues < 1 || c.MaxQueues > maxMaxQueues {
		return fmt.Errorf("broker: max queues %d out of range [1, %d] (--max-queues)", c.MaxQueues, maxMaxQueues)
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = zkqueue.DefaultSegmentSize
	}
	if c.SegmentSize < 2 || c.SegmentSize > zkqueue.MaxSegmentSize {
		return fmt.Errorf("broker: segment size %d out of range [2, %d] (--segment-size)", c.SegmentSize, zkqueue.MaxSegmentSize)
	}
	if c.ZKSessions == 0 {
		c.ZKSessions = 5
	}
	if c.ZKSessions < 1 || c.ZKSessions > 16 {
		return fmt.Errorf("broker: ZooKeeper sessions %d out of range [1, 16] (--zk-sessions)", c.ZKSessions)
	}
	return nil
}

// setStreamDefaults defaults and checks the bounds on metrics labels,
// streams and client connections.
func (c *Config) setStreamDefaults() error {
	if c.MaxQueueLabels == 0 {
		c.MaxQueueLabels = 1000
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = 10000
	}
	durErr := setDurations(
		durationDefault{"stream first message timeout (--stream-first-message-timeout)", &c.FirstMessageTimeout, 10 * time.Second},
		durationDefault{"handshake timeout (--handshake-timeout)", &c.HandshakeTimeout, 10 * time.Second},
		durationDefault{"max connection idle (--max-connection-idle)", &c.MaxConnectionIdle, 5 * time.Minute},
	)
	if c.MaxStreamsPerConn == 0 {
		c.MaxStreamsPerConn = 1000
	}
	if c.MaxConns == 0 {
		c.MaxConns = 1000
		if n, err := connlimit.FileLimit(); err == nil {
			c.MaxConns = connlimit.DefaultMax(n)
		}
	}
	if c.MaxStreamsPerIdentity == 0 {
		c.MaxStreamsPerIdentity = max(1, c.MaxStreams/10)
	}
	if c.MaxConnsPerIdentity == 0 {
		c.MaxConnsPerIdentity = max(1, c.MaxConns/10)
	}
	if durErr != nil {
		return durErr
	}
	for _, v := range []struct {
		name string
		val  int
		min  int
	}{
		{"max streams (--max-streams)", c.MaxStreams, 1},
		{"max streams per connection (--max-streams-per-conn)", c.MaxStreamsPerConn, 1},
		{"max streams per identity (--max-streams-per-identity)", c.MaxStreamsPerIdentity, 1},
		{"max connections per identity (--max-conns-per-identity)", c.MaxConnsPerIdentity, 1},
		{"max connections (--max-conns)", c.MaxConns, 1},
		{"max connections per IP (--max-conns-per-ip)", c.MaxConnsPerIP, 0},
	} {
		if v.val < v.min {
			return fmt.Errorf("broker: %s %d out of range: want at least %d", v.name, v.val, v.min)
		}
	}
	return nil
}

// setPublishLimits defaults and checks MaxPayload, MaxBatchBytes and
// MaxBatchCount.
func (c *Config) setPublishLimits() error {
	if c.MaxBatchBytes == 0 && c.MaxPayload > zkqueue.DefaultMaxBatchBytes {
		c.MaxBatchBytes = c.MaxPayload
	}
	lim := zkqueue.Limits{MaxPayload: c.MaxPayload, MaxBatchBytes: c.MaxBatchBytes, MaxBatchCount: c.MaxBatchCount}
	if err := lim.Validate(); err != nil {
		// The limits' own words, named by the flags that set them.
		return fmt.Errorf("broker: %s (--max-payload, --max-batch-bytes, --max-batch-count)", strings.TrimPrefix(err.Error(), "zkqueue: "))
	}
	c.MaxPayload, c.MaxBatchBytes, c.MaxBatchCount = lim.MaxPayload, lim.MaxBatchBytes, lim.MaxBatchCount
	if c.MaxBatchBytes < c.MaxPayload {
		return fmt.Errorf("broker: --max-batch-bytes %d < --max-payload %d: a batch could not hold one message of the largest payload", c.MaxBatchBytes, c.MaxPayload)
	}
	return nil
}

// requestSlack is what a publish request within the limits carries besides
// the bytes the limits count: the queue name and the protobuf framing of one
// message. (A batch's messages each count zkqueue.Queue.MessageOverhead, far
// more than their framing.)
const requestSlack = 1 << 10

// maxRequest is the gRPC server's receive limit: slightly above the largest
// publish request the limits allow, so that any publish within them is
// accepted and one a little over them gets the broker's InvalidArgument
// naming the limit. Larger requests get gRPC's ResourceExhausted.
func (c *Config) maxRequest() int {
	return max(c.MaxPayload, c.MaxBatchBytes) + requestSlack
}

// DefaultZKDataBudget is ZKDataBudget's default: a quarter of the 1 GiB
// heap that ZooKeeper's own scripts give a server (zkEnv.sh, 1000 MB) and
// that qbroker dev gives its ZooKeeper (zkserver.DataBudget).
const DefaultZKDataBudget = 256 << 20

// maxMaxQueues keeps the list of queues (names up to 200 bytes, 4 bytes
// of framing each) within the 4 MiB the broker's ZooKeeper client reads.
const maxMaxQueues = 20_000

// Broker serves the qbroker.v1.Queue gRPC service. It keeps no state of
// its own: queues, messages, leases and group membership live in
// ZooKeeper, so any number of brokers can serve the same queues.
//
// A Broker is safe for concurrent use.
type Broker struct {
	pb.UnimplementedQueueServer

	cfg      Config
	acl      []zk.ACL // of every node the broker creates; nil: open (zkauth.go)
	log      *slog.Logger
	conn     *zk.Conn           // the primary session: watches, scans, ephemerals, health
	extra    []*zk.Conn         // further sessions, split into writers and readers
	writers  []*zk.Conn         // group-commit sessions
	readers  []*zk.Conn         // claims' read sessions
	root     layout.Root        // where the root's nodes live
	catalog  *zkqueue.Catalog   // the queues: create, delete, list, metadata
	batcher  *zkqueue.Committer // group commit of all queues' writes
	recent   *zkqueue.Budget    // all queues' memory of messages published here
	registry *zkqueue.Registry  // brokers/<id> and the consumer registrations of all queues (consume.go)
	zkmem    *zkMemory          // ZooKeeper's data against ZKDataBudget (calls.go)
	metrics  *metrics
	health   *health.Server

	ctx    context.Context // cancelled by Close: ends streams and loops
	cancel context.CancelFunc
	wg     sync.WaitGroup // background loops and open streams

	// Its parts, each with the state it keeps.
	gate    gate        // every call's way in: authentication, limits per client, audit (calls.go)
	member  membership  // the session's state and the leadership (leader.go)
	handles handles     // the queues' handles in use here (broker.go)
	claims  claims      // claiming messages for deliveries (consume.go)
	acks    acks        // settling deliveries by their ack tokens (messages.go)
	ev      emitter     // events to Config.Events (emit.go)
	sched   schedulers  // the queues' delay and expiry schedulers (schedule.go)
	active  activeGates // single-active queues' lines of streams (active.go)
	prio    prioBoards  // the queues' streams by priority (consume.go)
	coord   coordState  // the Election and Lock services' local state (coord.go)
}

var _ pb.QueueServer = (*Broker)(nil)

// New connects to ZooKeeper, waits for a session (until ctx ends),
// creates the root layout and registers the broker. Close releases
// everything.
func New(ctx context.Context, cfg Config) (*Broker, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	acl, err := cfg.zkACL()
	if err != nil {
		return nil, err
	}
	root, _ := layout.New(cfg.Root) // checked by setDefaults
	b := &Broker{
		cfg:     cfg,
		root:    root,
		acl:     acl,
		log:     cfg.Logger.With("broker", cfg.ID),
		metrics: newMetrics(cfg.Registerer, cfg.MaxQueueLabels),
		health:  health.NewServer(),
	}
	// The broker's parts, each with the state it keeps.
	b.gate.b = b
	b.member.b = b
	b.handles = handles{b: b, queues: make(map[string]*queue)}
	b.claims.b = b
	b.acks.b = b
	b.ev = emitter{b: b, sink: cfg.Events}
	b.sched.b = b
	b.active.b = b
	// Set before the first session event can read it (setServing).
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	b.health.SetServingStatus(pb.Queue_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)

	if err := b.openSessions(ctx); err != nil {
		b.cancel()
		return nil, err
	}
	if err := b.prepareRoot(ctx); err != nil {
		b.batcher.Close()
		b.closeConns()
		b.cancel()
		return nil, err
	}
	reg, _ := b.root.Broker(cfg.ID) // the id was checked by setDefaults
	b.registry.Keep(reg, []byte(time.Now().UTC().Format(time.RFC3339)))
	b.zkmem = newZKMemory(cfg.ZooKeeper, cfg.ZKDataBudget, b.log, b.metrics.zkData.Set)
	b.metrics.zkBudget.Set(float64(max(cfg.ZKDataBudget, 0)))
	b.wg.Add(5)
	go func() { defer b.wg.Done(); b.registry.Run(b.ctx) }()
	go func() { defer b.wg.Done(); b.zkmem.run(b.ctx) }()
	go b.member.runSessionWatch()
	go b.member.runMembership()
	go b.handles.runStats()
	if cfg.Auth != nil {
		b.wg.Add(1)
		go b.gate.runAuthWatch()
	}
	b.log.Info("broker started", "zookeeper", cfg.ZooKeeper, "root", cfg.Root,
		"max_streams", cfg.MaxStreams, "max_streams_per_identity", cfg.MaxStreamsPerIdentity,
		"max_conns", cfg.MaxConns, "max_conns_per_identity", cfg.MaxConnsPerIdentity, "max_conns_per_ip", cfg.MaxConnsPerIP)
	return b, nil
}

// openSessions opens the broker's ZooKeeper sessions and its group
// commit, and waits until the primary session is established. On error
// it closes what it opened.
func (b *Broker) openSessions(ctx context.Context) error {
	conn, err := b.connect(ctx, b.member.onZKEvent)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	b.conn = conn
	b.registry = zkqueue.NewRegistry(conn, zkqueue.RegistryConfig{ACL: b.acl, Logger: b.log})
	for i := 1; i < b.cfg.ZKSessions; i++ {
		c, err := b.connect(ctx, nil)
		if err != nil {
			b.closeConns()
			return fmt.Errorf("broker: %w", err)
		}
		b.extra = append(b.extra, c)
	}
	b.writers, b.readers = splitSessions(conn, b.extra)
	b.batcher = zkqueue.NewCommitter(b.writers, zkqueue.CommitterConfig{
		Workers: batchWorkers, MaxOps: batchMaxOps, MaxBytes: batchMaxBytes, Observer: b.handles.observeZK})
	b.recent = zkqueue.NewBudget(recentBytes)
	for !b.member.hasSession.Load() {
		select {
		case <-ctx.Done():
			b.batcher.Close()
			b.closeConns()
			return fmt.Errorf("broker: waiting for a ZooKeeper session with %v: %w", b.cfg.ZooKeeper, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// onZKEvent tracks the primary session for health, metrics and logs. It
// runs on the ZooKeeper client's goroutine, for every event (a watch's
// too), and must not block.
func (mb *membership) onZKEvent(ev zk.Event) {
	b := mb.b
	if ev.Type != zk.EventSession {
		return
	}
	mb.zkState.Store(int32(ev.State))
	switch ev.State {
	case zk.StateHasSession:
		if !mb.hasSession.Swap(true) {
			lost := mb.lostAt.Swap(0)
			if mb.sessions.Add(1) > 1 {
				b.metrics.reconnects.Inc()
			}
			b.metrics.sessionState.Set(1)
			mb.setServing(true)
			mb.updateLeader()
			if lost != 0 {
				b.log.Info("zookeeper session regained", "server", ev.Server,
					"after", time.Since(time.Unix(0, lost)).Round(time.Millisecond))
			} else {
				b.log.Info("zookeeper session established", "server", ev.Server)
			}
		}
		// A new session (after an expiry) has none of the old one's
		// ephemeral nodes: the registry, which notices the session
		// itself, creates them again.
	case zk.StateDisconnected, zk.StateExpired, zk.StateConnecting, zk.StateAuthFailed:
		if mb.hasSession.Swap(false) {
			mb.lostAt.Store(time.Now().UnixNano())
			b.metrics.sessionState.Set(0)
			mb.setServing(false)
			mb.updateLeader()
			if ev.State != zk.StateExpired && !b.closing() {
				b.log.Warn("zookeeper session lost: reconnecting", "state", ev.State.String(),
					"session_timeout", b.cfg.SessionTimeout)
			}
		}
		if ev.State == zk.StateExpired {
			b.log.Error("zookeeper session expired: this broker's registrations and leadership are gone; registering again with a new session")
		}
	}
}

// prepareRoot checks the root's ACL, creates the broker's parents under
// it, opens the queue catalog and loads the ack tokens' key.
func (b *Broker) prepareRoot(ctx context.Context) error {
	if err := b.checkRootACL(ctx); err != nil {
		return err
	}
	// The nodes above the root are shared with whoever else uses the
	// ensemble: those the broker creates are open; the root and all
	// below it carry the brokers' ACL.
	for _, p := range append([]string{b.root.Parent()}, b.root.Parents()...) {
		if err := zkutil.EnsurePath(b.conn, p, b.nodeACL(p)); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
	}
	var err error
	b.catalog, err = zkqueue.NewCatalog(b.conn, b.root.Queues(), zkqueue.CatalogConfig{
		MaxQueues: b.cfg.MaxQueues, Observer: b.handles.observeZK, Logger: b.log, ACL: b.acl})
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	key, err := zkutil.LoadSecret(b.conn, b.root.Path(), tokenKeyNode, b.acl, macLen)
	if err != nil {
		return fmt.Errorf("broker: token key: %w", err)
	}
	b.acks.tokens = newTokenSigner(key)
	return nil
}

// ID returns the broker's id.
func (b *Broker) ID() string { return b.cfg.ID }

// Health returns the broker's gRPC health server: SERVING while it has a
// ZooKeeper session, NOT_SERVING otherwise and after Close.
func (b *Broker) Health() *health.Server { return b.health }

// closing reports whether Shutdown has begun.
func (b *Broker) closing() bool { return b.ctx != nil && b.ctx.Err() != nil }

// GRPCServer returns a gRPC server with the Queue service, health,
// reflection and the broker's logging, metrics and (with Config.Auth)
// authentication and authorization interceptors. For TLS pass
// grpc.Creds.
func (b *Broker) GRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	opts = append([]grpc.ServerOption{
		// Only authenticated calls prove a connection (limits.go): with
		// authentication on, a client without credentials cannot keep its
		// connection from being evicted by calling.
		grpc.ChainUnaryInterceptor(b.metrics.grpc.UnaryServerInterceptor(), b.gate.callUnary),
		grpc.ChainStreamInterceptor(b.metrics.grpc.StreamServerInterceptor(), b.gate.callStream),
		grpc.MaxRecvMsgSize(b.cfg.maxRequest()),
		grpc.StatsHandler(connEnds{b}), // a connection's end frees its place under MaxConnsPerIdentity
		grpc.MaxConcurrentStreams(uint32(b.cfg.MaxStreamsPerConn)),
		// The HTTP/2 handshake (preface and settings) must complete within
		// twice HandshakeTimeout, or the connection is closed; a
		// LimitListener closes (and counts) silent ones before.
		grpc.ConnectionTimeout(2 * b.cfg.HandshakeTimeout),
		// Find dead peers of long streams; close connections idle (no
		// call) for MaxConnectionIdle; let clients ping every 10s, and
		// close the connection of one that pings more often.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second,
			MaxConnectionIdle: b.cfg.MaxConnectionIdle}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.NumStreamWorkers(streamWorkers),
	}, opts...)
	s := grpc.NewServer(opts...)
	pb.RegisterQueueServer(s, b)
	pb.RegisterElectionServer(s, electionServer{b: b})
	pb.RegisterLockServer(s, lockServer{b: b})
	pb.RegisterCounterServer(s, counterServer{b: b})
	pb.RegisterSemaphoreServer(s, semaphoreServer{b: b})
	pb.RegisterBarrierServer(s, barrierServer{b: b})
	pb.RegisterDoubleBarrierServer(s, doubleBarrierServer{b: b})
	healthpb.RegisterHealthServer(s, b.health)
	reflection.Register(s)
	b.metrics.grpc.InitializeMetrics(s)
	return s
}

// Shutdown marks the broker NOT_SERVING, ends its Consume and JoinSync
// streams (releasing their unacknowledged leases for redelivery) and stops
// its loops. Unary calls keep working until Close, so a server can then
// drain them with GracefulStop. Shutdown is idempotent.
func (b *Broker) Shutdown() {
	b.health.Shutdown()
	b.cancel()
	b.sched.stop()
	b.wg.Wait()
}

// Stop is the whole shutdown of a broker serving on srv (a server from
// GRPCServer): Shutdown (NOT_SERVING, streams end and release their
// leases), then srv's GracefulStop, which drains the unary calls under
// way, cut short by Stop after timeout, then Close. serve and the tests
// stop brokers this way.
func (b *Broker) Stop(srv *grpc.Server, timeout time.Duration) {
	b.Shutdown()
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		srv.Stop()
		<-done
	}
	b.Close()
}

// Close shuts the broker down (see Shutdown) and closes its ZooKeeper
// sessions. Call it after the gRPC server's GracefulStop (or Stop) has
// returned or timed out.
func (b *Broker) Close() error {
	b.Shutdown()
	b.handles.givePacksBackAll() // after the unary calls, which may have buffered some
	b.batcher.Close()
	b.closeConns()
	b.log.Info("broker stopped")
	return nil
}

// Group commit: concurrent writes share Multi transactions, up to
// batchMaxOps ops and about batchMaxBytes each (with one request more, a
// Multi stays below jute.maxbuffer), batchWorkers of them in flight.
const (
	batchWorkers  = 4
	batchMaxOps   = 256
	batchMaxBytes = 400 << 10
	// recentBytes bounds the data of messages this broker published that
	// it keeps, for all queues together, so its consumers claim them
	// without reading them back.
	recentBytes = 64 << 20
)

// splitSessions divides the extra sessions between writers (half,
// rounded up) and readers. Without extra sessions the primary does all;
// with one, it writes and the primary reads.
func splitSessions(primary *zk.Conn, extra []*zk.Conn) (writers, readers []*zk.Conn) {
	if len(extra) == 0 {
		return []*zk.Conn{primary}, []*zk.Conn{primary}
	}
	w := (len(extra) + 1) / 2
	writers, readers = extra[:w], extra[w:]
	if len(readers) == 0 {
		readers = []*zk.Conn{primary}
	}
	return writers, readers
}

// closeConns closes the broker's sessions, the primary first.
func (b *Broker) closeConns() {
	for _, c := range append([]*zk.Conn{b.conn}, b.extra...) {
		c.Close()
	}
}

// streamCtx joins a stream's context with the broker's, so Close ends it.
func (b *Broker) streamCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(b.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// streamWorkers is the gRPC server's goroutines kept to run calls
// (grpc.NumStreamWorkers). A goroutine started for each call, as without
// them, grows its stack to the depth of a publish on every call: copying
// stacks took 10% of the broker's CPU on one-message publishes. A call
// that finds every worker busy (a long Consume stream holds one for its
// life) gets a goroutine of its own, as before.
const streamWorkers = 64

// The queues live in a zkqueue.Catalog under /<root>/queues: its layout,
// creation and two-step deletion are there, and it opens a queue's parts
// (zkqueue.Catalog.Open). Handles only read: a handle opened while its
// queue is being deleted cannot bring parts of it back.

// handles are the handles of the queues in use on this broker, by name,
// and what is done to all of them: loading, eviction when their queue
// changes, the periodic stats, giving back what packed queues buffered.
type handles struct {
	b *Broker

	queuesMu sync.Mutex
	queues   map[string]*queue
}

// queue is this broker's handle on one queue: its metadata and the shared
// zkqueue.Queue through which all local consumers take messages (the queue's
// dispatcher in this process). Handles are cached; a metadata watch
// evicts a handle when the queue is deleted or changed elsewhere (not
// when the broker's session is lost: zkqueue.Handles.Stale).
type queue struct {
	name   string
	h      *zkqueue.Handles // what the catalog opened: the parts below, and the queue's jobs (Run)
	path   string           // the queue's node (quota.go)
	meta   zkqueue.Spec
	label  string // metrics label
	items  *zkqueue.Queue
	leases *zkqueue.Leases
	sync   *syncGate // nil unless kind sync
	policy zkqueue.Policy
	used   atomic.Int64 // when a call or a scan last used the handle, unix ns

	depthMu   sync.Mutex
	depthN    int       // ready messages at depthRead
	depthRead time.Time // when depthN was read

	dataMu   sync.Mutex
	dataN    int64     // data bytes under the queue's node at dataRead (quota.go)
	dataRead time.Time // when dataN was read

	consumers *zkqueue.ConsumerGroup // the Consume streams on all brokers: registrations, rank

	delayed *zkqueue.Scheduled // the messages published with a delay (schedule.go)

	streams atomic.Int32 // this broker's Consume streams of the queue (packStream)

	aheadMu   sync.Mutex
	ahead     *ahead          // the messages claimed ahead for this broker's streams (ahead.go); nil without streams
	aheadGone <-chan struct{} // closed once the last ended buffer gave back its messages; nil: none yet
	recv      *receivers      // the buffer's attachment for Receive calls (ahead.go); nil: none
}

// published counts n messages this broker added into the cached depth.
func (q *queue) published(n int) {
	q.depthMu.Lock()
	q.depthN += n
	q.depthMu.Unlock()
}

// depthTTL is how long a read queue depth serves publishes. The limit is
// thereby approximate by what a queue takes in that time.
const depthTTL = 100 * time.Millisecond

// depth returns the queue's ready and delayed messages, read from the
// parents' Stats at most every depthTTL, plus what this broker published
// since.
func (q *queue) depth(ctx context.Context) (int, error) {
	q.depthMu.Lock()
	defer q.depthMu.Unlock()
	if time.Since(q.depthRead) < depthTTL {
		return q.depthN, nil
	}
	n, err := q.items.Len(ctx)
	if err != nil {
		return 0, err
	}
	delayed, err := q.delayed.Len(ctx)
	if err != nil {
		return 0, err
	}
	n += delayed
	q.depthN, q.depthRead = n, time.Now()
	return n, nil
}

// touch notes that the queue is in use on this broker (see runStats).
func (q *queue) touch() { q.used.Store(time.Now().UnixNano()) }

// idle reports whether the handle went unused for d.
func (q *queue) idle(d time.Duration) bool {
	return time.Since(time.Unix(0, q.used.Load())) > d
}

// stale reports whether the queue was deleted or changed under the
// handle (zkqueue.Handles.Stale): a lost session alone keeps it, so the
// Consume streams holding it and later calls share one handle.
func (q *queue) stale() bool { return q.h.Stale() }

// queue returns the handle of an existing queue; errQueueNotFound when
// there is none.
func (hs *handles) queue(ctx context.Context, name string) (*queue, error) {
	b := hs.b
	hs.queuesMu.Lock()
	q := hs.queues[name]
	hs.queuesMu.Unlock()
	if q != nil && !q.stale() {
		q.touch() // only valid names are ever cached
		return q, nil
	}
	if err := validName("queue name", name); err != nil {
		return nil, err
	}
	q, err := hs.loadQueue(name)
	if err != nil {
		return nil, err
	}
	q.touch()
	hs.queuesMu.Lock()
	defer hs.queuesMu.Unlock()
	if cur := hs.queues[name]; cur != nil && !cur.stale() {
		cur.touch()
		return cur, nil // another call loaded it first: share its Queue
	}
	hs.queues[name] = q
	b.sched.startSchedulers(q)
	return q, nil
}

// spec returns a queue's configuration: from its handle when this broker
// has one, else read, without opening a handle (listing many queues must
// not leave a handle and a watch per queue behind).
func (hs *handles) spec(name string) (zkqueue.Spec, error) {
	b := hs.b
	hs.queuesMu.Lock()
	q := hs.queues[name]
	hs.queuesMu.Unlock()
	if q != nil && !q.stale() {
		return q.meta, nil
	}
	return b.catalog.Info(name)
}

func (hs *handles) loadQueue(name string) (*queue, error) {
	b := hs.b
	label := b.metrics.labels.get(name)
	b.metrics.initQueue(label)
	conflicts := b.metrics.conflicts.WithLabelValues(label)
	bad := b.metrics.badNodes.WithLabelValues(label)
	expired := b.metrics.expired.WithLabelValues(label)
	packs := b.metrics.packSize.WithLabelValues(label)
	q := &queue{name: name, label: label}
	h, err := b.catalog.Open(name, zkqueue.OpenConfig{
		ProcessID: b.cfg.ID,
		Registry:  b.registry,
		Expired:   func(n int) { expired.Add(float64(n)) },
	},
		zkqueue.WithLimits(zkqueue.Limits{MaxPayload: b.cfg.MaxPayload, MaxBatchBytes: b.cfg.MaxBatchBytes, MaxBatchCount: b.cfg.MaxBatchCount}),
		zkqueue.WithConflictHook(conflicts.Inc),
		zkqueue.WithBadDataHook(func(string) { bad.Inc() }),
		zkqueue.WithPackHook(func(n int) { packs.Observe(float64(n)) }),
		zkqueue.WithCommitter(b.batcher),
		zkqueue.WithSegmentSize(b.cfg.SegmentSize),
		zkqueue.WithMemory(b.recent),
		zkqueue.WithReaders(b.readers...),
		// Every scan is a use: a queue whose consumers wait here is
		// served here. q.consumers and q.meta are set before q is shared.
		// A single-active queue has one consumer at a time: its whole
		// queue, in order, is the active stream's (active.go).
		zkqueue.WithOwners(func() zkqueue.Share {
			q.touch()
			if q.meta.SingleActive {
				return zkqueue.Share{Rank: 0, N: 1}
			}
			return q.consumers.Share()
		}),
		zkqueue.WithPublisher(b.cfg.ID),
		zkqueue.WithLogger(b.log.With("queue", name)),
	)
	if err != nil {
		return nil, err
	}
	q.h, q.path, q.meta, q.policy = h, h.Path, h.Spec, h.Spec.Policy()
	q.items, q.leases, q.delayed, q.consumers = h.Items, h.Leases, h.Delayed, h.Consumers
	if q.meta.Kind == kindSync {
		if q.sync, err = b.newSyncGate(h); err != nil {
			return nil, err
		}
	}
	return q, nil
}

// gone turns a NoNode from a queue's own nodes (lost races never get
// here) into errQueueNotFound: the queue was deleted under the handle.
func (hs *handles) gone(q *queue, err error) error {
	if errors.Is(err, zk.ErrNoNode) {
		hs.evict(q.name)
		return fmt.Errorf("%w: %s (deleted)", errQueueNotFound, q.name)
	}
	return err
}

func (hs *handles) evict(name string) {
	hs.queuesMu.Lock()
	delete(hs.queues, name)
	hs.queuesMu.Unlock()
}

// A handle unused for statsIdleAfter (no call, no scan by a local
// consumer) has its gauges refreshed only every statsIdleEvery-th
// interval: a broker that once served many queues does not keep reading
// all of them, while a backlog nobody consumes still shows.
const (
	statsIdleAfter = 5 * time.Minute
	statsIdleEvery = 10
)

// packHoldIdle: a packed queue without Consume streams here, unused this
// long, gets what its takes buffered given back at the next stats tick.
const packHoldIdle = time.Second

// runStats refreshes the queue gauges of the queues this broker has
// served, every StatsInterval (see statsIdleAfter). Reads only: Stats of
// two parents, and the head message of a queue that has one.
func (hs *handles) runStats() {
	b := hs.b
	defer b.wg.Done()
	t := time.NewTicker(b.cfg.StatsInterval)
	defer t.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		hs.queuesMu.Lock()
		qs := make([]*queue, 0, len(hs.queues))
		for name, q := range hs.queues {
			if q.stale() {
				delete(hs.queues, name) // deleted or changed: reloaded when used
				continue
			}
			qs = append(qs, q)
		}
		hs.queuesMu.Unlock()
		for _, q := range qs {
			if q.meta.Packed && q.streams.Load() == 0 && q.idle(packHoldIdle) {
				hs.givePacksBack(q) // what Receive calls claimed and did not take
			}
			if q.label == OtherQueue || (q.idle(statsIdleAfter) && tick%statsIdleEvery != 0) {
				continue
			}
			n, err := q.items.Len(b.ctx)
			if err == nil {
				b.metrics.depth.WithLabelValues(q.label).Set(float64(n))
			}
			if n, err := q.leases.InFlight(b.ctx); err == nil {
				b.metrics.inFlight.WithLabelValues(q.label).Set(float64(n))
			}
			if n, err := q.leases.DeadCount(b.ctx); err == nil {
				b.metrics.dead.WithLabelValues(q.label).Set(float64(n))
			}
			if n == 0 && err == nil {
				b.metrics.oldestAge.WithLabelValues(q.label).Set(0)
			} else if age, err := q.items.OldestAge(b.ctx); err == nil {
				b.metrics.oldestAge.WithLabelValues(q.label).Set(age.Seconds())
			}
		}
	}
}

// zkResult names a ZooKeeper request's outcome for the result label.
func zkResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, zk.ErrNoNode):
		return "no_node"
	case errors.Is(err, zk.ErrBadVersion):
		return "bad_version"
	case errors.Is(err, zk.ErrNodeExists):
		return "node_exists"
	case zkutil.IsUnavailable(err):
		return "unavailable"
	}
	return "error"
}

// observeZK records one ZooKeeper request of a queue's zkqueue.Queue.
func (hs *handles) observeZK(op string, d time.Duration, err error) {
	b := hs.b
	if op == "commit" {
		b.metrics.zkCommit.WithLabelValues(zkResult(err)).Observe(d.Seconds())
		return
	}
	b.metrics.zkDuration.WithLabelValues(op, zkResult(err)).Observe(d.Seconds())
}

// packStream counts a Consume stream of q; the function it returns, run
// when the stream ended (after releaseHeld), gives back what q's packed
// takes claimed and did not hand out (zkqueue's pack buffer) once the last
// stream of q on this broker ended, so the messages wait at their places
// rather than in this broker.
func (hs *handles) packStream(q *queue) func() {
	q.streams.Add(1)
	return func() {
		if q.streams.Add(-1) == 0 && q.meta.Packed {
			hs.givePacksBack(q)
		}
	}
}

// givePacksBackAll gives back what the packed queues' takes buffered.
func (hs *handles) givePacksBackAll() {
	hs.queuesMu.Lock()
	var qs []*queue
	for _, q := range hs.queues {
		if q.meta.Packed {
			qs = append(qs, q)
		}
	}
	hs.queuesMu.Unlock()
	for _, q := range qs {
		hs.givePacksBack(q)
	}
}

// givePacksBack gives back what q's packed takes claimed and did not hand
// out, with its own bounded context (it also runs at shutdown).
func (hs *handles) givePacksBack(q *queue) {
	b := hs.b
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	q.leases.Flush(ctx)
	if err := q.items.Flush(ctx); err != nil {
		b.log.Warn("giving back buffered messages failed", "queue", q.name, "err", err)
	}
}
