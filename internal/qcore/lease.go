package qcore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Acknowledged (at-least-once) delivery.
//
// A claim moves the message node from the items parent into the leases
// parent in one Multi: delete(item, version) + create(lease). The lease node
// is named <item name>~<16 hex digits of nonce> and holds the lease
// deadline followed by the message data with its delivery count raised.
// The lease is a persistent node: it does not depend on the claiming
// broker's ZooKeeper session, so a broker crash delays redelivery until the
// deadline but never loses the message.
//
//	ack:      delete(lease, version), after checking the deadline
//	nack:     delete(lease) + create(item, original name), one Multi; with
//	          a delay, the deadline is set to now+delay and the sweep
//	          requeues it
//	expiry:   the sweep requeues leases past their deadline
//	too many: past MaxDeliveries, delete(lease) + create(dead/<item name>)
//
// Requeueing recreates the item under its original name plus a new
// incarnation suffix (see Name), so it keeps its place at the head of the
// queue. That is safe because ZooKeeper's sequence counter has passed that
// name and never issues it again. Dead letters are stored under the base
// name (the message id).

// LeaseSep separates a lease node's item name from its nonce.
const LeaseSep = "~"

var leaseMagic = [3]byte{0xCB, 'L', 1}

// Policy is what happens to a message released too often.
type Policy struct {
	// MaxDeliveries: a released message already delivered this many times
	// is dead-lettered (or dropped); 0 means unlimited.
	MaxDeliveries int
	// DeadLetter keeps such messages in the dead-letter parent; without it
	// they are deleted.
	DeadLetter bool
}

// Leases is the at-least-once layer over a Store: the leases and dead
// letters of one queue. It is safe for concurrent use.
type Leases struct {
	items  *Store
	leases string
	dead   string
}

// NewLeases returns the lease layer of items, keeping leases under
// leasesPath and dead letters under deadPath (created when missing, unless
// the Store's Config has NoCreate).
func NewLeases(items *Store, leasesPath, deadPath string) (*Leases, error) {
	for _, p := range []string{leasesPath, deadPath} {
		if items.cfg.NoCreate {
			break
		}
		if err := zkutil.EnsurePath(items.conn, p); err != nil {
			return nil, err
		}
	}
	return &Leases{items: items, leases: leasesPath, dead: deadPath}, nil
}

// Lease is a message delivered at-least-once.
type Lease struct {
	Message
	// Token is the lease node's name; with the queue it identifies the
	// lease to any broker.
	Token string
	// Deadline is when the lease expires.
	Deadline time.Time
}

// ParseLeaseName splits a lease node name into the item name and nonce.
func ParseLeaseName(s string) (item Name, ok bool) {
	i := strings.LastIndex(s, LeaseSep)
	if i < 0 || len(s)-i-1 != 16 {
		return Name{}, false
	}
	if _, err := hex.DecodeString(s[i+1:]); err != nil {
		return Name{}, false
	}
	return ParseName(s[:i])
}

func newLeaseName(item string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return item + LeaseSep + hex.EncodeToString(b[:])
}

// newIncarnation returns the name under which a released message is
// recreated: its base name plus a fresh incarnation suffix.
func newIncarnation(n Name) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return n.Base + "." + hex.EncodeToString(b[:])
}

func encodeLease(deadline time.Time, itemData []byte) []byte {
	b := make([]byte, 0, len(leaseMagic)+binary.MaxVarintLen64+len(itemData))
	b = append(b, leaseMagic[:]...)
	b = binary.AppendVarint(b, deadline.UnixNano())
	return append(b, itemData...)
}

func decodeLease(data []byte) (deadline time.Time, itemData []byte, err error) {
	if len(data) < 3 || [3]byte(data[:3]) != leaseMagic {
		return time.Time{}, nil, ErrBadData
	}
	d, n := binary.Varint(data[3:])
	if n <= 0 {
		return time.Time{}, nil, ErrBadData
	}
	return time.Unix(0, d), data[3+n:], nil
}

// Claim moves candidate n into a lease lasting ttl. It returns
// zk.ErrNoNode or zk.ErrBadVersion when another consumer won the race.
func (l *Leases) Claim(ctx context.Context, n Name, ttl time.Duration) (Lease, error) {
	itemPath := l.items.path + "/" + n.Raw
	data, version, ctime, err := l.items.readItem(itemPath, n)
	if err != nil {
		return Lease{}, err
	}
	m, err := decodeMessage(n, data, ctime, 1)
	if err != nil {
		return Lease{}, err
	}
	deadline := time.Now().Add(ttl)
	token := newLeaseName(n.Raw)
	_, err = l.items.write(
		&zk.DeleteRequest{Path: itemPath, Version: version},
		&zk.CreateRequest{
			Path: l.leases + "/" + token,
			Data: encodeLease(deadline, EncodeData(m.Payload, m.Published, m.Deliveries)),
			Acl:  zk.WorldACL(zk.PermAll),
		})
	if err != nil {
		return Lease{}, fmt.Errorf("lease %s: %w", itemPath, err)
	}
	return Lease{Message: m, Token: token, Deadline: deadline}, nil
}

// TakeLeases claims up to k messages with leases of ttl (see TakeN).
func (l *Leases) TakeLeases(ctx context.Context, k int, ttl time.Duration, block bool) ([]Lease, error) {
	return TakeN(ctx, l.items, k, block, l.claimFunc(ttl))
}

func (l *Leases) claimFunc(ttl time.Duration) ClaimFunc[Lease] {
	return func(ctx context.Context, n Name) (Lease, error) { return l.Claim(ctx, n, ttl) }
}

// get reads a live lease. Unknown and expired leases are ErrUnknownLease.
func (l *Leases) get(token string) (deadline time.Time, itemData []byte, stat *zk.Stat, err error) {
	if _, ok := ParseLeaseName(token); !ok {
		return time.Time{}, nil, nil, fmt.Errorf("%w: malformed token", ErrUnknownLease)
	}
	data, stat, err := l.items.zk.Get(l.leases + "/" + token)
	if errors.Is(err, zk.ErrNoNode) {
		return time.Time{}, nil, nil, ErrUnknownLease
	}
	if err != nil {
		return time.Time{}, nil, nil, fmt.Errorf("get lease %s: %w", token, err)
	}
	deadline, itemData, err = decodeLease(data)
	if err != nil {
		return time.Time{}, nil, nil, fmt.Errorf("lease %s: %w", token, err)
	}
	return deadline, itemData, stat, nil
}

// Ack deletes the leased message. Errors: ErrUnknownLease when the lease
// does not exist, has expired, or was settled already.
func (l *Leases) Ack(ctx context.Context, token string) (Message, error) {
	deadline, itemData, stat, err := l.get(token)
	if err != nil {
		return Message{}, err
	}
	if time.Now().After(deadline) {
		return Message{}, fmt.Errorf("%w: expired %v ago", ErrUnknownLease, time.Since(deadline).Round(time.Millisecond))
	}
	if _, err := l.items.write(&zk.DeleteRequest{Path: l.leases + "/" + token, Version: stat.Version}); err != nil {
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return Message{}, ErrUnknownLease
		}
		return Message{}, fmt.Errorf("delete lease %s: %w", token, err)
	}
	item, _ := ParseLeaseName(token)
	return decodeMessage(item, itemData, ctimeOf(stat), 0)
}

// AckUnread deletes a lease by name without reading it first, for a caller
// that knows the lease's deadline has not passed. The returned Message has
// only the ID and Priority (from the name). Errors: ErrUnknownLease when
// the lease is gone (settled, or released by expiry).
func (l *Leases) AckUnread(ctx context.Context, token string) (Message, error) {
	item, ok := ParseLeaseName(token)
	if !ok {
		return Message{}, fmt.Errorf("%w: malformed token", ErrUnknownLease)
	}
	if _, err := l.items.write(&zk.DeleteRequest{Path: l.leases + "/" + token, Version: -1}); err != nil {
		if errors.Is(err, zk.ErrNoNode) {
			return Message{}, ErrUnknownLease
		}
		return Message{}, fmt.Errorf("delete lease %s: %w", token, err)
	}
	return Message{ID: item.Base, Priority: item.Priority}, nil
}

// Extend moves a live lease's deadline to now+ttl.
func (l *Leases) Extend(ctx context.Context, token string, ttl time.Duration) (time.Time, error) {
	deadline, itemData, stat, err := l.get(token)
	if err != nil {
		return time.Time{}, err
	}
	if time.Now().After(deadline) {
		return time.Time{}, fmt.Errorf("%w: expired", ErrUnknownLease)
	}
	newDeadline := time.Now().Add(ttl)
	if _, err := l.items.zk.Set(l.leases+"/"+token, encodeLease(newDeadline, itemData), stat.Version); err != nil {
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return time.Time{}, ErrUnknownLease
		}
		return time.Time{}, fmt.Errorf("extend lease %s: %w", token, err)
	}
	return newDeadline, nil
}

// Outcome is what a release did with a message.
type Outcome int

// Release outcomes.
const (
	Requeued     Outcome = iota // deliverable again
	Delayed                     // deliverable again after a delay
	DeadLettered                // moved to the dead letters
	Dropped                     // deleted: too many deliveries, no dead letters
)

// Nack releases a live lease: the message is deliverable again at once, or
// after delay. Past the policy's MaxDeliveries it is dead-lettered or
// dropped instead.
func (l *Leases) Nack(ctx context.Context, token string, delay time.Duration, p Policy) (Message, Outcome, error) {
	deadline, itemData, stat, err := l.get(token)
	if err != nil {
		return Message{}, 0, err
	}
	if time.Now().After(deadline) {
		return Message{}, 0, fmt.Errorf("%w: expired", ErrUnknownLease)
	}
	item, _ := ParseLeaseName(token)
	m, err := decodeMessage(item, itemData, ctimeOf(stat), 0)
	if err != nil {
		return Message{}, 0, err
	}
	if delay > 0 && !tooMany(m, p) {
		if _, err := l.items.zk.Set(l.leases+"/"+token, encodeLease(time.Now().Add(delay), itemData), stat.Version); err != nil {
			if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
				return Message{}, 0, ErrUnknownLease
			}
			return Message{}, 0, fmt.Errorf("delay lease %s: %w", token, err)
		}
		return m, Delayed, nil
	}
	out, err := l.release(token, item, itemData, stat.Version, m, p)
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
		return Message{}, 0, ErrUnknownLease
	}
	return m, out, err
}

func tooMany(m Message, p Policy) bool {
	return p.MaxDeliveries > 0 && m.Deliveries >= p.MaxDeliveries
}

// release moves a lease back to the items (or to the dead letters) in one
// Multi, conditional on the lease's version.
func (l *Leases) release(token string, item Name, itemData []byte, version int32, m Message, p Policy) (Outcome, error) {
	ops, out := releaseOps(l.items.path, l.leases, l.dead, token, item, itemData, version, m, p)
	if _, err := l.items.write(ops...); err != nil {
		return 0, fmt.Errorf("release %s/%s: %w", l.leases, token, err)
	}
	if out == Requeued {
		l.items.Reset()
	}
	return out, nil
}

// releaseOps is the transaction that releases lease token (of item, at
// version): back into itemsPath under a new incarnation, or into deadPath,
// or deleted, by the policy.
func releaseOps(itemsPath, leasesPath, deadPath, token string, item Name, itemData []byte, version int32, m Message, p Policy) ([]any, Outcome) {
	del := &zk.DeleteRequest{Path: leasesPath + "/" + token, Version: version}
	switch {
	case !tooMany(m, p):
		return []any{del, &zk.CreateRequest{Path: itemsPath + "/" + newIncarnation(item), Data: itemData, Acl: zk.WorldACL(zk.PermAll)}}, Requeued
	case p.DeadLetter:
		return []any{del, &zk.CreateRequest{Path: deadPath + "/" + item.Base, Data: itemData, Acl: zk.WorldACL(zk.PermAll)}}, DeadLettered
	default:
		return []any{del}, Dropped
	}
}

// Release gives a lease back regardless of its deadline (a consumer's
// stream ended, the broker shuts down). A lease already settled is not an
// error: ok is false.
func (l *Leases) Release(ctx context.Context, token string, p Policy) (m Message, out Outcome, ok bool, err error) {
	item, valid := ParseLeaseName(token)
	if !valid {
		return Message{}, 0, false, ErrUnknownLease
	}
	data, stat, err := l.items.zk.Get(l.leases + "/" + token)
	if errors.Is(err, zk.ErrNoNode) {
		return Message{}, 0, false, nil
	}
	if err != nil {
		return Message{}, 0, false, fmt.Errorf("get lease %s: %w", token, err)
	}
	_, itemData, err := decodeLease(data)
	if err != nil {
		return Message{}, 0, false, err
	}
	if m, err = decodeMessage(item, itemData, ctimeOf(stat), 0); err != nil {
		return Message{}, 0, false, err
	}
	out, err = l.release(token, item, itemData, stat.Version, m, p)
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
		return Message{}, 0, false, nil
	}
	return m, out, err == nil, err
}

// InFlight returns the number of leases, from the parent's Stat.
func (l *Leases) InFlight(ctx context.Context) (int, error) {
	return numChildren(l.items.conn, l.leases)
}

// DeadCount returns the number of dead letters, from the parent's Stat.
func (l *Leases) DeadCount(ctx context.Context) (int, error) {
	return numChildren(l.items.conn, l.dead)
}

func numChildren(conn *zk.Conn, p string) (int, error) {
	_, stat, err := conn.Exists(p)
	if err != nil {
		return 0, fmt.Errorf("exists %s: %w", p, err)
	}
	if stat == nil {
		return 0, nil
	}
	return int(stat.NumChildren), nil
}

// DeadLetters returns up to limit dead letters, oldest (in queue order)
// first.
func (l *Leases) DeadLetters(ctx context.Context, limit int) ([]Message, error) {
	children, _, err := l.items.zk.Children(l.dead)
	if err != nil {
		return nil, fmt.Errorf("children %s: %w", l.dead, err)
	}
	names, _ := SortNames(children)
	var out []Message
	for _, n := range names {
		if len(out) >= limit {
			break
		}
		data, stat, err := l.items.zk.Get(l.dead + "/" + n.Raw)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("get %s: %w", n.Raw, err)
		}
		m, err := decodeMessage(n, data, ctimeOf(stat), 0)
		if err != nil {
			continue
		}
		out = append(out, m)
	}
	return out, nil
}

// Redrive moves dead letters back into the queue, under their original
// names and with their delivery count reset. Empty ids means all. Unknown
// ids are skipped. It returns the number moved.
func (l *Leases) Redrive(ctx context.Context, ids []string) (int, error) {
	if len(ids) == 0 {
		children, _, err := l.items.zk.Children(l.dead)
		if err != nil {
			return 0, fmt.Errorf("children %s: %w", l.dead, err)
		}
		ids = children
	}
	moved := 0
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return moved, err
		}
		n, ok := ParseName(id)
		if !ok {
			continue
		}
		deadPath := l.dead + "/" + id
		data, stat, err := l.items.zk.Get(deadPath)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return moved, fmt.Errorf("get %s: %w", deadPath, err)
		}
		m, err := decodeMessage(n, data, ctimeOf(stat), 0)
		if err != nil {
			return moved, err
		}
		res, err := l.items.zk.Multi(
			&zk.DeleteRequest{Path: deadPath, Version: stat.Version},
			&zk.CreateRequest{Path: l.items.path + "/" + newIncarnation(n), Data: EncodeData(m.Payload, m.Published, 0), Acl: zk.WorldACL(zk.PermAll)})
		if err != nil {
			err = firstMultiError(res, err)
			if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
				continue
			}
			return moved, fmt.Errorf("redrive %s: %w", id, err)
		}
		l.items.Reset()
		moved++
	}
	return moved, nil
}
