package twophase

import (
	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Option configures Begin, Join and Watch.
type Option func(*options)

type options struct {
	acl []zk.ACL
}

func applyOptions(opts []Option) options {
	var o options
	for _, f := range opts {
		f(&o)
	}
	o.acl = zkutil.ACLOr(o.acl)
	return o
}

// WithACL sets the ACL of the nodes the Tx creates: with Begin the
// transaction, its vote nodes and missing parents; with any of them the
// decision (default: open to anyone, zk.WorldACL(zk.PermAll)). Give every
// party the same ACL.
func WithACL(acl []zk.ACL) Option {
	return func(o *options) { o.acl = acl }
}
