package semaphore

import (
	"log/slog"
	"time"

	"github.com/go-zookeeper/zk"
)

// Option configures a Semaphore.
type Option func(*options)

type options struct {
	value  []byte
	owner  string
	logger *slog.Logger
	acl    []zk.ACL
	delay  time.Duration
}

// defaults are the options New starts from.
func defaults() options {
	return options{logger: slog.New(slog.DiscardHandler)}
}

// WithValue sets the data of every lease this Semaphore grants: what
// Holders and Revoke report as the holder's Value (an owner's name, an
// address). Empty by default; at most 512 KiB.
func WithValue(v []byte) Option {
	return func(o *options) { o.value = append([]byte(nil), v...) }
}

// WithOwner records owner in every lease this Semaphore grants, beside
// the value: Holder.Owner reports it, and ReleaseKey and RevokeKey given
// IfOwner act only on leases of that owner. For a service that acquires
// on behalf of several principals (the broker records the caller's
// identity).
func WithOwner(owner string) Option {
	return func(o *options) { o.owner = owner }
}

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

// WithACL sets the ACL of the nodes the semaphore creates: its node, its
// queue and leases nodes, missing parents, waiters and leases (default:
// open to anyone, zk.WorldACL(zk.PermAll)).
func WithACL(acl []zk.ACL) Option {
	return func(o *options) { o.acl = acl }
}

// WithDelay sets the lock-delay of the leases this Semaphore grants
// (package lockdelay): when a lease is lost with its node (its session
// expired after a crash or a partition, or someone deleted the node
// without ReleaseKey), its permits stay unavailable until d has passed
// since the loss was first observed, so a holder that was only cut off
// can notice and stop first. Release and ReleaseKey free them at once.
// Each lease keeps a persistent marker node beside its own while it
// holds, <path>/leases/delay-lease-<n>-<nonce>, whose name carries the
// permits it keeps. 0, the default, means no delay; New returns
// ErrInvalid for d below 0 or above lockdelay.Max (a minute). Contenders
// honour the delays of earlier leases whatever their own.
func WithDelay(d time.Duration) Option {
	return func(o *options) { o.delay = d }
}

// KeyOption conditions a call that acts on another holder's lease
// (ReleaseKey, RevokeKey, Revoke).
type KeyOption func(*keyOptions)

type keyOptions struct {
	owner   string
	ifOwner bool
}

// IfOwner makes the call act only on leases that WithOwner(owner)
// recorded; any other lease fails it with ErrNotOwner, unchanged.
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

func (o keyOptions) mayTouch(owner string) bool { return !o.ifOwner || owner == o.owner }
