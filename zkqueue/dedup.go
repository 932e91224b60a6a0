package zkqueue

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Idempotent publish (WithDedup).
//
// A draft with a DedupID leaves a record of its id under the queue's
// dedup parent, in the same transaction as the message, so both exist or
// neither does:
//
//	<dedup>/<bucket>/<id>   data: the message's id (empty until recorded)
//
// Time is cut into buckets of one window W (bucket b holds the publishes
// of [b*W, (b+1)*W), named by b zero-padded to 19 digits), and a publish at
// time t creates its record in bucket(t) and in bucket(t)+1. A repeat at
// t' < t+W falls into one of those two buckets and creates its record
// there too: ZooKeeper refuses it (NodeExists), the whole transaction
// fails, nothing is written, and the repeat is answered with the id stored
// in the record. A repeat at t' >= t+2W no longer meets either record, so
// an id is remembered at least W and at most 2W, whether or not the old
// buckets were deleted yet: deleting them (ExpireDedup) only frees memory,
// a whole bucket at a time, never a record per poll.
//
// The message's id is its sequential node's name, which ZooKeeper picks
// when the transaction commits, so the records are written without it and
// get it right after, in a second transaction (setData, group-committed
// like every write). A repeat that finds a record still empty waits for it
// briefly; a record whose publisher died between the two transactions
// stays empty, and its repeats are answered as duplicates without an id.
//
// A delayed message (Scheduled.PublishReceipts) is remembered until it is
// due plus one window, not from its publish alone: a retry during a long
// delay must still find it. Its records are created, with its delayed
// node, in every bucket from bucket(t) to bucket(due)+1, which a repeat at
// any t' before due+W meets (its own bucket or the next is among them), so
// its id is remembered until at least due+W and at most due+2W. The span
// is bounded by MaxDedupBuckets: a message due further ahead is
// remembered for MaxDedupBuckets-1 windows from its publish, not until
// due. The bound keeps one message's records (a node each, in its
// transaction, and a setData each after it) small whatever the window and
// the delay; a retry comes within seconds of its first try, well inside
// it, and with the default window (5 minutes) and --max-delay (15
// minutes) no delay reaches it. Its repeats are
// answered with its delayed id, before it is due and after it joined the
// queue under an id of its own.
//
// Two copies of one id in one batch: the later is a duplicate of the
// earlier. A batch whose transaction fails on one record loses only that
// message (a duplicate) and is committed again without it: the others are
// published atomically, as a batch without the duplicate would be.

// Bounds of a dedup window and id.
const (
	DefaultDedupWindow = 5 * time.Minute
	MinDedupWindow     = time.Second
	MaxDedupWindow     = time.Hour
	MaxDedupID         = 128
	// MaxDedupBuckets bounds the buckets one message's records span: 2
	// for a message ready at once, up to this many for a delayed one
	// (see dedup.go).
	MaxDedupBuckets = 16
)

// ErrBadDedupID is returned for a dedup id outside its charset or length,
// or given to a queue without WithDedup.
var ErrBadDedupID = errors.New("zkqueue: bad deduplication id")

// dedupPendingWait bounds how long a repeat waits for a record its
// publisher has not filled in yet.
const dedupPendingWait = 5 * time.Second

// dedupMargin is how long after its last use a bucket is kept, for the
// clocks of publishers running behind the deleter's: 10s, or one window
// if shorter.
const dedupMargin = 10 * time.Second

// CheckDedupID accepts an id of [A-Za-z0-9._-]{1,128}, not "." or "..":
// a node name as it is.
func CheckDedupID(id string) error {
	if len(id) > MaxDedupID {
		return fmt.Errorf("%w: %d bytes > %d", ErrBadDedupID, len(id), MaxDedupID)
	}
	if err := zkutil.CheckName(id); err != nil {
		return fmt.Errorf("%w: %v", ErrBadDedupID, err)
	}
	return nil
}

// CheckDedupWindow accepts a window in [MinDedupWindow, MaxDedupWindow].
func CheckDedupWindow(w time.Duration) error {
	if w < MinDedupWindow || w > MaxDedupWindow {
		return fmt.Errorf("dedup window %v out of range [%v, %v]", w, MinDedupWindow, MaxDedupWindow)
	}
	return nil
}

// WithDedup enables idempotent publish (Draft.DedupID) with records under
// dir, remembered for window (see dedup.go). dir's parent must exist; dir
// and its buckets are created when first needed, even WithoutCreate (they
// lie inside the queue, which a deletion removes whole). Every process
// publishing to the queue should use the same dir and window.
func WithDedup(dir string, window time.Duration) Option {
	return func(o *options) { o.dedupDir, o.dedupWindow = dir, window }
}

// dedup is a Queue's state of WithDedup.
//
// The part makes the records of a publish with dedup ids and answers
// repeats; a Queue without WithDedup has none, and a publish without a
// dedup id never reaches it. It is safe for concurrent use.
type dedup struct {
	*core
	prod   *producer
	dir    string
	window time.Duration
	known  atomic.Int64 // the last bucket known to exist (0: none)
}

func (o *options) validateDedup() error {
	if o.dedupDir == "" && o.dedupWindow == 0 {
		return nil
	}
	if o.dedupDir == "" || o.dedupDir[0] != '/' || path.Clean(o.dedupDir) != o.dedupDir || o.dedupDir == "/" {
		return fmt.Errorf("zkqueue: bad dedup path %q", o.dedupDir)
	}
	if err := CheckDedupWindow(o.dedupWindow); err != nil {
		return fmt.Errorf("zkqueue: %w", err)
	}
	return nil
}

func dedupBucket(t time.Time, w time.Duration) int64 { return t.UnixNano() / int64(w) }

func bucketName(b int64) string { return fmt.Sprintf("%0*d", segDigits, b) }

func (d *dedup) record(b int64, id string) string {
	return d.dir + "/" + bucketName(b) + "/" + id
}

// checkDedup checks a draft's dedup id against the queue.
func (q *Queue) checkDedup(id string) error {
	if q.dedup == nil {
		return fmt.Errorf("%w: the queue has no deduplication", ErrBadDedupID)
	}
	return CheckDedupID(id)
}

// bytes is what the records of id add to a publish transaction at
// now of a message due at due (zero: at once).
func (d *dedup) bytes(id string, now, due time.Time) int {
	b := dedupBucket(now, d.window)
	n := d.lastBucket(b, now, due) - b + 1
	return int(n) * (len(d.dir) + segDigits + len(id) + 2 + opOverhead)
}

// lastBucket returns the last bucket of the records of a message published
// at now, in bucket b, due at due (zero: at once): the bucket after its due
// time's (or now's), at most MaxDedupBuckets-1 after b.
func (d *dedup) lastBucket(b int64, now, due time.Time) int64 {
	if !due.After(now) {
		return b + 1
	}
	return min(max(dedupBucket(due, d.window)+1, b+1), b+MaxDedupBuckets-1)
}

// ensureBuckets creates buckets b to last (and the dedup parent) unless
// known to exist.
func (d *dedup) ensureBuckets(b, last int64) error {
	if d.known.Load() >= last {
		return nil
	}
	for k := b; k <= last; k++ {
		p := d.dir + "/" + bucketName(k)
		_, err := d.zk.Create(p, nil, 0, d.opt.acl)
		if errors.Is(err, zk.ErrNoNode) {
			if _, err = d.zk.Create(d.dir, nil, 0, d.opt.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return fmt.Errorf("create %s: %w", d.dir, err)
			}
			_, err = d.zk.Create(p, nil, 0, d.opt.acl)
		}
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", p, err)
		}
	}
	if cur := d.known.Load(); cur < last {
		d.known.CompareAndSwap(cur, last)
	}
	return nil
}

// Receipt is the outcome of one message of PublishReceipts.
type Receipt struct {
	// ID is the message's id; for a duplicate, the first publish's id
	// ("" in the rare case that its publisher died before recording it).
	ID string
	// Duplicate is set for a repeat of a dedup id within the window:
	// nothing was published for it.
	Duplicate bool
}

// PublishReceipts publishes drafts as PublishAll does (all in one
// transaction, in order), except that drafts repeating a dedup id within
// the window are left out and answered with the first publish's id (see
// dedup.go). Errors: as PublishAll, ErrBadDedupID.
func (q *Queue) PublishReceipts(ctx context.Context, drafts []Draft) ([]Receipt, error) {
	if err := q.checkDrafts(drafts); err != nil {
		return nil, err
	}
	// One message is bounded by the payload limit alone, as in
	// PublishDraft: its records add a few hundred bytes, within the room
	// HardMaxPayload leaves below jute.maxbuffer.
	if len(drafts) != 1 {
		if err := q.checkBatch(drafts); err != nil {
			return nil, q.wrap("publish", err)
		}
	}
	if !hasDedup(drafts) {
		paths, err := q.prod.publish(ctx, drafts)
		if err != nil {
			return nil, q.wrap("publish", err)
		}
		rs := make([]Receipt, len(paths))
		for i, p := range paths {
			rs[i].ID = path.Base(p)
		}
		return rs, nil
	}
	rs, err := q.dedup.publishReceipts(ctx, drafts, nil, nil)
	return rs, q.wrap("publish", err)
}

// publishReceipts publishes checked drafts, some with dedup ids; with
// sch, each at its due time (due[i], see Scheduled.PublishAll): a delayed
// one's node is created in the transaction of its records.
func (d *dedup) publishReceipts(ctx context.Context, drafts []Draft, sch *Scheduled, due []time.Time) ([]Receipt, error) {
	out := make([]Receipt, len(drafts))
	same := sameIDs(drafts)
	done := make([]bool, len(drafts)) // answered as duplicates
	drafts = withGroupTokens(drafts)
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if attempt > len(drafts)+4 {
			return nil, fmt.Errorf("dedup: %d attempts", attempt)
		}
		r := d.dedupRound(drafts, func(i int) bool { return !done[i] && same[i] < 0 }, sch, due, time.Now())
		if len(r.idx) == 0 {
			break
		}
		if err := d.ensureBuckets(r.bucket, r.last); err != nil {
			return nil, err
		}
		res, paths, err := d.prod.commit(ctx, appendReq{pre: r.pre, levels: r.levels, datas: r.datas, attrs: r.attrs, extra: r.records})
		var oe *extraOpError
		switch {
		case err == nil:
			j, k := 0, 0
			for n, i := range r.idx {
				if r.delayed[n] {
					out[i] = Receipt{ID: path.Base(res[j].String)}
					j++
					continue
				}
				out[i] = Receipt{ID: path.Base(paths[k])}
				k++
			}
			d.recordIDs(ctx, r.records, r.owners, out)
		case errors.As(err, &oe) && errors.Is(oe.Err, zk.ErrNodeExists):
			i := r.owners[oe.Index]
			id, err := d.recorded(ctx, r.records[oe.Index].(*zk.CreateRequest).Path)
			if errors.Is(err, zk.ErrNoNode) {
				continue // expired meanwhile: publish it
			}
			if err != nil {
				return nil, err
			}
			out[i], done[i] = Receipt{ID: id, Duplicate: true}, true
			continue
		case errors.As(err, &oe) && errors.Is(oe.Err, zk.ErrNoNode):
			d.known.Store(0) // a bucket was deleted (clocks apart): create it again
			continue
		default:
			return nil, err
		}
		break
	}
	for i, j := range same {
		if j >= 0 {
			out[i] = Receipt{ID: out[j].ID, Duplicate: true}
		}
	}
	return out, nil
}

// sameIDs returns, for each draft, the earlier draft of the batch with
// its dedup id, or -1.
func sameIDs(drafts []Draft) []int {
	same := make([]int, len(drafts))
	first := map[string]int{}
	for i, d := range drafts {
		same[i] = -1
		if d.DedupID == "" {
			continue
		}
		if j, ok := first[d.DedupID]; ok {
			same[i] = j
		} else {
			first[d.DedupID] = i
		}
	}
	return same
}

// dedupRound is one attempt of publishReceipts: the drafts still to
// publish (idx), each delayed (with its node's create in pre) or ready at
// once (with its priority, data and attributes), and the dedup records
// created with them in buckets bucket to last, each with the draft it
// belongs to (owners).
type dedupRound struct {
	idx, levels, owners []int
	delayed             []bool // of each of idx
	pre                 []any
	datas               [][]byte
	attrs               []Attributes
	records             []any
	bucket, last        int64
}

func (d *dedup) dedupRound(drafts []Draft, pending func(int) bool, sch *Scheduled, due []time.Time, now time.Time) dedupRound {
	r := dedupRound{bucket: dedupBucket(now, d.window)}
	r.last = r.bucket + 1
	for i, dr := range drafts {
		if !pending(i) {
			continue
		}
		var at time.Time
		if sch != nil {
			at = due[i]
		}
		data := EncodeData(Message{Payload: dr.Payload, Attributes: dr.Attributes, Published: now})
		r.idx = append(r.idx, i)
		r.delayed = append(r.delayed, at.After(now))
		if at.After(now) {
			r.pre = append(r.pre, sch.createOp(at, dr.Priority, data))
		} else {
			r.levels = append(r.levels, dr.Priority)
			r.datas = append(r.datas, data)
			r.attrs = append(r.attrs, dr.Attributes)
		}
		if dr.DedupID == "" {
			continue
		}
		last := d.lastBucket(r.bucket, now, at)
		r.last = max(r.last, last)
		for k := r.bucket; k <= last; k++ {
			r.records = append(r.records, &zk.CreateRequest{Path: d.record(k, dr.DedupID), Acl: d.opt.acl})
			r.owners = append(r.owners, i)
		}
	}
	return r
}

// recordIDs writes the ids of the messages just published into their
// records. It runs even when ctx ended (the messages exist), bounded; a
// failure leaves the records empty, which their repeats tolerate.
func (d *dedup) recordIDs(ctx context.Context, records []any, owners []int, out []Receipt) {
	if len(records) == 0 {
		return
	}
	ops := make([]any, len(records))
	for k, r := range records {
		ops[k] = &zk.SetDataRequest{Path: r.(*zk.CreateRequest).Path, Data: []byte(out[owners[k]].ID), Version: 0}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := d.write(ctx, ops...); err != nil {
		d.opt.logger.Warn("recording dedup ids failed; their repeats will be answered without an id", "err", err)
	}
}

// recorded returns the message id in record p, waiting up to
// dedupPendingWait for a record not filled in yet; "" when it stays empty.
func (d *dedup) recorded(ctx context.Context, p string) (string, error) {
	deadline := time.NewTimer(dedupPendingWait)
	defer deadline.Stop()
	for {
		data, _, w, err := d.zk.GetW(p)
		if err != nil {
			return "", fmt.Errorf("get %s: %w", p, err)
		}
		if len(data) > 0 {
			return string(data), nil
		}
		select {
		case <-w:
		case <-deadline.C:
			return "", nil
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// extraOpError is the failure of one of the extra ops of appendWith:
// Index counts among them.
type extraOpError struct {
	Index int
	Err   error
}

func (e *extraOpError) Error() string { return fmt.Sprintf("op %d: %v", e.Index, e.Err) }
func (e *extraOpError) Unwrap() error { return e.Err }

// ExpireDedup deletes the buckets under the dedup parent dir that no
// publish with window needs at now any more (a bucket is used by the
// publishes of its own and the previous window; it is kept dedupMargin
// longer, up to 10s, for clocks running behind). It returns the records deleted, when
// the next bucket is due (zero when none is left), and a watch of dir's
// children that fires when a bucket is created; a missing dir is watched
// for its creation. It reads and deletes only buckets, never polls a
// record.
func ExpireDedup(ctx context.Context, conn *zk.Conn, dir string, window time.Duration, now time.Time) (deleted int, next time.Time, watch <-chan zk.Event, err error) {
	if err := CheckDedupWindow(window); err != nil {
		return 0, time.Time{}, nil, fmt.Errorf("zkqueue: %w", err)
	}
	children, _, w, err := conn.ChildrenW(dir)
	if errors.Is(err, zk.ErrNoNode) {
		ok, _, w, err := conn.ExistsW(dir)
		switch {
		case err != nil:
			return 0, time.Time{}, nil, fmt.Errorf("zkqueue: exists %s: %w", dir, err)
		case ok:
			return ExpireDedup(ctx, conn, dir, window, now) // created meanwhile
		}
		return 0, time.Time{}, w, nil
	}
	if err != nil {
		return 0, time.Time{}, nil, fmt.Errorf("zkqueue: children %s: %w", dir, err)
	}
	var buckets []int64
	for _, c := range children {
		if b, err := strconv.ParseInt(c, 10, 64); err == nil && len(c) == segDigits {
			buckets = append(buckets, b)
		}
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i] < buckets[j] })
	margin := min(dedupMargin, window)
	for _, b := range buckets {
		until := time.Unix(0, (b+1)*int64(window)).Add(margin)
		if now.Before(until) {
			return deleted, until, w, nil
		}
		p := dir + "/" + bucketName(b)
		n, err := zkutil.NumChildren(conn, p)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return deleted, time.Time{}, w, fmt.Errorf("zkqueue: %w", err)
		}
		if err := zkutil.DeleteTree(ctx, conn, p, nil); err != nil {
			return deleted, time.Time{}, w, fmt.Errorf("zkqueue: delete %s: %w", p, err)
		}
		deleted += n
	}
	return deleted, time.Time{}, w, nil
}
