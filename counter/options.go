package counter

import (
	"github.com/go-zookeeper/zk"
)

// Option configures a Counter.
type Option func(*options)

type options struct {
	acl        []zk.ACL
	onConflict func()
	onWrite    func(Write)
}

// defaults are the options New starts from.
func defaults() options {
	return options{}
}

// WithACL sets the ACL of the nodes the counter creates: its node, its
// missing parents and its value nodes (default: open to anyone,
// zk.WorldACL(zk.PermAll)).
func WithACL(acl []zk.ACL) Option {
	return func(o *options) { o.acl = acl }
}

// WithConflictHook makes f run each time an operation finds the counter
// changed under it (a versioned write or check refused) and starts over:
// a measure of contention. f runs on the operation's goroutine and must
// not block.
func WithConflictHook(f func()) Option {
	return func(o *options) { o.onConflict = f }
}

// Write describes one change of the counter, for WithWriteHook.
type Write struct {
	// Old and New are the values before and after.
	Old, New int64
	// Node and Version name the state the write made: the value node's
	// name and data version. The pair is unique over the counter's life
	// (see the package doc), so it identifies the change.
	Node    string
	Version int32
	// Rollover says that the write moved the value to a new node.
	Rollover bool
}

// WithWriteHook makes f run after each write of this Counter that
// ZooKeeper confirmed. f runs on the operation's goroutine and must not
// block.
func WithWriteHook(f func(Write)) Option {
	return func(o *options) { o.onWrite = f }
}
