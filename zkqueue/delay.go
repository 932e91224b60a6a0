package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Delayed and scheduled delivery.
//
// A message published with a due time in the future is created under a
// separate parent (a queue's delayed/ in a Catalog), not in a segment, as
// PERSISTENT_SEQUENTIAL node named
//
//	d-<due, Unix ms, 19 digits>-<priority, 3 digits>-<sequence>
//
// so names sort by due time (then priority, then publish order) as
// strings. Its data is the message's, as in a segment. Consumers never
// see it: it is not ready.
//
// A scheduler (Run) moves due messages into the queue. It keeps one
// children watch on the parent and one timer, armed for the earliest due
// time: a message published with an earlier due time fires the watch; no
// message is polled. A move is one transaction through the queue's
// publish path (appendWith): delete(delayed node, at the version read) +
// the tail segment's version check + create(message), so segments, rolls
// and the Committer's group commit hold as for any publish. Several
// schedulers may run for one queue (one per process serving it): the
// versioned delete lets exactly one move commit, and the others find the
// node gone. Due messages are moved in batches of up to
// Limits.MaxBatchCount in one transaction, in due order.
//
// Ordering: a delayed message joins the tail of the queue when it is
// moved (normally within a few milliseconds of its due time): behind the
// messages published before that, ahead of those published after. Its
// Published time is that of its publish; its Ready time, from which a
// message TTL counts, is its due time. It gets a new id in the queue (the
// id returned by the publish names the delayed node).
//
// The parent is listed whole, so the number of delayed messages of a
// queue is bounded (NewScheduled's max, DefaultMaxDelayed): a publish beyond it
// is refused with ErrTooManyDelayed.

// DefaultMaxDelayed bounds the delayed messages of a queue: their names
// (about 36 bytes each) must be listable in one packet below
// jute.maxbuffer (1 MiB), with room for the publishes in flight.
const DefaultMaxDelayed = 20_000

// ErrTooManyDelayed is returned by a publish that would take a queue past
// its bound of delayed messages.
var ErrTooManyDelayed = errors.New("zkqueue: too many delayed messages")

// delayedPrefix begins every delayed node's name.
const delayedPrefix = "d-"

// Scheduled is the delayed-delivery layer of a Queue: its delayed messages
// under one parent. It is safe for concurrent use.
type Scheduled struct {
	items *Queue
	path  string
	// max bounds the delayed messages held; see DefaultMaxDelayed.
	max int

	badMu sync.Mutex
	bad   map[string]bool // delayed nodes that do not decode, logged
}

// NewScheduled returns the delayed messages of items, kept under p (created
// when missing, unless items was opened WithoutCreate). max bounds them
// (0: DefaultMaxDelayed).
func NewScheduled(items *Queue, p string, max int) (*Scheduled, error) {
	if max <= 0 {
		max = DefaultMaxDelayed
	}
	if !items.opt.noCreate {
		if err := zkutil.EnsurePath(items.conn, p, items.opt.acl); err != nil {
			return nil, fmt.Errorf("zkqueue: %w", err)
		}
	}
	return &Scheduled{items: items, path: p, max: max}, nil
}

// Path returns the parent of the delayed messages.
func (s *Scheduled) Path() string { return s.path }

// delayedName returns the name prefix of a message of priority p due at
// due; ZooKeeper appends the sequence.
func delayedName(due time.Time, p int) string {
	return fmt.Sprintf("%s%019d-%03d-", delayedPrefix, max(due.UnixMilli(), 0), p)
}

// parseDelayed parses a delayed node's name.
func parseDelayed(s string) (due time.Time, prio int, ok bool) {
	rest, found := strings.CutPrefix(s, delayedPrefix)
	parts := strings.SplitN(rest, "-", 3)
	if !found || len(parts) != 3 || len(parts[0]) != 19 || len(parts[1]) != 3 {
		return time.Time{}, 0, false
	}
	ms, err1 := strconv.ParseInt(parts[0], 10, 64)
	p, err2 := strconv.Atoi(parts[1])
	_, err3 := strconv.ParseInt(parts[2], 10, 32)
	if err1 != nil || err2 != nil || err3 != nil || p < 0 || p > MaxPriority {
		return time.Time{}, 0, false
	}
	return time.UnixMilli(ms), p, true
}

// IsDelayedID reports whether id names a delayed message (as returned by
// PublishAll for a message not due yet).
func IsDelayedID(id string) bool {
	_, _, ok := parseDelayed(id)
	return ok
}

// PublishAll publishes drafts atomically (all or none), each at its due
// time: due[i] zero or not after now means ready at once (appended to the
// queue as by Queue.PublishAll), later means delayed until then. It
// returns the ids in order: a ready message's id in the queue, a delayed
// one's delayed node name. Drafts with dedup ids are published as by
// PublishReceipts, a repeat's id being the first publish's. A grouped
// draft cannot be delayed (ErrBadGroup): it would join the queue outside
// its group's order. Errors: those of Queue.PublishAll, and
// ErrTooManyDelayed; a missing parent is a zk.ErrNoNode.
func (s *Scheduled) PublishAll(ctx context.Context, drafts []Draft, due []time.Time) ([]string, error) {
	rs, err := s.publish(ctx, drafts, due)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids, nil
}

// PublishReceipts is PublishAll telling repeats apart: drafts repeating a
// dedup id within the window are left out and answered with the first
// publish's id, as by Queue.PublishReceipts. A delayed message's records
// are created in its delayed node's transaction, and its id (its delayed
// node's name) is remembered until it is due plus the window, within
// MaxDedupBuckets windows (see dedup.go): a repeat is answered with that
// id before and after the message joins the queue. Errors: those of
// PublishAll, ErrBadDedupID.
func (s *Scheduled) PublishReceipts(ctx context.Context, drafts []Draft, due []time.Time) ([]Receipt, error) {
	return s.publish(ctx, drafts, due)
}

func (s *Scheduled) publish(ctx context.Context, drafts []Draft, due []time.Time) ([]Receipt, error) {
	q := s.items
	if len(due) != len(drafts) {
		return nil, fmt.Errorf("zkqueue: %d due times for %d messages", len(due), len(drafts))
	}
	now := time.Now()
	if err := s.check(drafts, due, now); err != nil {
		return nil, err
	}
	delayed := 0
	for _, t := range due {
		if t.After(now) {
			delayed++
		}
	}
	if delayed > 0 {
		n, err := zkutil.NumChildren(q.conn, s.path)
		if err != nil {
			return nil, q.wrap("publish delayed", err)
		}
		if n+delayed > s.max {
			return nil, fmt.Errorf("%w: %s holds %d, at most %d", ErrTooManyDelayed, s.path, n, s.max)
		}
	}
	if hasDedup(drafts) {
		rs, err := q.dedup.publishReceipts(ctx, drafts, s, due)
		return rs, q.wrap("publish delayed", err)
	}
	var r appendReq
	if anyGrouped(drafts) {
		drafts = withGroupTokens(drafts)
		r.attrs = []Attributes{}
	}
	for i, dr := range drafts {
		data := EncodeData(Message{Payload: dr.Payload, Attributes: dr.Attributes, Published: now})
		if due[i].After(now) {
			r.pre = append(r.pre, s.createOp(due[i], dr.Priority, data))
			continue
		}
		r.levels, r.datas = append(r.levels, dr.Priority), append(r.datas, data)
		if r.attrs != nil {
			r.attrs = append(r.attrs, dr.Attributes)
		}
	}
	res, paths, err := q.prod.commit(ctx, r)
	if err != nil {
		return nil, q.wrap("publish delayed", err)
	}
	out := make([]Receipt, len(drafts))
	for i, j, k := 0, 0, 0; i < len(drafts); i++ {
		if due[i].After(now) {
			out[i].ID = path.Base(res[j].String)
			j++
			continue
		}
		out[i].ID = path.Base(paths[k])
		k++
	}
	return out, nil
}

// createOp returns the create of a delayed message of priority p due at
// due, with data.
func (s *Scheduled) createOp(due time.Time, p int, data []byte) *zk.CreateRequest {
	return &zk.CreateRequest{Path: s.path + "/" + delayedName(due, p), Data: data, Acl: s.items.opt.acl, Flags: zk.FlagSequence}
}

// check checks drafts due at due as Queue.PublishAll does before
// writing, counting each one's dedup records and group entry, and refuses
// a grouped draft due after now.
func (s *Scheduled) check(drafts []Draft, due []time.Time, now time.Time) error {
	q := s.items
	if len(drafts) == 0 {
		return ErrEmptyBatch
	}
	if len(drafts) > q.opt.limits.MaxBatchCount {
		return fmt.Errorf("%w: %d messages > %d", ErrBatchTooLarge, len(drafts), q.opt.limits.MaxBatchCount)
	}
	if err := q.checkDrafts(drafts); err != nil {
		return err
	}
	total, overhead := 0, 0
	for i, dr := range drafts {
		if dr.Group != "" && due[i].After(now) {
			return &DraftError{Index: i, Err: fmt.Errorf("%w: a grouped message cannot be delayed", ErrBadGroup)}
		}
		total += dr.Size()
		overhead += q.MessageOverhead() + q.featureBytes(dr, now, due[i])
	}
	if len(drafts) > 1 && total+overhead > q.opt.limits.MaxBatchBytes {
		return fmt.Errorf("%w: %d messages are %d bytes including %d bytes of per-message overhead > %d",
			ErrBatchTooLarge, len(drafts), total+overhead, overhead, q.opt.limits.MaxBatchBytes)
	}
	return nil
}

// preFailed reports whether one of the first n ops of a failed
// transaction is the one that failed (ops not executed report
// zk.ErrAPIError).
func preFailed(res []zk.MultiResponse, n int) bool {
	for i := 0; i < n && i < len(res); i++ {
		if e := res[i].Error; e != nil && !errors.Is(e, zk.ErrAPIError) {
			return true
		}
	}
	return false
}

// Len returns the number of delayed messages, from the parent's Stat (0
// when the parent is missing).
func (s *Scheduled) Len(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n, err := zkutil.NumChildren(s.items.conn, s.path)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	return n, err
}

// Purge deletes every delayed message present when it starts and returns
// how many it deleted.
func (s *Scheduled) Purge(ctx context.Context) (int, error) {
	children, _, err := s.items.zk.Children(s.path)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("children %s: %w", s.path, err)
	}
	raw := make([]string, len(children))
	for i, c := range children {
		raw[i] = s.path + "/" + c
	}
	return zkutil.DeleteNodes(ctx, s.items.conn, raw)
}

// delayedNode is one listed delayed message.
type delayedNode struct {
	name string
	due  time.Time
	prio int
}

// list returns the delayed messages sorted by due time, with a watch of
// the parent. Foreign names are left out.
func (s *Scheduled) list() ([]delayedNode, <-chan zk.Event, error) {
	children, _, w, err := s.items.zk.ChildrenW(s.path)
	if err != nil {
		return nil, nil, fmt.Errorf("children %s: %w", s.path, err)
	}
	sort.Strings(children)
	out := make([]delayedNode, 0, len(children))
	for _, c := range children {
		if due, p, ok := parseDelayed(c); ok {
			out = append(out, delayedNode{c, due, p})
		}
	}
	return out, w, nil
}

// MoveDue moves the messages due at now into the queue, in due order, and
// returns how many this call moved and the earliest due time of those
// left (zero when none), with a watch of the parent that fires when a
// message is added or removed. Messages moved meanwhile by another
// scheduler are skipped.
func (s *Scheduled) MoveDue(ctx context.Context) (moved int, next time.Time, watch <-chan zk.Event, err error) {
	nodes, w, err := s.list()
	if err != nil {
		return 0, time.Time{}, nil, err
	}
	now := time.Now()
	i := sort.Search(len(nodes), func(i int) bool { return nodes[i].due.After(now) })
	due := nodes[:i]
	if i < len(nodes) {
		next = nodes[i].due
	}
	for len(due) > 0 {
		k := min(len(due), s.items.opt.limits.MaxBatchCount)
		n, err := s.move(ctx, due[:k])
		moved += n
		if err != nil {
			return moved, next, w, err
		}
		due = due[k:]
	}
	return moved, next, w, nil
}

// move moves nodes (due, in due order) in one transaction within the
// batch byte limit, falling back to one transaction each when the
// combined one fails (another scheduler moved one of them).
func (s *Scheduled) move(ctx context.Context, nodes []delayedNode) (int, error) {
	q := s.items
	var pre []any
	var levels []int
	var datas [][]byte
	total := 0
	moved := 0
	flush := func() error {
		if len(pre) == 0 {
			return nil
		}
		n, err := s.commit(ctx, pre, levels, datas)
		moved += n
		pre, levels, datas, total = nil, nil, nil, 0
		return err
	}
	for _, nd := range nodes {
		if err := ctx.Err(); err != nil {
			return moved, err
		}
		p := s.path + "/" + nd.name
		data, stat, err := q.zk.Get(p)
		if errors.Is(err, zk.ErrNoNode) {
			continue // moved by someone else
		}
		if err != nil {
			return moved, fmt.Errorf("get %s: %w", p, err)
		}
		m, err := DecodeData(data)
		if err != nil {
			s.markBad(p)
			continue
		}
		m.Deliveries, m.Ready = 0, nd.due
		out := EncodeData(m)
		size := len(out) + q.MessageOverhead()
		if len(pre) > 0 && total+size > q.opt.limits.MaxBatchBytes {
			if err := flush(); err != nil {
				return moved, err
			}
		}
		pre = append(pre, &zk.DeleteRequest{Path: p, Version: stat.Version})
		levels, datas, total = append(levels, nd.prio), append(datas, out), total+size
	}
	return moved, flush()
}

// commit runs the moves of one batch: all in one transaction, or, when
// one of the delayed nodes changed (moved elsewhere), one at a time.
func (s *Scheduled) commit(ctx context.Context, pre []any, levels []int, datas [][]byte) (int, error) {
	res, paths, err := s.items.prod.appendWith(ctx, appendReq{pre: pre, levels: levels, datas: datas})
	if err == nil {
		return len(paths), nil
	}
	if !preFailed(res, len(pre)) {
		return 0, err
	}
	if len(pre) == 1 {
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
			return 0, nil // moved by another scheduler
		}
		return 0, err
	}
	moved := 0
	for i := range pre {
		n, err := s.commit(ctx, pre[i:i+1], levels[i:i+1], datas[i:i+1])
		moved += n
		if err != nil {
			return moved, err
		}
	}
	return moved, nil
}

// markBad logs, once, a delayed node whose data does not decode:
// it is never moved; Purge deletes it.
func (s *Scheduled) markBad(p string) {
	s.badMu.Lock()
	first := !s.bad[p] && len(s.bad) < 1000
	if first {
		if s.bad == nil {
			s.bad = map[string]bool{}
		}
		s.bad[p] = true
	}
	s.badMu.Unlock()
	if first {
		o := s.items.opt
		o.logger.Warn("skipping delayed message whose data does not decode", "znode", p)
		if o.badDataHook != nil {
			o.badDataHook(p)
		}
	}
}

// Scheduler bounds: a failed pass is retried after schedulerRetry; passes
// woken by the watch are at least schedulerGap apart, so a burst of
// delayed publishes costs one listing per gap, not one per publish.
const (
	schedulerRetry = time.Second
	schedulerGap   = 20 * time.Millisecond
)

// Run moves due messages into the queue until ctx ends (see MoveDue),
// waiting on the parent's watch and one timer for the earliest due time;
// it returns ctx's error. When the parent is missing it waits for its
// creation. Errors of a pass go to onErr (when set) and the pass is
// retried after a second; moved (when set) is told of each pass's moves.
func (s *Scheduled) Run(ctx context.Context, moved func(n int), onErr func(error)) error {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		started := time.Now()
		n, next, w, err := s.MoveDue(ctx)
		if n > 0 && moved != nil {
			moved(n)
		}
		var wait <-chan zk.Event
		timeout := time.Duration(-1)
		switch {
		case errors.Is(err, zk.ErrNoNode) && w == nil:
			// No parent yet (a queue of an older layout): wait for it.
			ok, _, ew, xerr := s.items.conn.ExistsW(s.path)
			switch {
			case xerr != nil:
				timeout = schedulerRetry
			case ok:
				timeout = 0
			default:
				wait = ew
			}
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if onErr != nil {
				onErr(err)
			}
			timeout = schedulerRetry
		default:
			wait = w
			if !next.IsZero() {
				timeout = max(time.Until(next), time.Millisecond)
			}
		}
		var tc <-chan time.Time
		if timeout >= 0 {
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
			t.Reset(timeout)
			tc = t.C
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wait:
			// Coalesce a burst of changes into one listing.
			if gap := schedulerGap - time.Since(started); gap > 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(gap):
				}
			}
		case <-tc:
		}
	}
}
