package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Expired is one lease the sweep released.
type Expired struct {
	Message Message
	Outcome Outcome
}

// SweeperConfig tunes a LeaseSweeper.
type SweeperConfig struct {
	// Observer, when set, sees every ZooKeeper request of the sweeper.
	Observer Observer
	// Committer, when set, carries the releases (see WithCommitter).
	Committer *Committer
	// ACL of the nodes releases create (see WithACL); default open.
	ACL []zk.ACL
	// Groups is the queue's WithGroups dir, where the release of a
	// grouped message settles its group; required for queues with
	// groups.
	Groups string
}

// LeaseSweeper releases the expired leases of one queue for a process
// that need not consume it (the broker's leader sweeps every queue). It
// opens no Queue and creates nothing. It keeps a children watch on the
// leases parent and each lease's deadline, read once: a queue without
// leases, or whose leases are all known to be live, costs no request.
//
// A lease's deadline is read when the lease first shows up, with a data
// watch; when the watch fires (Extend or a delayed Nack moved the
// deadline, or the lease was settled) the lease is read again at the next
// Sweep. A lease is released only after a read shows its deadline passed,
// and the release is conditional on the version read, so a concurrent
// Extend or settlement wins.
//
// A LeaseSweeper is not safe for concurrent use.
type LeaseSweeper struct {
	zk        observed
	committer *Committer
	items     string
	leases    string
	dead      string
	acl       []zk.ACL
	groups    string
	rel       releaser

	watch <-chan zk.Event        // children watch of leases; nil when none is armed
	known map[string]*sweptLease // lease name -> what the sweeper knows
}

type sweptLease struct {
	item     Name
	deadline time.Time       // zero until read
	watch    <-chan zk.Event // data watch of the last read; nil when none
	nacked   bool            // settled by a delayed nack (or held back): released at its deadline
}

// NewLeaseSweeper returns the sweeper of the leases under leasesPath,
// requeueing into itemsPath and dead-lettering into deadPath. It makes no
// request.
func NewLeaseSweeper(conn *zk.Conn, itemsPath, leasesPath, deadPath string, cfg SweeperConfig) *LeaseSweeper {
	s := &LeaseSweeper{zk: observed{conn, cfg.Observer}, committer: cfg.Committer,
		items: itemsPath, leases: leasesPath, dead: deadPath, acl: zkutil.ACLOr(cfg.ACL), groups: cfg.Groups, known: map[string]*sweptLease{}}
	s.rel = releaser{items: itemsPath, leases: leasesPath, dead: deadPath, groups: cfg.Groups, acl: s.acl,
		tx: txn{write: s.write, exists: s.zk.Exists, del: s.zk.Delete}}
	return s
}

// Due reports whether Sweep has anything to do at now: the leases changed
// since the last listing, a known lease changed, or a known deadline is
// not after now. It makes no request.
func (s *LeaseSweeper) Due(now time.Time) bool {
	if zkutil.Fired(s.watch) {
		return true
	}
	for _, l := range s.known {
		if !now.Before(l.deadline) || zkutil.Fired(l.watch) {
			return true
		}
	}
	return false
}

// NextDue returns the earliest deadline of the leases settled by a
// delayed nack (or held back by a backoff) that the sweeper knows of:
// those are released at their deadline, and a caller may sweep then
// rather than at its next interval. Zero when it knows of none. It makes
// no request.
func (s *LeaseSweeper) NextDue() time.Time {
	var next time.Time
	for _, l := range s.known {
		if l.nacked && (next.IsZero() || l.deadline.Before(next)) {
			next = l.deadline
		}
	}
	return next
}

// InFlight returns the number of leases the last listing saw.
func (s *LeaseSweeper) InFlight() int { return len(s.known) }

// Sweep releases every lease whose deadline is before now: back into the
// queue, or past the policy's MaxDeliveries into the dead letters (or
// dropped). Leases settled or extended concurrently are left alone. When
// the leases parent does not exist it returns an error wrapping
// zk.ErrNoNode.
func (s *LeaseSweeper) Sweep(ctx context.Context, now time.Time, p Policy) ([]Expired, error) {
	if zkutil.Fired(s.watch) {
		s.watch = nil
		children, _, w, err := s.zk.ChildrenW(s.leases)
		if err != nil {
			return nil, fmt.Errorf("children %s: %w", s.leases, err)
		}
		s.watch = w
		listed := make(map[string]bool, len(children))
		for _, c := range children {
			item, ok := ParseLeaseName(c)
			if !ok {
				continue // not a lease: never touched
			}
			listed[c] = true
			if s.known[c] == nil {
				s.known[c] = &sweptLease{item: item}
			}
		}
		for c := range s.known {
			if !listed[c] {
				delete(s.known, c)
			}
		}
	}
	var out []Expired
	for name, l := range s.known {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if !zkutil.Fired(l.watch) && now.Before(l.deadline) {
			continue
		}
		es, done, err := s.sweepOne(ctx, name, l, now, p)
		if err != nil {
			return out, err
		}
		if done {
			delete(s.known, name)
		}
		out = append(out, es...)
	}
	return out, nil
}

// farFuture is the deadline of a lease that does not decode: the sweeper
// leaves it alone until it changes.
var farFuture = time.Unix(1<<62, 0)

// sweepOne reads lease name (arming a new data watch when the last one
// fired) and releases it when its deadline is before now. done means the
// sweeper can forget the lease (gone or released).
func (s *LeaseSweeper) sweepOne(ctx context.Context, name string, l *sweptLease, now time.Time, p Policy) (es []Expired, done bool, err error) {
	leasePath := s.leases + "/" + name
	var data []byte
	var stat *zk.Stat
	if zkutil.Fired(l.watch) {
		l.watch = nil
		var w <-chan zk.Event
		data, stat, w, err = s.zk.GetW(leasePath)
		if err == nil {
			l.watch = w
		}
	} else {
		data, stat, err = s.zk.Get(leasePath)
	}
	if errors.Is(err, zk.ErrNoNode) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("get lease %s: %w", leasePath, err)
	}
	if isPackLease(data) {
		t := packTx{items: s.items, leases: s.leases, dead: s.dead, acl: s.acl, tx: s.rel.tx, get: s.zk.Get}
		es, next, err := t.sweepPack(ctx, heldLease{token: name, version: stat.Version, item: l.item, data: data}, now, now, p)
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return nil, false, nil // settled meanwhile: read again next time
		}
		if err != nil {
			return nil, false, fmt.Errorf("release %s: %w", leasePath, err)
		}
		l.deadline = next
		return es, next.IsZero(), nil
	}
	deadline, itemData, nacked, err := decodeLeaseState(data)
	if err != nil {
		l.deadline = farFuture
		return nil, false, nil
	}
	l.deadline, l.nacked = deadline, nacked
	if !now.After(deadline) {
		return nil, false, nil
	}
	m, err := decodeMessage(l.item, itemData, 0)
	if err != nil {
		l.deadline = farFuture
		return nil, false, nil
	}
	h := heldLease{token: name, version: stat.Version, item: l.item, data: itemData, m: m}
	if !nacked && p.Backoff != nil && !tooMany(m, p) {
		e, done, err := s.holdBack(ctx, h, p.Backoff, now)
		if e == nil {
			return nil, done, err
		}
		return []Expired{*e}, done, err
	}
	out, err := s.rel.release(ctx, h, p)
	if err != nil {
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			// Settled, extended or released meanwhile (or the queue is
			// being deleted): read again at the next Sweep, with a new
			// watch if this one fired.
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("release %s: %w", leasePath, err)
	}
	return []Expired{{Message: m, Outcome: out}}, true, nil
}

func (s *LeaseSweeper) write(ctx context.Context, ops ...any) ([]zk.MultiResponse, error) {
	if s.committer != nil {
		return s.committer.Do(ctx, ops...)
	}
	res, err := s.zk.Multi(ops...)
	return res, zkutil.MultiError(res, err)
}
