// Package layout is where a qbroker root's nodes live in ZooKeeper:
//
//	<root>/
//	  queues/<name>       the queue catalog (zkqueue.Catalog: each queue's own layout is there)
//	  brokers/<id>        EPHEMERAL: one per live broker, data its start time
//	  election/n-<seq>    EPHEMERAL_SEQUENTIAL: the brokers' leader election (package election)
//	  elections/<name>/   the Election service's elections, one per name (package election)
//	  locks/<name>/       the Lock service's locks, one per name (package lock)
//	  counters/<name>/    the Counter service's counters, one per name (package counter)
//	  semaphores/<name>/  the Semaphore service's semaphores, one per name (package semaphore)
//	  barriers/<name>     the Barrier service's barriers: set while the node exists (package syncqueue)
//	  doublebarriers/<name>/  the DoubleBarrier service's barriers, one per name (package syncqueue)
//	  token-key           the key signing ack tokens (its ACL private to the brokers)
//
// A Root builds every path of that layout, checking the names that come
// from clients or configuration; nothing else assembles them.
package layout

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// ErrBadRoot is the error of a root that is not an absolute, clean path
// other than "/"; ErrBadName, of a name that is not one path element
// (zkutil.CheckName).
var (
	ErrBadRoot = errors.New("layout: bad root")
	ErrBadName = errors.New("layout: bad name")
)

// Root is the layout under one root node. The zero Root is not usable;
// make one with New. A Root is a value: safe for concurrent use.
type Root struct{ path string }

// New returns the layout under root, an absolute, clean path other than
// "/" (such as /qbroker).
func New(root string) (Root, error) {
	if root == "" || root[0] != '/' || path.Clean(root) != root || root == "/" {
		return Root{}, fmt.Errorf("%w %q: want an absolute path such as /qbroker", ErrBadRoot, root)
	}
	return Root{path: root}, nil
}

// Path returns the root node.
func (r Root) Path() string { return r.path }

// Parent returns the node above the root, shared with whoever else uses
// the ensemble.
func (r Root) Parent() string { return path.Dir(r.path) }

// Contains reports whether p is the root or a node below it.
func (r Root) Contains(p string) bool { return p == r.path || strings.HasPrefix(p, r.path+"/") }

// Parents returns the parents the brokers create under the root, in the
// order they create them.
func (r Root) Parents() []string {
	return []string{r.Queues(), r.Brokers(), r.Election(), r.Elections(), r.Locks()}
}

// Queues returns the parent of the queue catalog.
func (r Root) Queues() string { return r.path + "/queues" }

// Brokers returns the parent of the brokers' registrations.
func (r Root) Brokers() string { return r.path + "/brokers" }

// Broker returns the registration node of the broker id.
func (r Root) Broker(id string) (string, error) { return child(r.Brokers(), "broker id", id) }

// Election returns the node of the brokers' leader election.
func (r Root) Election() string { return r.path + "/election" }

// Elections returns the parent of the Election service's elections.
func (r Root) Elections() string { return r.path + "/elections" }

// ElectionOf returns the node of the service election name.
func (r Root) ElectionOf(name string) (string, error) {
	return child(r.Elections(), "election name", name)
}

// Locks returns the parent of the Lock service's locks.
func (r Root) Locks() string { return r.path + "/locks" }

// Lock returns the node of the service lock name.
func (r Root) Lock(name string) (string, error) { return child(r.Locks(), "lock name", name) }

// Counters returns the parent of the Counter service's counters. The
// first write of a counter creates it.
func (r Root) Counters() string { return r.path + "/counters" }

// Counter returns the node of the service counter name.
func (r Root) Counter(name string) (string, error) {
	return child(r.Counters(), "counter name", name)
}

// Semaphores returns the parent of the Semaphore service's semaphores.
func (r Root) Semaphores() string { return r.path + "/semaphores" }

// Semaphore returns the node of the service semaphore name.
func (r Root) Semaphore(name string) (string, error) {
	return child(r.Semaphores(), "semaphore name", name)
}

// Barriers returns the parent of the Barrier service's barriers. Unlike
// the Parents, it is made by the first barrier set.
func (r Root) Barriers() string { return r.path + "/barriers" }

// Barrier returns the node of the service barrier name.
func (r Root) Barrier(name string) (string, error) {
	return child(r.Barriers(), "barrier name", name)
}

// DoubleBarriers returns the parent of the DoubleBarrier service's
// barriers. Unlike the Parents, it is made by the first participant.
func (r Root) DoubleBarriers() string { return r.path + "/doublebarriers" }

// DoubleBarrier returns the node of the service double barrier name.
func (r Root) DoubleBarrier(name string) (string, error) {
	return child(r.DoubleBarriers(), "double barrier name", name)
}

// TokenKey is the name of the root's child that holds the ack tokens'
// key.
const TokenKey = "token-key"

// Child returns the node name under dir, one of the Root's nodes (a
// candidate's key under an election, a contender's under a lock); kind
// names name in the error.
func Child(dir, kind, name string) (string, error) { return child(dir, kind, name) }

func child(dir, kind, name string) (string, error) {
	if err := zkutil.CheckName(name); err != nil {
		return "", fmt.Errorf("%w: %s %v", ErrBadName, kind, err)
	}
	return dir + "/" + name, nil
}
