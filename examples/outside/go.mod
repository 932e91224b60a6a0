// A module outside qbroker's that uses its recipes with the released
// go-zookeeper, as a Go user's would. The replace points at this checkout
// instead of a released qbroker; go-zookeeper comes from the module proxy.
module example.com/outside

go 1.26.8

require (
	github.com/go-zookeeper/zk v1.0.4
	github.com/qbroker/qbroker v0.0.0
)

replace github.com/qbroker/qbroker => ../..
