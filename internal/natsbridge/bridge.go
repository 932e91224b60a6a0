package natsbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/qbroker/qbroker/internal/events"
)

// failureLogInterval bounds how often a publish failure is logged: failures
// come per event, logs should not.
const failureLogInterval = 30 * time.Second

// Bridge publishes queue events to NATS. It implements events.Sink. It is
// safe for concurrent use: Emit may be called from any number of
// goroutines, concurrently with Close.
type Bridge struct {
	cfg    Config
	prefix string
	log    *slog.Logger
	nc     *nats.Conn
	js     jetstream.JetStream // nil in core NATS mode
	m      *metrics

	mu     sync.RWMutex // guards closed and the sends on ch, so Close can close ch
	closed bool
	ch     chan events.Event

	stop       context.Context // cancelled when Close gives up draining
	cancelStop context.CancelFunc
	done       chan struct{} // closed when run returns

	connected    chan struct{} // signalled (never blocking) on every (re)connect
	ncClosed     chan struct{} // closed by nats.go's ClosedHandler
	ncClosedOnce sync.Once

	sent       atomic.Uint64
	dropFull   atomic.Uint64
	dropPub    atomic.Uint64
	dropClosed atomic.Uint64

	failing  atomic.Bool
	lastWarn atomic.Int64 // unix nanoseconds of the last failure log

	// JetStream mode.
	streamReady atomic.Bool
	lastEnsure  time.Time // owned by run
	inflightMu  sync.Mutex
	inflight    map[*nats.Msg]events.Kind // published, awaiting the ack
}

var _ events.Sink = (*Bridge)(nil)

// New connects to NATS and starts the bridge's publisher goroutine. It does
// not wait for NATS: when the server is down, New succeeds and the
// connection keeps retrying in the background (in core mode, events emitted
// meanwhile are buffered by nats.go up to Config.ReconnectBufSize, then
// dropped; see the package doc for JetStream mode). In JetStream mode the
// stream is looked up, or created, on every (re)connect.
//
// New fails with an error wrapping ErrInvalidConfig on a bad Config, and
// with other errors on a URL nats.go rejects or when the metrics cannot be
// registered on Config.Registerer (one Bridge per registry). Call Close to
// release the Bridge.
func New(cfg Config) (*Bridge, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Bridge{
		cfg:       cfg,
		prefix:    cfg.SubjectPrefix,
		log:       cfg.Logger.With("component", "natsbridge"),
		m:         newMetrics(),
		ch:        make(chan events.Event, cfg.BufferSize),
		done:      make(chan struct{}),
		connected: make(chan struct{}, 1),
		ncClosed:  make(chan struct{}),
		inflight:  make(map[*nats.Msg]events.Kind),
	}
	name := "qbroker-events"
	if cfg.BrokerID != "" {
		name += "-" + cfg.BrokerID
	}
	authOpts, err := cfg.Auth.options()
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(cfg.URL, append(authOpts,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(cfg.ReconnectWait),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectBufSize(cfg.ReconnectBufSize),
		nats.ConnectHandler(func(nc *nats.Conn) {
			b.log.Info("nats connected", "url", nc.ConnectedUrlRedacted())
			b.signalConnected()
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				b.log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			b.m.reconnects.Inc()
			b.log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
			b.signalConnected()
		}),
		nats.ClosedHandler(func(*nats.Conn) {
			b.ncClosedOnce.Do(func() { close(b.ncClosed) })
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			b.log.Warn("nats error", "err", err)
		}),
	)...)
	if err != nil {
		// The URL is left out: it may hold credentials.
		return nil, fmt.Errorf("natsbridge: connect: %w", err)
	}
	b.nc = nc
	if cfg.JetStream {
		js, err := jetstream.New(nc,
			jetstream.WithPublishAsyncMaxPending(cfg.MaxAckPending),
			jetstream.WithPublishAsyncTimeout(cfg.AckTimeout),
			jetstream.WithPublishAsyncAckHandler(b.onAck),
			jetstream.WithPublishAsyncErrHandler(b.onAckErr),
		)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("natsbridge: jetstream: %w", err)
		}
		b.js = js
	}
	if err := b.m.register(cfg.Registerer, nc); err != nil {
		nc.Close()
		return nil, err
	}
	b.stop, b.cancelStop = context.WithCancel(context.Background())
	go b.run()
	return b, nil
}

// Emit enqueues e for publishing and returns at once. It never blocks on
// NATS and never fails: when the buffer is full the event is dropped
// (reason buffer_full), and after Close it is dropped (reason closed).
// An empty e.Broker is set to Config.BrokerID and a zero e.Time to now.
// The payload is kept (copied) only when Config.IncludePayload is set and it
// is at most Config.MaxPayload bytes; the message's content type and
// headers only when Config.IncludePayload is set.
func (b *Bridge) Emit(e events.Event) {
	if e.Broker == "" {
		e.Broker = b.cfg.BrokerID
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if e.Payload != nil {
		if b.cfg.IncludePayload && len(e.Payload) <= b.cfg.MaxPayload {
			e.Payload = bytes.Clone(e.Payload)
		} else {
			e.Payload = nil
		}
	}
	if b.cfg.IncludePayload {
		e.Headers = maps.Clone(e.Headers)
	} else {
		e.ContentType, e.Headers = "", nil
	}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		b.drop(ReasonClosed)
		return
	}
	select {
	case b.ch <- e:
		b.mu.RUnlock()
	default:
		b.mu.RUnlock()
		b.drop(ReasonBufferFull)
	}
}

// Stats returns the number of events sent (handed to the NATS client in
// core mode; acknowledged by the stream in JetStream mode) and dropped (all
// reasons). After Close returns, sent+dropped equals the number of Emit
// calls.
func (b *Bridge) Stats() (sent, dropped uint64) {
	return b.sent.Load(), b.dropFull.Load() + b.dropPub.Load() + b.dropClosed.Load()
}

// Connected reports whether the NATS connection is up.
func (b *Bridge) Connected() bool {
	return b.nc.IsConnected()
}

// Close stops accepting events, publishes what is buffered, waits for the
// outstanding JetStream acks, flushes and drains the NATS connection, and
// stops the publisher goroutine. When ctx ends first, the events not yet
// sent are dropped (reason closed), the connection is closed at once and
// Close returns an error wrapping ctx.Err(); the goroutine has stopped
// either way. A second Close returns ErrClosed.
func (b *Bridge) Close(ctx context.Context) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	b.closed = true
	close(b.ch)
	b.mu.Unlock()

	var ctxErr error
	select {
	case <-b.done:
	case <-ctx.Done():
		ctxErr = ctx.Err()
		b.cancelStop() // run drops the rest
		b.nc.Close()   // and no publish waits on a slow socket
		<-b.done
	}
	if b.js != nil && ctxErr == nil {
		select {
		case <-b.js.PublishAsyncComplete():
		case <-ctx.Done():
			ctxErr = ctx.Err()
		}
	}
	if ctxErr == nil {
		// Drain flushes the publishes; while reconnecting it closes at once.
		_ = b.nc.Drain()
		select {
		case <-b.ncClosed:
		case <-ctx.Done():
			ctxErr = ctx.Err()
		}
	}
	b.nc.Close()
	b.cancelStop()
	b.dropInflight()

	sent, dropped := b.Stats()
	b.log.Info("nats event bridge closed", "sent", sent, "dropped", dropped)
	if ctxErr != nil {
		return fmt.Errorf("natsbridge: close: %w", ctxErr)
	}
	return nil
}

// signalConnected wakes run after a (re)connect, without blocking nats.go's
// callback goroutine.
func (b *Bridge) signalConnected() {
	select {
	case b.connected <- struct{}{}:
	default:
	}
}

// run publishes the buffered events until Close closes the buffer. In
// JetStream mode it also makes sure of the stream after every (re)connect:
// the server may have come back without it.
func (b *Bridge) run() {
	defer close(b.done)
	for {
		select {
		case e, ok := <-b.ch:
			if !ok {
				return
			}
			if b.stop.Err() != nil || !b.waitConnected() {
				b.drop(ReasonClosed)
				continue
			}
			b.publish(e)
		case <-b.connected:
			if b.js != nil && b.stop.Err() == nil {
				b.maybeEnsureStream(true)
			}
		}
	}
}

// waitConnected holds a core-mode publish while NATS is unreachable, so
// events wait in the bridge's own bounded buffer (and overflow there,
// counted as buffer_full) instead of in nats.go's reconnect buffer, whose
// contents are lost uncounted if the connection closes. It returns false
// when Close gave up on the remaining events.
func (b *Bridge) waitConnected() bool {
	if b.js != nil {
		return true // JetStream acks account for every event
	}
	for !b.nc.IsConnected() {
		b.mu.RLock()
		closing := b.closed
		b.mu.RUnlock()
		if closing {
			return false // nothing will take them: drop, don't hold up Close
		}
		select {
		case <-b.connected:
		case <-b.stop.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

func (b *Bridge) publish(e events.Event) {
	data, err := b.encode(&e)
	if err != nil {
		b.publishFailed(e.Kind, err)
		return
	}
	subj := EventSubject(b.prefix, &e)
	if b.js == nil {
		if err := b.nc.Publish(subj, data); err != nil {
			b.publishFailed(e.Kind, err)
			return
		}
		b.sent.Add(1)
		b.m.publishedInc(e.Kind)
		b.failing.Store(false)
		return
	}

	if !b.streamReady.Load() {
		b.maybeEnsureStream(false)
	}
	msg := &nats.Msg{Subject: subj, Data: data}
	if e.ID != "" {
		msg.Header = nats.Header{jetstream.MsgIDHeader: []string{e.ID}}
	}
	// Tracked before publishing: the ack may arrive before PublishMsgAsync
	// returns.
	b.inflightMu.Lock()
	b.inflight[msg] = e.Kind
	b.inflightMu.Unlock()
	if _, err := b.js.PublishMsgAsync(msg); err != nil {
		b.resolve(msg, err)
	}
}

// encode returns e's JSON body. A body over the server's max_payload is
// encoded again without the message payload.
func (b *Bridge) encode(e *events.Event) ([]byte, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("natsbridge: encode event: %w", err)
	}
	if mp := b.nc.MaxPayload(); mp > 0 && int64(len(data)) > mp-1024 && (e.Payload != nil || e.Headers != nil) {
		e.Payload, e.Headers = nil, nil
		if data, err = json.Marshal(e); err != nil {
			return nil, fmt.Errorf("natsbridge: encode event: %w", err)
		}
	}
	return data, nil
}

func (b *Bridge) drop(reason string) {
	switch reason {
	case ReasonBufferFull:
		b.dropFull.Add(1)
		b.m.dropFull.Inc()
	case ReasonPublishError:
		b.dropPub.Add(1)
		b.m.dropPub.Inc()
	default:
		b.dropClosed.Add(1)
		b.m.dropClosed.Inc()
	}
}

// publishFailed counts a publish error and logs it.
func (b *Bridge) publishFailed(kind events.Kind, err error) {
	b.drop(ReasonPublishError)
	b.logFailure(kind, err)
}

// logFailure logs the first publish error of a series, at most once per
// failureLogInterval.
func (b *Bridge) logFailure(kind events.Kind, err error) {
	if !b.failing.CompareAndSwap(false, true) {
		return
	}
	now := time.Now().UnixNano()
	last := b.lastWarn.Load()
	if now-last >= int64(failureLogInterval) && b.lastWarn.CompareAndSwap(last, now) {
		b.log.Warn("publishing events fails, dropping them", "event", kind, "err", err)
	}
}
