package natsbridge

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrInvalidConfig is wrapped by the errors New returns for a bad Config.
var ErrInvalidConfig = errors.New("natsbridge: invalid config")

// ErrClosed is returned by Close when the Bridge is already closed.
var ErrClosed = errors.New("natsbridge: bridge closed")

// Defaults applied by New to zero Config fields.
const (
	DefaultSubjectPrefix    = "qbroker"
	DefaultBufferSize       = 8192
	DefaultMaxPayload       = 64 << 10
	DefaultReconnectWait    = 2 * time.Second
	DefaultReconnectBufSize = 4 << 20
	DefaultStream           = "QBROKER_EVENTS"
	DefaultDuplicateWindow  = 2 * time.Minute
	DefaultStreamMaxAge     = 24 * time.Hour
	DefaultAckTimeout       = 5 * time.Second
	DefaultMaxAckPending    = 4096
)

// Config configures a Bridge. Zero fields take the defaults above.
type Config struct {
	// URL is the NATS server URL (or a comma-separated list), the broker's
	// nats-url flag. Required.
	URL string
	// Auth holds the credentials and TLS settings (auth.go); zero: none.
	Auth Auth
	// SubjectPrefix is the first token(s) of every subject; default
	// "qbroker". It may contain dots but no wildcards or spaces.
	SubjectPrefix string
	// BufferSize is the number of events held between Emit and the
	// publisher goroutine; default 8192. When it is full, Emit drops.
	BufferSize int
	// IncludePayload adds the message body to the event JSON when it is at
	// most MaxPayload bytes (default 64 KiB); larger payloads are omitted
	// (the event's size field still tells the size).
	IncludePayload bool
	MaxPayload     int

	// JetStream publishes through JetStream into Stream (default
	// "QBROKER_EVENTS") with the event ID as Nats-Msg-Id. A missing stream
	// is created with subjects "<prefix>.>", file storage, DuplicateWindow
	// (default 2m) and StreamMaxAge (default 24h); an existing stream is
	// used as it is.
	JetStream       bool
	Stream          string
	DuplicateWindow time.Duration
	StreamMaxAge    time.Duration
	// AckTimeout bounds the wait for a JetStream publish ack (default 5s);
	// MaxAckPending bounds the publishes awaiting an ack (default 4096).
	AckTimeout    time.Duration
	MaxAckPending int

	// ReconnectWait is the pause between reconnect attempts (default 2s).
	ReconnectWait time.Duration
	// ReconnectBufSize is the nats.go buffer (bytes) that holds publishes
	// while disconnected (default 4 MiB); past it publishes fail and the
	// events are counted as dropped with reason publish_error.
	ReconnectBufSize int

	// Registerer receives the bridge's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger receives connection state changes; nil discards.
	Logger *slog.Logger
	// BrokerID fills Event.Broker when the event has none, and names the
	// NATS connection.
	BrokerID string
}

func (c Config) withDefaults() Config {
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if c.BufferSize == 0 {
		c.BufferSize = DefaultBufferSize
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.StreamMaxAge == 0 {
		c.StreamMaxAge = DefaultStreamMaxAge
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = DefaultMaxAckPending
	}
	if c.ReconnectWait == 0 {
		c.ReconnectWait = DefaultReconnectWait
	}
	if c.ReconnectBufSize == 0 {
		c.ReconnectBufSize = DefaultReconnectBufSize
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case strings.TrimSpace(c.URL) == "":
		return bad("URL is empty")
	case !validPrefix(c.SubjectPrefix):
		return bad("subject prefix %q: want dot-separated non-empty tokens without '*', '>' or spaces", c.SubjectPrefix)
	case c.BufferSize < 1:
		return bad("buffer size %d < 1", c.BufferSize)
	case c.MaxPayload < 0:
		return bad("max payload %d < 0", c.MaxPayload)
	case c.ReconnectWait < 0:
		return bad("reconnect wait %v < 0", c.ReconnectWait)
	case c.ReconnectBufSize < 0:
		return bad("reconnect buffer size %d < 0", c.ReconnectBufSize)
	}
	if err := c.Auth.validate(); err != nil {
		return err
	}
	if c.JetStream {
		switch {
		case !validStreamName(c.Stream):
			return bad("stream name %q: want no '.', '*', '>', '/', '\\' or spaces", c.Stream)
		case c.DuplicateWindow < 0:
			return bad("duplicate window %v < 0", c.DuplicateWindow)
		case c.StreamMaxAge < 0:
			return bad("stream max age %v < 0", c.StreamMaxAge)
		case c.StreamMaxAge > 0 && c.DuplicateWindow > c.StreamMaxAge:
			return bad("duplicate window %v > stream max age %v", c.DuplicateWindow, c.StreamMaxAge)
		case c.AckTimeout < 0:
			return bad("ack timeout %v < 0", c.AckTimeout)
		case c.MaxAckPending < 1:
			return bad("max ack pending %d < 1", c.MaxAckPending)
		}
	}
	return nil
}

func validPrefix(p string) bool {
	for tok := range strings.SplitSeq(p, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return false
		}
	}
	return true
}

func validStreamName(s string) bool {
	return s != "" && !strings.ContainsAny(s, ".*>/\\ \t\r\n")
}
