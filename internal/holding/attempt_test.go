package holding

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errTestClosed = errors.New("test: closed")

func newTestBackground(reapOnce func(string) error) *Background {
	return NewBackground(nil, slog.New(slog.DiscardHandler), errTestClosed, reapOnce)
}

func TestPaceRetry(t *testing.T) {
	errOther := errors.New("bad version")
	cases := []struct {
		name      string
		err       error
		stale     bool // ZooKeeper has not answered for longer than NoContactLimit
		cancelled bool
		closed    bool
		want      []error // nil: Retry returns nil after its backoff
	}{
		{name: "not transient", err: errOther, want: []error{errOther}},
		{name: "closing", err: zk.ErrClosing, want: []error{zk.ErrClosing}},
		{name: "transient", err: zk.ErrConnectionClosed},
		{name: "no contact", err: zk.ErrConnectionClosed, stale: true, want: []error{zk.ErrConnectionClosed}},
		{name: "ctx ended", err: zk.ErrConnectionClosed, cancelled: true, want: []error{zk.ErrConnectionClosed, context.Canceled}},
		{name: "closed", err: zk.ErrNoServer, closed: true, want: []error{zk.ErrNoServer, errTestClosed}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newTestBackground(nil)
			defer b.Close()
			if c.closed {
				b.Close()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.cancelled {
				cancel()
			}
			p := NewPace()
			if c.stale {
				p.contact = time.Now().Add(-NoContactLimit - time.Second)
			}
			got := p.Retry(ctx, b, c.err)
			if c.want == nil {
				if got != nil {
					t.Fatalf("got %v, want nil", got)
				}
				if p.backoff != 2*RetryMin {
					t.Fatalf("got backoff %v, want %v", p.backoff, 2*RetryMin)
				}
				p.Answered()
				if p.backoff != RetryMin {
					t.Fatalf("after Answered: got backoff %v, want %v", p.backoff, RetryMin)
				}
				return
			}
			for _, w := range c.want {
				if !errors.Is(got, w) {
					t.Fatalf("got %v, want an error matching %v", got, w)
				}
			}
		})
	}
}

func TestBackgroundClose(t *testing.T) {
	b := newTestBackground(func(string) error {
		t.Error("reap after Close")
		return nil
	})
	ctx, cancel := b.WithClose(context.Background())
	defer cancel()
	if b.Closed() || b.ClosedErr() != nil {
		t.Fatalf("before Close: got Closed %v, ClosedErr %v; want false, nil", b.Closed(), b.ClosedErr())
	}
	b.Close()
	b.Close() // idempotent
	if !b.Closed() || !errors.Is(b.ClosedErr(), errTestClosed) {
		t.Fatalf("after Close: got Closed %v, ClosedErr %v; want true, %v", b.Closed(), b.ClosedErr(), errTestClosed)
	}
	<-ctx.Done() // WithClose's context ends with Close
	<-b.Done()
	b.Reap("0123456789abcdef") // starts nothing once closed
}

func TestBackgroundReap(t *testing.T) {
	unavailable := fmt.Errorf("delete: %w (%w)", zk.ErrConnectionClosed, ErrAnswered)
	cases := []struct {
		name  string
		errs  []error // what reapOnce returns, call after call
		calls int32
	}{
		{name: "gone at once", errs: []error{nil}, calls: 1},
		{name: "retried while unavailable", errs: []error{unavailable, zk.ErrConnectionClosed, nil}, calls: 3},
		{name: "given up on another error", errs: []error{errors.New("not authenticated"), nil}, calls: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int32
			ended := make(chan struct{})
			b := newTestBackground(func(nonce string) error {
				if nonce != "0123456789abcdef" {
					t.Errorf("got nonce %q, want 0123456789abcdef", nonce)
				}
				n := calls.Add(1)
				err := c.errs[n-1]
				if n == c.calls {
					close(ended)
				}
				return err
			})
			b.Reap("0123456789abcdef")
			<-ended
			b.Close() // waits for the cleanup
			if got := calls.Load(); got != c.calls {
				t.Fatalf("got %d calls, want %d", got, c.calls)
			}
		})
	}
}

func TestNewNonce(t *testing.T) {
	a, b := NewNonce(), NewNonce()
	if len(a) != NonceLen || a == b {
		t.Fatalf("got %q and %q, want two distinct nonces of %d hex digits", a, b, NonceLen)
	}
	if _, err := fmt.Sscanf(a, "%x", new(uint64)); err != nil {
		t.Fatalf("got %q: %v, want hex digits", a, err)
	}
}
