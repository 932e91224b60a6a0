package holding

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Bounds of the retries of an attempt and of the background: between
// tries, and how long without an answer from ZooKeeper before giving up.
// A session cannot outlive that long without its client (ZooKeeper's
// default maximum session timeout is 40 s), so its ephemeral nodes are
// gone by then.
const (
	RetryMin       = 50 * time.Millisecond
	RetryMax       = 2 * time.Second
	NoContactLimit = 2 * time.Minute
)

// ErrAnswered marks a failure after ZooKeeper answered a call of the same
// try: the session was alive then. A reap function wraps it.
var ErrAnswered = errors.New("answered before")

// Node is a node that an attempt may have made: Marked when a lock-delay
// marker may go with it (see Delete).
type Node struct {
	Key    string
	Marked bool
}

// Attempt says how a recipe acquires, one attempt after another: what
// differs between recipes (naming the node, what "my turn" means).
type Attempt[T any] struct {
	// Create makes the attempt's node, its name holding nonce.
	Create func(nonce string) (key string, err error)
	// Wait waits until the node key holds and returns the holding. An
	// error matching Vanished starts a new attempt; any other ends
	// Acquire, the attempt's nodes (Nodes) deleted.
	Wait     func(ctx context.Context, key, nonce string) (T, error)
	Nodes    func(key, nonce string) []Node
	Vanished error
	What     string // what the logs call the node: "contender's node", "waiter"
}

// Acquire runs attempts until one holds, ctx ends or b closes: each
// creates its node with a new nonce and waits; when the node vanished
// (the session expired while it waited) it queues again with a new node;
// on any other error it abandons its nodes and returns the error.
func Acquire[T any](ctx context.Context, b *Background, a Attempt[T]) (T, error) {
	var zero T
	for {
		if err := ctx.Err(); err != nil {
			return zero, err
		}
		if b.Closed() {
			return zero, b.errClosed
		}
		nonce := NewNonce()
		key, err := a.Create(nonce)
		if err != nil {
			return zero, err
		}
		h, err := a.Wait(ctx, key, nonce)
		if errors.Is(err, a.Vanished) {
			// The session expired while we waited: queue again.
			b.log.Debug(a.What+" vanished, queueing again", "znode", key)
			continue
		}
		if err != nil {
			b.Abandon(nonce, a.Nodes(key, nonce)...)
			return zero, err
		}
		return h, nil
	}
}

// Transient reports an error that a reconnection may cure.
func Transient(err error) bool {
	return zkutil.IsUnavailable(err) && !errors.Is(err, zk.ErrClosing)
}

// Pace paces the retries of a wait that rides out connection losses: with
// backoff, until ZooKeeper has not answered for NoContactLimit. Make it
// with NewPace.
type Pace struct {
	backoff time.Duration
	contact time.Time
}

// NewPace returns the pace of a wait that begins.
func NewPace() Pace { return Pace{backoff: RetryMin, contact: time.Now()} }

// Answered notes an answer of ZooKeeper: the backoff starts over.
func (p *Pace) Answered() { p.backoff, p.contact = RetryMin, time.Now() }

// Retry waits before the wait tries again after err, and returns nil
// then. It returns err at once when err is not Transient or ZooKeeper has
// not answered for NoContactLimit, and err joined with the cause of ctx's
// end and the recipe's closed error when ctx ends or b closes first.
func (p *Pace) Retry(ctx context.Context, b *Background, err error) error {
	if !Transient(err) || time.Since(p.contact) > NoContactLimit {
		return err
	}
	if !Sleep(p.backoff, ctx.Done(), b.done) {
		return errors.Join(err, context.Cause(ctx), b.ClosedErr())
	}
	p.backoff = min(2*p.backoff, RetryMax)
	return nil
}

// Background is what a recipe's Close ends: the waits of its calls under
// way (Done) and the background removal of nodes that failed attempts
// left behind (Reap). It is safe for concurrent use.
type Background struct {
	conn      *zk.Conn
	log       *slog.Logger
	errClosed error
	reapOnce  func(nonce string) error

	done chan struct{}  // closed by Close: ends waits and cleanups
	wg   sync.WaitGroup // cleanups (see Reap)

	mu     sync.Mutex
	closed bool
}

// NewBackground returns the Background of a recipe on conn: errClosed is
// its ErrClosed, and reapOnce deletes the nodes whose names hold nonce,
// nil once they are gone; an error it wraps with ErrAnswered says that
// ZooKeeper answered meanwhile.
func NewBackground(conn *zk.Conn, log *slog.Logger, errClosed error, reapOnce func(nonce string) error) *Background {
	return &Background{conn: conn, log: log, errClosed: errClosed, reapOnce: reapOnce, done: make(chan struct{})}
}

// Done returns a channel closed by Close.
func (b *Background) Done() <-chan struct{} { return b.done }

// Closed reports whether Close was called.
func (b *Background) Closed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// ClosedErr returns the recipe's closed error after Close, nil before.
func (b *Background) ClosedErr() error {
	if b.Closed() {
		return b.errClosed
	}
	return nil
}

// Close ends the waits under way and the background cleanups, and waits
// for the cleanups. It is idempotent.
func (b *Background) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.done)
	b.mu.Unlock()
	b.wg.Wait()
}

// WithClose returns a copy of ctx that also ends at Close.
func (b *Background) WithClose(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := make(chan struct{})
	go func() {
		select {
		case <-b.done:
			cancel()
		case <-stop:
		}
	}()
	return ctx, func() {
		close(stop)
		cancel()
	}
}

// Abandon deletes the nodes of an attempt that failed, in order; when a
// delete fails, the background removes what is left (Reap).
func (b *Background) Abandon(nonce string, nodes ...Node) {
	for _, n := range nodes {
		err := Delete(b.conn, n.Key, n.Marked)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			b.log.Debug("node left behind", "znode", n.Key, "err", err)
			b.Reap(nonce)
			return
		}
	}
}

// Reap removes, in the background, the nodes whose names hold nonce: a
// create whose answer was lost, or a delete that failed. It retries until
// they are gone, ZooKeeper has not answered for NoContactLimit, or Close.
func (b *Background) Reap(nonce string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		backoff, contact := RetryMin, time.Now()
		for Sleep(backoff, b.done, nil) {
			err := b.reapOnce(nonce)
			switch {
			case err == nil:
				return
			case !zkutil.IsUnavailable(err):
				b.log.Info("cannot remove a node left behind", "nonce", nonce, "err", err)
				return
			case errors.Is(err, ErrAnswered):
				contact = time.Now()
			case time.Since(contact) > NoContactLimit:
				b.log.Info("giving up removing a node: no answer from ZooKeeper", "nonce", nonce, "err", err)
				return
			}
			backoff = min(2*backoff, RetryMax)
		}
	}()
}

// Sleep waits d unless a or c closes first (false then); a nil channel
// never closes.
func Sleep(d time.Duration, a, c <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-a:
		return false
	case <-c:
		return false
	}
}

// NonceLen is the length of NewNonce's names.
const NonceLen = 16

// NewNonce returns a random name element: 64 bits, as NonceLen hex
// digits. It tells one attempt's nodes from every other attempt's, even
// of the same session.
func NewNonce() string {
	var b [NonceLen / 2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
