package zkqueue

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
)

// Message TTL.
//
// A queue with a TTL (WithExpiry) removes ready messages older than it:
// a message's age counts from its Ready time when set (it became due, or
// was redriven), else from its publish. Nothing polls per message. The
// head of a level is its oldest message, so expiry is checked where a
// message is looked at anyway:
//   - at claim time: a claim that reads an expired message removes it
//     (delete at the read version, plus its dead letter, in one
//     transaction) instead of delivering it, and the take moves on to the
//     next candidate;
//   - by RunExpiry, one timer per queue armed for the expiry of the
//     oldest head, so a queue nobody consumes still sheds its expired
//     messages. It reads each level's head only when the timer fires, and
//     once per TTL while the queue is empty (nothing published later can
//     expire sooner).
//
// A message in flight (leased) is not expired: its lease is honoured and
// an Ack succeeds past the TTL. If the lease ends without an Ack (nack,
// expiry, release), the message goes back to the queue with its age and
// expires at its next claim or head check.
//
// Every expiry bumps the version of a counter node (Expiry.Counter) in
// the same transaction (setData at any version never conflicts), so the
// count of expired messages is exact across processes and survives them.

// Bounds of a queue's message TTL (Spec.MessageTTL).
const (
	MinMessageTTL = time.Second
	MaxMessageTTL = 14 * 24 * time.Hour
)

// Expiry configures a Queue's message TTL (WithExpiry).
type Expiry struct {
	// TTL: ready messages older than this are expired; 0: never.
	TTL time.Duration
	// Dead is the parent of dead letters that expired messages move to;
	// "": they are deleted.
	Dead string
	// Counter is a node whose version counts the expired messages; "":
	// none. A missing counter node does not stop expiry.
	Counter string
	// Hook, when set, is called with the number of messages this process
	// expired (metrics).
	Hook func(n int)
}

// WithExpiry sets the queue's message TTL.
func WithExpiry(e Expiry) Option { return func(o *options) { o.expiry = e } }

// errExpired is the result of a claim that found its message expired and
// removed it: not an error of the take, which moves on.
var errExpired = errors.New("zkqueue: message expired")

// tagReady is Message.Ready's field in a version-2 header (node.go):
// varint Unix ns.
const tagReady = 3

func appendReady(b []byte, ready time.Time) []byte {
	if ready.IsZero() {
		return b
	}
	var v [binary.MaxVarintLen64]byte
	n := binary.PutVarint(v[:], ready.UnixNano())
	b = append(b, tagReady)
	b = binary.AppendUvarint(b, uint64(n))
	return append(b, v[:n]...)
}

// decodeReady finds the Ready field among the tagged fields b.
func decodeReady(b []byte) (time.Time, error) {
	for len(b) > 0 {
		tag := b[0]
		n, k := binary.Uvarint(b[1:])
		if k <= 0 || n > uint64(len(b)-1-k) {
			return time.Time{}, errBadHeader
		}
		field := b[1+k : 1+k+int(n)]
		b = b[1+k+int(n):]
		if tag == tagReady {
			v, k := binary.Varint(field)
			if k <= 0 {
				return time.Time{}, errBadHeader
			}
			return time.Unix(0, v), nil
		}
	}
	return time.Time{}, nil
}

// ExpiresAt returns when m expires under ttl (0: never, the zero time).
func ExpiresAt(m Message, ttl time.Duration) time.Time {
	if ttl <= 0 {
		return time.Time{}
	}
	from := m.Published
	if m.Ready.After(from) {
		from = m.Ready
	}
	return from.Add(ttl)
}

// expiry is a Queue's part for a message TTL (WithExpiry): claims ask it
// whether the message they read has expired, and it removes expired
// messages. A Queue without a TTL has none. It keeps no state.
type expiry struct {
	*core
}

// expired reports whether m has outlived the queue's TTL at now.
func (e *expiry) expired(m Message, now time.Time) bool {
	at := ExpiresAt(m, e.opt.expiry.TTL)
	return !at.IsZero() && !now.Before(at)
}

// expire removes message n, read as data at version, as expired: deleted
// or dead-lettered, and counted, in one transaction. It returns
// zk.ErrNoNode or zk.ErrBadVersion when someone else claimed or expired
// it first.
func (e *expiry) expire(ctx context.Context, n Name, data []byte, version int32) error {
	cfg := e.opt.expiry
	ops := []any{&zk.DeleteRequest{Path: itemPath(e.path, n), Version: version}}
	if cfg.Dead != "" {
		ops = append(ops, &zk.CreateRequest{Path: cfg.Dead + "/" + n.Base, Data: data, Acl: e.opt.acl})
	}
	counted := cfg.Counter != ""
	if counted {
		ops = append(ops, &zk.SetDataRequest{Path: cfg.Counter, Version: -1})
	}
	res, err := e.write(ctx, ops...)
	if err != nil && counted && len(res) == len(ops) && errors.Is(res[len(ops)-1].Error, zk.ErrNoNode) {
		// No counter node (a queue of an older layout): expire uncounted.
		_, err = e.write(ctx, ops[:len(ops)-1]...)
	}
	if err != nil {
		return fmt.Errorf("expire %s: %w", n.Raw, err)
	}
	if cfg.Hook != nil {
		cfg.Hook(1)
	}
	return nil
}

// ExpiredCount returns the number of messages the queue's TTL removed,
// counted by every process: the version of its counter node
// (Expiry.Counter); 0 without a counter or when the node is missing (a
// queue of an older layout).
func (q *Queue) ExpiredCount(ctx context.Context) (int, error) {
	p := q.opt.expiry.Counter
	if p == "" {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ok, stat, err := q.zk.Exists(p)
	if err != nil {
		return 0, fmt.Errorf("exists %s: %w", p, err)
	}
	if !ok {
		return 0, nil
	}
	return int(stat.Version), nil
}

// expireClaimed is a claim's end when it read an expired message: the
// message is removed, and the claim reports errExpired (or the lost race).
func (e *expiry) expireClaimed(ctx context.Context, n Name, data []byte, version int32) error {
	if err := e.expire(ctx, n, data, version); err != nil {
		return err
	}
	return fmt.Errorf("%s: %w", n.Raw, errExpired)
}

// ExpireHeads removes the expired messages at the head of each level and
// returns how many it removed and when the oldest remaining head expires
// (the zero time when the queue is empty or has no TTL). Expired messages
// behind a younger head (put back by a redelivery) are left to their
// claim.
func (q *Queue) ExpireHeads(ctx context.Context) (removed int, next time.Time, err error) {
	if q.opt.expiry.TTL <= 0 {
		return 0, time.Time{}, nil
	}
	l, err := q.insp.listNow()
	if errors.Is(err, zk.ErrNoNode) {
		return 0, time.Time{}, nil
	}
	if err != nil {
		return 0, time.Time{}, err
	}
	done := map[int]bool{}
	for _, sg := range l.segs {
		if done[sg.level] {
			continue
		}
		names, err := q.insp.segmentNames(l, sg)
		if err != nil {
			return removed, next, err
		}
		for _, n := range names {
			if err := ctx.Err(); err != nil {
				return removed, next, err
			}
			p := itemPath(q.path, n)
			data, stat, err := q.zk.Get(p)
			if errors.Is(err, zk.ErrNoNode) {
				continue
			}
			if err != nil {
				return removed, next, fmt.Errorf("get %s: %w", p, err)
			}
			m, err := decodeMessage(n, data, 0)
			if err != nil {
				continue // never delivered, never expired: a purge deletes it
			}
			if !q.ttl.expired(m, time.Now()) {
				if at := ExpiresAt(m, q.opt.expiry.TTL); next.IsZero() || at.Before(next) {
					next = at
				}
				done[sg.level] = true
				break
			}
			err = q.ttl.expire(ctx, n, data, stat.Version)
			switch {
			case err == nil:
				removed++
			case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
				// Claimed or expired by someone else meanwhile.
			default:
				return removed, next, err
			}
		}
	}
	return removed, next, nil
}

// expiryRetry is how long RunExpiry waits after a failed check.
const expiryRetry = time.Second

// RunExpiry expires the queue's messages as they outlive its TTL, with
// one timer armed for the oldest head's expiry (see ExpireHeads), until
// ctx ends; it returns ctx's error. Errors of a check are passed to
// onErr (when set) and the check is retried after a second. Without a
// TTL it only waits for ctx.
func (q *Queue) RunExpiry(ctx context.Context, onErr func(error)) error {
	ttl := q.opt.expiry.TTL
	if ttl <= 0 {
		<-ctx.Done()
		return ctx.Err()
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		_, next, err := q.ExpireHeads(ctx)
		wait := ttl // empty: nothing published from now on expires sooner
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if onErr != nil {
				onErr(err)
			}
			wait = expiryRetry
		case !next.IsZero():
			wait = max(time.Until(next), time.Millisecond)
		}
		t.Reset(wait)
	}
}
