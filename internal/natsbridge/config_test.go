package natsbridge

import (
	"errors"
	"testing"
	"time"

	"github.com/qbroker/qbroker/internal/events"
)

func TestSubjectToken(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"orders", "orders"},
		{"orders.eu", "orders~eu"},
		{"orders_eu", "orders_eu"},
		{"a.b.c", "a~b~c"},
		{"A-z_0.9", "A-z_0~9"},
		{"..", "~~"},
		{"", "%"},
		{"x*>y z", "x%2A%3Ey%20z"},
		{"tab\there", "tab%09here"},
		{"a~b", "a%7Eb"},
		{"100%", "100%25"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := SubjectToken(tt.in); got != tt.want {
				t.Errorf("SubjectToken(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// SubjectToken is one to one: distinct queue names (or any strings) never
// share a subject token.
func TestSubjectTokenInjective(t *testing.T) {
	alphabet := []string{"a", ".", "_", "-", "~", "%", "*", " ", "7E", "2E"}
	seen := map[string]string{}
	var walk func(s string, depth int)
	walk = func(s string, depth int) {
		tok := SubjectToken(s)
		if other, ok := seen[tok]; ok && other != s {
			t.Fatalf("SubjectToken(%q) = SubjectToken(%q) = %q", s, other, tok)
		}
		seen[tok] = s
		if depth == 0 {
			return
		}
		for _, c := range alphabet {
			walk(s+c, depth-1)
		}
	}
	walk("", 4)
	if a, b := Subject("qbroker", "orders.eu", events.Published), Subject("qbroker", "orders_eu", events.Published); a == b {
		t.Fatalf("orders.eu and orders_eu share the subject %s", a)
	}
}

func TestSubject(t *testing.T) {
	tests := []struct {
		prefix, queue string
		kind          events.Kind
		want          string
	}{
		{"qbroker", "orders", events.Published, "qbroker.orders.published"},
		{"qbroker", "orders.eu", events.DeadLettered, "qbroker.orders~eu.dead_lettered"},
		{"qbroker", "orders_eu", events.DeadLettered, "qbroker.orders_eu.dead_lettered"},
		{"qbroker.prod", "jobs", events.SyncOpened, "qbroker.prod.jobs.sync_opened"},
	}
	for _, tt := range tests {
		if got := Subject(tt.prefix, tt.queue, tt.kind); got != tt.want {
			t.Errorf("Subject(%q, %q, %q) = %q, want %q", tt.prefix, tt.queue, tt.kind, got, tt.want)
		}
	}
}

func TestEventSubject(t *testing.T) {
	tests := []struct {
		e    events.Event
		want string
	}{
		{events.Event{Queue: "orders", Kind: events.Acked}, "qbroker.orders.acked"},
		{events.Event{Lock: "db.main", Kind: events.LockGranted}, "qbroker.lock.db~main.lock_granted"},
		{events.Event{Election: "sched", Kind: events.LeaderEnded}, "qbroker.election.sched.leader_ended"},
		{events.Event{Counter: "hits.eu", Kind: events.CounterChanged}, "qbroker.counter.hits~eu.counter_changed"},
		{events.Event{Semaphore: "db.pool", Kind: events.SemaphoreGranted}, "qbroker.semaphore.db~pool.semaphore_granted"},
		{events.Event{Barrier: "deploy.eu", Kind: events.BarrierRemoved}, "qbroker.barrier.deploy~eu.barrier_removed"},
		{events.Event{DoubleBarrier: "round", Kind: events.DoubleBarrierEntered}, "qbroker.double_barrier.round.double_barrier_entered"},
	}
	for _, tt := range tests {
		if got := EventSubject("qbroker", &tt.e); got != tt.want {
			t.Errorf("EventSubject(%+v) = %q, want %q", tt.e, got, tt.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{URL: "nats://127.0.0.1:4222"}
	tests := []struct {
		name    string
		mod     func(*Config)
		wantErr bool
	}{
		{"defaults", func(*Config) {}, false},
		{"jetstream defaults", func(c *Config) { c.JetStream = true }, false},
		{"no url", func(c *Config) { c.URL = " " }, true},
		{"prefix with dots", func(c *Config) { c.SubjectPrefix = "qbroker.prod" }, false},
		{"prefix wildcard", func(c *Config) { c.SubjectPrefix = "qbroker.*" }, true},
		{"prefix full wildcard", func(c *Config) { c.SubjectPrefix = ">" }, true},
		{"prefix empty token", func(c *Config) { c.SubjectPrefix = "a..b" }, true},
		{"prefix trailing dot", func(c *Config) { c.SubjectPrefix = "a." }, true},
		{"prefix space", func(c *Config) { c.SubjectPrefix = "a b" }, true},
		{"negative buffer", func(c *Config) { c.BufferSize = -1 }, true},
		{"negative max payload", func(c *Config) { c.MaxPayload = -1 }, true},
		{"negative reconnect wait", func(c *Config) { c.ReconnectWait = -time.Second }, true},
		{"stream with dot", func(c *Config) { c.JetStream = true; c.Stream = "a.b" }, true},
		{"stream with dot, core mode", func(c *Config) { c.Stream = "a.b" }, false},
		{"duplicate window over max age", func(c *Config) {
			c.JetStream = true
			c.DuplicateWindow = time.Hour
			c.StreamMaxAge = time.Minute
		}, true},
		{"negative max ack pending", func(c *Config) { c.JetStream = true; c.MaxAckPending = -1 }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mod(&c)
			err := c.withDefaults().validate()
			if (err != nil) != tt.wantErr {
				t.Fatalf("validate() = %v, want error %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("validate() = %v, want it to wrap ErrInvalidConfig", err)
			}
		})
	}
}

func TestNewInvalidConfig(t *testing.T) {
	if _, err := New(Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New(Config{}) error = %v, want ErrInvalidConfig", err)
	}
}
