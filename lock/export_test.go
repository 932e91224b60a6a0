package lock

import "github.com/go-zookeeper/zk"

// SetWaitingHook makes f run whenever a contender starts waiting for the
// node pred, until the returned func resets it. Set it while no Lock runs.
func SetWaitingHook(f func(key, pred string)) (reset func()) {
	testHookWaiting = f
	return func() { testHookWaiting = nil }
}

// SetCreateHook makes f stand in for the create of contenders' nodes,
// until the returned func resets it. Set it while no Lock runs.
func SetCreateHook(f func(conn *zk.Conn, prefix string, data []byte) (string, error)) (reset func()) {
	testHookCreate = f
	return func() { testHookCreate = nil }
}

// Order exposes the ordering of lock node names: the holders among
// children, and the node that name waits for ("" when it holds).
func Order(children []string, name string) (holders []string, waitsFor string) {
	nodes := parseAll(children)
	for _, n := range holdersOf(nodes) {
		holders = append(holders, n.name)
	}
	if me, ok := parseNode(name); ok {
		if b, blocked := blocker(nodes, me); blocked {
			waitsFor = b.name
		}
	}
	return holders, waitsFor
}

func holdersOf(nodes []node) []node { return holders(nodes) }
