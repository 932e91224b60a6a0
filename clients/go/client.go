package qbroker

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// Client talks to one or more qbroker brokers over one gRPC channel. The
// channel reconnects by itself; calls are spread over the brokers
// round-robin.
//
// A Client is safe for concurrent use. Close it when done.
type Client struct {
	conn   *grpc.ClientConn
	rpc    pb.QueueClient
	health healthpb.HealthClient
	elect  pb.ElectionClient
	locks  pb.LockClient
	count  pb.CounterClient
	sems   pb.SemaphoreClient
	opts   options
}

// Option configures Dial.
type Option func(*options)

type options struct {
	addrs       []string
	dialOpts    []grpc.DialOption
	callTimeout time.Duration
	waitReady   bool
	minBackoff  time.Duration
	maxBackoff  time.Duration
	tls         *tls.Config                           // nil: no TLS (security.go)
	token       string                                // bearer token; needs tls
	tokenSource func(context.Context) (string, error) // or this; needs tls
	optErr      error                                 // an option that failed (WithTLSFiles)

	publishRetries int  // dedup.go
	autoDedup      bool // WithPublishRetries: generate missing dedup ids
}

func defaultOptions() options {
	return options{
		minBackoff:     100 * time.Millisecond,
		maxBackoff:     5 * time.Second,
		publishRetries: defaultPublishRetries,
	}
}

// WithAddrs adds broker addresses (host:port) to the ones given to Dial.
func WithAddrs(addrs ...string) Option {
	return func(o *options) { o.addrs = append(o.addrs, addrs...) }
}

// WithDialOptions passes options to grpc.NewClient after the client's own
// (transport credentials: insecure, or WithTLS's; the round-robin and
// retry service config, a 100ms..5s reconnect backoff), so they can
// override them.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// WithCallTimeout bounds every unary call whose context has no deadline
// (Receive gets its wait on top). Zero, the default, leaves calls bounded
// by their context only. Streams (Consume, JoinSync) are not bounded.
func WithCallTimeout(d time.Duration) Option {
	return func(o *options) { o.callTimeout = d }
}

// WithWaitConnected makes Dial wait until a connection to a broker is
// ready, or ctx ends. By default Dial does not wait: the first call
// connects.
func WithWaitConnected() Option {
	return func(o *options) { o.waitReady = true }
}

// WithReconnectBackoff sets the bounds of the exponential backoff between
// a Consumer's re-subscribe attempts and between connection attempts;
// defaults 100ms and 5s.
func WithReconnectBackoff(lo, hi time.Duration) Option {
	return func(o *options) { o.minBackoff, o.maxBackoff = lo, hi }
}

// serviceName is the gRPC service, for the service config.
const serviceName = "qbroker.v1.Queue"

// retriedMethods are the unary calls that are safe to repeat when a broker
// is unavailable: reads, CreateQueue (idempotent by contract) and
// ExtendLease (sets the deadline from now). Publish, Receive, Ack, Nack,
// Purge, DeleteQueue and Redrive are not: repeating one that took effect
// would publish twice, lose a message or report a spurious error.
var retriedMethods = []string{"GetQueue", "ListQueues", "Stats", "ListDeadLetters", "CreateQueue", "ExtendLease"}

func serviceConfig() string {
	names := make([]string, len(retriedMethods))
	for i, m := range retriedMethods {
		names[i] = fmt.Sprintf(`{"service":%q,"method":%q}`, serviceName, m)
	}
	return `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "methodConfig": [{
    "name": [` + strings.Join(names, ",") + `],
    "retryPolicy": {
      "maxAttempts": 5,
      "initialBackoff": "0.1s",
      "maxBackoff": "2s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`
}

// Dial returns a client of the brokers at addr: one host:port, a
// comma-separated list of them, or a gRPC target URI such as
// "dns:///brokers.example:7070". More addresses can be added with
// WithAddrs. Dial does not wait for a connection unless WithWaitConnected
// is given; then ctx bounds the wait.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	o := defaultOptions()
	for _, a := range strings.Split(addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			o.addrs = append(o.addrs, a)
		}
	}
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.addrs) == 0 {
		return nil, errorf("qbroker: dial: no broker address: %w", ErrInvalidArgument)
	}
	if o.optErr != nil {
		return nil, errorf("qbroker: dial: %w: %w", o.optErr, ErrInvalidArgument)
	}
	sec, err := o.securityOptions()
	if err != nil {
		return nil, errorf("qbroker: dial: %w: %w", err, ErrInvalidArgument)
	}
	if o.minBackoff <= 0 || o.maxBackoff < o.minBackoff {
		return nil, errorf("qbroker: dial: bad reconnect backoff %v..%v: %w", o.minBackoff, o.maxBackoff, ErrInvalidArgument)
	}
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(serviceConfig()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: o.minBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: o.maxBackoff},
			MinConnectTimeout: 5 * time.Second,
		}),
		// Notice a broker that vanished without closing the connection
		// (the broker permits pings every 10s).
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
	}
	target := o.addrs[0]
	switch {
	case len(o.addrs) == 1 && strings.Contains(target, "://"):
		// A target URI: its resolver (dns, unix, ...) does the work.
	default:
		for _, a := range o.addrs {
			if strings.Contains(a, "://") {
				return nil, errorf("qbroker: dial: target URI %q cannot be combined with other addresses: %w", a, ErrInvalidArgument)
			}
		}
		// A static resolver of our own, registered for this channel only.
		rb := &staticBuilder{addrs: o.addrs}
		target = staticScheme + ":///qbroker"
		dialOpts = append(dialOpts, grpc.WithResolvers(rb))
	}
	dialOpts = append(dialOpts, sec...)
	hints := newTLSHinter(&o)
	dialOpts = append(dialOpts, grpc.WithChainUnaryInterceptor(hints.unary), grpc.WithChainStreamInterceptor(hints.stream))
	dialOpts = append(dialOpts, o.dialOpts...)
	conn, err := grpc.NewClient(target, dialOpts...)
	if err != nil {
		return nil, errorf("qbroker: dial %s: %w", strings.Join(o.addrs, ","), err)
	}
	c := &Client{conn: conn, rpc: pb.NewQueueClient(conn), health: healthpb.NewHealthClient(conn), elect: pb.NewElectionClient(conn),
		locks: pb.NewLockClient(conn), count: pb.NewCounterClient(conn), sems: pb.NewSemaphoreClient(conn), opts: o}
	if o.waitReady {
		if err := c.waitReady(ctx); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return c, nil
}

// waitReady waits until the channel is READY or ctx ends.
func (c *Client) waitReady(ctx context.Context) error {
	c.conn.Connect()
	for {
		s := c.conn.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if s == connectivity.Shutdown {
			return errorf("qbroker: dial: %w", ErrClosed)
		}
		if !c.conn.WaitForStateChange(ctx, s) {
			return errorf("qbroker: dial %s: no broker ready (%w): %w", strings.Join(c.opts.addrs, ","), ErrUnavailable, ctx.Err())
		}
	}
}

// Close closes the connection. Consumers and memberships of the client
// end; calls in flight fail.
func (c *Client) Close() error {
	return c.conn.Close()
}

// Ping makes one round trip to a broker (a gRPC health check, which
// needs no credentials) and reports whether it serves: nil when it does;
// an error matching ErrUnavailable when no broker answers or the one that
// did has lost ZooKeeper (or is shutting down).
func (c *Client) Ping(ctx context.Context) error {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	r, err := c.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return errorf("qbroker: ping: %w", convErr(err))
	}
	if s := r.GetStatus(); s != healthpb.HealthCheckResponse_SERVING {
		return errorf("qbroker: ping: broker reports %s: %w", s, ErrUnavailable)
	}
	return nil
}

// callCtx applies the call timeout to a context without a deadline.
func (c *Client) callCtx(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	if c.opts.callTimeout <= 0 {
		return ctx, func() {}
	}
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.opts.callTimeout+extra)
}

// staticScheme names the per-channel static resolver.
const staticScheme = "qbroker-static"

// staticBuilder resolves to a fixed list of addresses. It is registered
// per channel with grpc.WithResolvers, so clients with different lists
// never share it.
type staticBuilder struct{ addrs []string }

func (b *staticBuilder) Scheme() string { return staticScheme }

func (b *staticBuilder) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	st := resolver.State{}
	for _, a := range b.addrs {
		// The address's host is the name its TLS certificate must carry
		// (the channel's own authority, "qbroker", names no broker).
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			host = a
		}
		st.Addresses = append(st.Addresses, resolver.Address{Addr: a, ServerName: host})
	}
	// An error here means the LB policy rejected the list; a static list
	// cannot do better, and calls report the policy's error.
	_ = cc.UpdateState(st)
	return staticResolver{}, nil
}

// staticResolver has nothing to re-resolve: addresses are fixed, and the
// channel reconnects to them by itself.
type staticResolver struct{}

func (staticResolver) ResolveNow(resolver.ResolveNowOptions) {}
func (staticResolver) Close()                                {}
