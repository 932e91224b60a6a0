package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/qbroker/qbroker/internal/events"
	"github.com/qbroker/qbroker/internal/layout"
	"github.com/qbroker/qbroker/lockdelay"
)

// The coordination services (Election in coord_election.go, Lock in
// coord_lock.go, Counter in coord_counter.go) map gRPC onto the public
// recipes election/, lock/ and counter/, the way etcd's v3election and
// v3lock servers wrap clientv3/concurrency. A counter is no session's: it
// is a persistent node, kept until deleted (coord_counter.go). A lock's
// and a semaphore's streams keep their holding with one loop
// (holdStream, coord_hold.go).
// Their state is in ZooKeeper only: a campaign or a lock of a client is an
// ephemeral node of the broker's primary session, held while the client's
// stream is open. A client that vanishes ends its stream (gRPC keepalive
// finds a dead peer), which removes the node; a broker that dies takes its
// session, and so its clients' nodes, with it once the session times out.
//
//	/<root>/elections/<name>/n-NNNNNNNNNN  EPHEMERAL_SEQUENTIAL candidates
//	/<root>/locks/<name>/lock-<nonce>-NNNNNNNNNN   EPHEMERAL_SEQUENTIAL holders and waiters
//
// The leader deletes a name's node once idle (reapCoordination in
// leader.go); the next contender makes it again.
//
// Keys on the wire are the nodes' names ("n-0000000041"), never paths:
// the broker joins them to the name's node after checking them.

// Ownership. With authentication on, every lock node and candidate the
// broker creates records its caller's identity (lock.WithOwner,
// election.WithOwner). A call by key (Unlock, Revoke, Proclaim, Resign)
// on another identity's node needs lock.admin or election.admin on the
// name; without it the recipe is asked to act only on the caller's own
// nodes (IfOwner), so the check and the change see the same node. Nodes
// made before owners were recorded belong to no identity: admins only.

// coordOwner is the owner recorded in the nodes ctx's caller makes: its
// identity, "" without authentication.
func (gt *gate) coordOwner(ctx context.Context) string {
	b := gt.b
	if b.cfg.Auth == nil {
		return ""
	}
	id, _ := IdentityFrom(ctx)
	return id.Name
}

// ownOnly reports whether ctx's caller may act only on its own nodes of
// the lock or election name (it lacks adminAction there), and its
// identity. Without authentication everyone may act on every node.
func (gt *gate) ownOnly(ctx context.Context, adminAction, name string) (bool, Identity) {
	b := gt.b
	if b.cfg.Auth == nil {
		return false, Identity{}
	}
	id, _ := IdentityFrom(ctx)
	return !b.cfg.Auth.rules.Get().Allowed(id.Name, adminAction, name), id
}

// maxCoordValue bounds a campaign's or a lock holder's value: it is node
// data that every Leader, Observe and Revoke reads.
const maxCoordValue = 64 << 10

// Errors of the coordination services; codeOf maps them.
var (
	errLeadershipLost = errors.New("leadership lost")
	errLockLost       = errors.New("lock lost")
)

// lockDelayOf checks a request's lock_delay: unset or 0 is none; at most
// lockdelay.Max.
func lockDelayOf(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalidf("lock_delay: %v", err)
	}
	v := d.AsDuration()
	if v < 0 || v > lockdelay.Max {
		return 0, invalidf("lock_delay %v out of range [0, %v]", v, lockdelay.Max)
	}
	return v, nil
}

// checkValue refuses a value over maxCoordValue.
func checkValue(v []byte) error {
	if len(v) > maxCoordValue {
		return invalidf("value of %d bytes: at most %d", len(v), maxCoordValue)
	}
	return nil
}

// keyPath checks a key sent by a client, the name of a node with prefix
// under dir, and returns the node's path. Only the name is checked here
// (one path element, so it cannot escape dir); the recipe checks the
// sequence.
func keyPath(dir, key, prefix string) (string, error) {
	if err := validName("key", key); err != nil {
		return "", err
	}
	if !strings.HasPrefix(key, prefix) {
		return "", invalidf("key %q: want %s<sequence>", printable(key), prefix)
	}
	return layout.Child(dir, "key", key)
}

// turns lets one stream at a time campaign in an election on this broker:
// the election recipe allows one candidate per session and election (a
// campaign takes the session's other candidate nodes for orphans), and
// all the broker's candidates share its primary session. The others wait
// here, in no ZooKeeper line, until the one before them ends.
type turns struct {
	mu sync.Mutex
	m  map[string]*turn
}

type turn struct {
	ch   chan struct{} // holds a value while someone has the turn
	refs int           // streams holding or waiting for the turn
}

// acquire waits for name's turn, or ctx; release gives it back.
func (t *turns) acquire(ctx context.Context, name string) (release func(), err error) {
	t.mu.Lock()
	if t.m == nil {
		t.m = make(map[string]*turn)
	}
	tn := t.m[name]
	if tn == nil {
		tn = &turn{ch: make(chan struct{}, 1)}
		t.m[name] = tn
	}
	tn.refs++
	t.mu.Unlock()
	drop := func() {
		t.mu.Lock()
		if tn.refs--; tn.refs == 0 {
			delete(t.m, name)
		}
		t.mu.Unlock()
	}
	select {
	case tn.ch <- struct{}{}:
		return func() { <-tn.ch; drop() }, nil
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}

// coordState is the coordination services' local state.
type coordState struct {
	campaigns turns
	counters  counters // coord_counter.go
}

// emitCoord emits a coordination event: kind of lock or election name,
// for the node key (a name) and token.
func (em *emitter) emitCoord(kind events.Kind, lock, election, key string, token int64) {
	b := em.b
	if em.sink == nil {
		return
	}
	name, what := lock, "lock"
	if election != "" {
		name, what = election, "election"
	}
	em.sink.Emit(events.Event{
		ID:       fmt.Sprintf("%s/%s/%s/%d", what, name, kind, token),
		Kind:     kind,
		Lock:     lock,
		Election: election,
		Key:      key,
		Token:    token,
		Broker:   b.cfg.ID,
		Time:     time.Now(),
	})
}
