package election

import (
	"log/slog"

	"github.com/go-zookeeper/zk"
)

// Option configures an Election.
type Option func(*options)

type options struct {
	logger        *slog.Logger
	createParents bool
	acl           []zk.ACL
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
