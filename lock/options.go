package lock

import (
	"log/slog"
	"time"

	"github.com/go-zookeeper/zk"
)

// Option configures a Mutex or an RWMutex.
type Option func(*options)

type options struct {
	value  []byte
	owner  string
	logger *slog.Logger
	create bool
	acl    []zk.ACL
	delay  time.Duration
}

// defaults are the options NewMutex and NewRWMutex start from.
func defaults() options {
	return options{logger: slog.New(slog.DiscardHandler), create: true}
}

// WithValue sets the data of every lock node this Mutex creates: what
// Current and Revoke report as the holder's Value (an owner's name, an
// address). Empty by default; it must stay well under ZooKeeper's
// jute.maxbuffer (1 MiB).
func WithValue(v []byte) Option {
	return func(o *options) { o.value = append([]byte(nil), v...) }
}

// WithOwner records owner in every lock node this Mutex creates, beside
// the value: Holder.Owner reports it, and UnlockKey and Revoke given
// IfOwner act only on nodes of that owner. For a service that locks on
// behalf of several principals (the broker records the caller's
// identity). The node's data is then owner and value in one encoding
// (Holder.Value is the value alone).
func WithOwner(owner string) Option {
	return func(o *options) { o.owner = owner }
}

// WithDelay sets the lock-delay of the grants this Mutex or RWMutex makes
// (package lockdelay): when a grant is lost with its node (its session
// expired after a crash or a partition, or someone deleted the node
// without UnlockKey), no other contender is granted the lock until d has
// passed since the loss was first observed, so a holder that was only
// cut off can notice and stop first. Unlock and UnlockKey free the lock
// at once. Each grant keeps a persistent marker node beside its own while
// it holds. 0, the default, means no delay; NewMutex and NewRWMutex
// return ErrInvalid for d below 0 or above lockdelay.Max (a minute).
// Contenders honour the delays of earlier holders whatever their own.
func WithDelay(d time.Duration) Option {
	return func(o *options) { o.delay = d }
}

// KeyOption conditions a call that acts on another contender's node
// (UnlockKey, Revoke).
type KeyOption func(*keyOptions)

type keyOptions struct {
	owner   string
	ifOwner bool
}

// IfOwner makes the call act only on nodes that WithOwner(owner)
// recorded; any other node fails it with ErrNotOwner, unchanged.
func IfOwner(owner string) KeyOption {
	return func(o *keyOptions) { o.owner, o.ifOwner = owner, true }
}

func keyOpts(opts []KeyOption) keyOptions {
	var o keyOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// mayTouch reports whether a node of owner passes o's condition.
func (o keyOptions) mayTouch(owner string) bool { return !o.ifOwner || owner == o.owner }

// WithLogger logs grants and losses (Debug) and the removal of nodes left
// behind by a failed call (Info) to l; by default nothing is logged. A nil
// l keeps the default.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithoutCreate says that the lock's node exists already: the constructor
// does no I/O, and Lock fails (wrapping zk.ErrNoNode) while the node is
// missing. By default the constructor creates the node and its missing
// parents (persistent, empty, with the WithACL ACL).
func WithoutCreate() Option {
	return func(o *options) { o.create = false }
}

// WithACL sets the ACL of the nodes the lock creates: its node and missing
// parents, and its lock nodes (default: open to anyone,
// zk.WorldACL(zk.PermAll)).
func WithACL(acl []zk.ACL) Option {
	return func(o *options) { o.acl = acl }
}
