package election

import (
	"log/slog"
	"time"

	"github.com/go-zookeeper/zk"
)

// Option configures an Election.
type Option func(*options)

type options struct {
	logger        *slog.Logger
	createParents bool
	acl           []zk.ACL
	owner         string
	delay         time.Duration
}

// defaults are the options New starts from.
func defaults() options {
	return options{logger: slog.New(slog.DiscardHandler), createParents: true}
}

// WithLogger logs the removal of orphaned candidate nodes (Info) and
// leadership changes (Debug) to l; by default nothing is logged. A nil l
// keeps the default.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithCreateParents says whether New creates the election's node and its
// missing parents (persistent, empty, with the WithACL ACL), which is the
// default. With false, New does no I/O and Campaign fails (wrapping
// zk.ErrNoNode) while the node is missing: for applications that create
// their layout themselves, with their own ACLs.
func WithCreateParents(create bool) Option {
	return func(o *options) { o.createParents = create }
}

// WithACL sets the ACL of the nodes the Election creates: its node and
// missing parents, and its candidates (default: open to anyone,
// zk.WorldACL(zk.PermAll)).
func WithACL(acl []zk.ACL) Option {
	return func(o *options) { o.acl = acl }
}

// WithOwner records owner in the candidate node of every Campaign, beside
// the value: LeaderInfo.Owner reports it, and ProclaimKey and ResignKey
// given IfOwner act only on candidates of that owner. For a service that
// campaigns on behalf of several principals (the broker records the
// caller's identity). The node's data is then owner and value in one
// encoding (LeaderInfo.Value is the value alone); Proclaim keeps the
// owner.
func WithOwner(owner string) Option {
	return func(o *options) { o.owner = owner }
}

// WithDelay sets the lock-delay of the leaderships this Election wins
// (package lockdelay): when a leadership is lost with its node (the
// session expired after a crash or a partition, or someone deleted the
// node without ResignKey), no other candidate leads until d has passed
// since the loss was first observed, so a leader that was only cut off
// can notice and stop first. Resign, Close and ResignKey free the
// election at once. A leader keeps a persistent marker node beside its
// own while it leads. 0, the default, means no delay; New returns
// ErrInvalid for d below 0 or above lockdelay.Max (a minute). Candidates
// honour the delays of earlier leaders whatever their own.
func WithDelay(d time.Duration) Option {
	return func(o *options) { o.delay = d }
}

// KeyOption conditions a call that acts on a candidate by key
// (ProclaimKey, ResignKey).
type KeyOption func(*keyOptions)

type keyOptions struct {
	owner   string
	ifOwner bool
}

// IfOwner makes the call act only on a candidate that WithOwner(owner)
// recorded; another fails it with ErrNotOwner, unchanged.
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
