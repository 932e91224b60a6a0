// Package qcore is the engine shared by qbroker's queue recipes (zkqueue,
// priority) and the broker: node names and their order, the message
// encoding, the watch-driven head scan, claims, and leases for
// acknowledged delivery. It knows nothing of gRPC, NATS or Prometheus.
package qcore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Limits. A Multi request, like every ZooKeeper packet, must stay below
// jute.maxbuffer (1 MiB by default).
const (
	DefaultMaxPayload    = 512 << 10
	DefaultMaxBatchBytes = 900 << 10
	DefaultMaxBatchCount = 1000
	// HardMaxPayload bounds MaxPayload: one node's data plus its header
	// and path must fit in one packet.
	HardMaxPayload = zkutil.MaxBuffer - 16<<10
	// opOverhead approximates a Multi op's framing, path and ACL bytes.
	opOverhead = 96
)

// Config tunes a Store. Zero fields take the defaults above.
type Config struct {
	MaxPayload    int
	MaxBatchBytes int
	MaxBatchCount int
	// Strict makes the scan drop its cached snapshot whenever the children
	// changed, so a newly published message that sorts before the cached
	// head is seen at the next claim (priority queues need this). A FIFO
	// queue walks its snapshot to the end: new messages sort after it.
	Strict bool
	// ConflictHook, when set, is called once per lost race for a head
	// message (NoNode or BadVersion while claiming).
	ConflictHook func()
	Logger       *slog.Logger
	// Observer, when set, sees every ZooKeeper request of the Store.
	Observer Observer
	// Share, when set, tells this process's rank among the n processes
	// consuming the queue (brokers); it is asked at every scan. Each takes
	// the messages whose sequence number is its rank modulo n first, so
	// brokers do not race each other for the same head. Nil means one
	// process takes all.
	Share func() (rank, n int)
	// Readers, when set, are the sessions (to the same ensemble) over
	// which claims spread their reads instead of the Store's own. Keep
	// them free of writes: ZooKeeper answers a session's read only after
	// that session's earlier writes have committed.
	Readers []*zk.Conn
	// Batcher, when set, carries the Store's writes (publishes, claims,
	// acks, releases) so concurrent ones share Multi transactions.
	Batcher *Batcher
	// Recent bounds the memory spent remembering the messages this
	// process published, so that its consumers claim them without reading
	// them back (see recent). Share one Budget among all the Stores of a
	// process to bound the total; nil means a Budget of
	// DefaultRecentBytes for this Store alone.
	Recent *Budget
	// NoCreate: NewStore and NewLeases only read; the parents must exist
	// (a missing one fails the requests that need it with zk.ErrNoNode).
	// A process that also deletes queues needs this: a Store opened while
	// its queue is being deleted would otherwise create the parents again.
	NoCreate bool
}

// Validate fills defaults and checks the limits.
func (c *Config) Validate() error {
	if c.MaxPayload == 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxBatchCount == 0 {
		c.MaxBatchCount = DefaultMaxBatchCount
	}
	if c.MaxPayload < 0 || c.MaxPayload > HardMaxPayload {
		return fmt.Errorf("max payload %d out of range (0, %d]", c.MaxPayload, HardMaxPayload)
	}
	if c.MaxBatchBytes < 0 || c.MaxBatchBytes > HardMaxPayload {
		return fmt.Errorf("max batch bytes %d out of range (0, %d]", c.MaxBatchBytes, HardMaxPayload)
	}
	if c.MaxBatchCount < 0 {
		return fmt.Errorf("max batch count %d < 0", c.MaxBatchCount)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Recent == nil {
		c.Recent = NewBudget(DefaultRecentBytes)
	}
	return nil
}

// Store is the set of ready messages under one parent node. One Store per
// queue per process serves any number of local consumers: they share one
// sorted snapshot of the children and one children watch, take distinct
// candidates from it, and so never race each other for the head. An idle
// Store costs no ZooKeeper traffic: waiting consumers sleep on the watch.
//
// A Store is safe for concurrent use.
type Store struct {
	conn    *zk.Conn
	zk      observed
	readers []observed // zk and Config.Readers, used round-robin by claims
	next    atomic.Uint32
	path    string
	cfg     Config
	recent  *recent // data of messages published here, for read-free claims

	mu      sync.Mutex
	pending []Name          // sorted candidates of this process's share, not yet handed out
	others  []Name          // sorted candidates of other processes' shares
	claims  map[string]int  // candidates handed out whose claim is not done
	watch   <-chan zk.Event // armed children watch of path; nil when none
	foreign map[string]bool // foreign children already logged
	// scanning is closed when the listing under way ends; nil when none.
	scanning chan struct{}
	// doneWhileScanning: claims finished during the listing under way.
	doneWhileScanning map[string]bool
}

// NewStore returns the Store of the messages under p, creating p and its
// parents when missing (unless cfg.NoCreate).
func NewStore(conn *zk.Conn, p string, cfg Config) (*Store, error) {
	if conn == nil {
		return nil, errors.New("nil zk conn")
	}
	if p == "" || p[0] != '/' || path.Clean(p) != p || p == "/" {
		return nil, fmt.Errorf("bad queue path %q", p)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.NoCreate {
		if err := zkutil.EnsurePath(conn, p); err != nil {
			return nil, err
		}
	}
	s := &Store{conn: conn, zk: observed{conn, cfg.Observer}, path: p, cfg: cfg,
		recent: newRecent(cfg.Recent), foreign: map[string]bool{}, claims: map[string]int{}, doneWhileScanning: map[string]bool{}}
	for _, r := range cfg.Readers {
		s.readers = append(s.readers, observed{r, cfg.Observer})
	}
	if len(s.readers) == 0 {
		s.readers = []observed{s.zk}
	}
	return s, nil
}

// Path returns the parent node of the messages.
func (s *Store) Path() string { return s.path }

// CheckPayload returns ErrTooLarge when payload exceeds the limit.
func (s *Store) CheckPayload(payload []byte) error {
	if len(payload) > s.cfg.MaxPayload {
		return fmt.Errorf("%w: %d bytes > %d", ErrTooLarge, len(payload), s.cfg.MaxPayload)
	}
	return nil
}

// Publish creates one message node named prefix+<sequence> and returns its
// name.
func (s *Store) Publish(ctx context.Context, prefix string, payload []byte) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if err := s.CheckPayload(payload); err != nil {
		return "", err
	}
	data := EncodeData(payload, time.Now(), 0)
	res, err := s.write(&zk.CreateRequest{
		Path:  s.path + "/" + prefix,
		Data:  data,
		Acl:   zk.WorldACL(zk.PermAll),
		Flags: zk.FlagSequence,
	})
	if err != nil {
		return "", fmt.Errorf("create in %s: %w", s.path, err)
	}
	return s.created(res[0].String, data), nil
}

// PublishBatch creates all messages in one Multi transaction: all or none.
// prefixes[i] names payloads[i]. A batch over the count or byte limits is
// rejected before anything is written.
func (s *Store) PublishBatch(ctx context.Context, prefixes []string, payloads [][]byte) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if len(payloads) == 0 {
		return nil, ErrEmptyBatch
	}
	if len(prefixes) != len(payloads) {
		return nil, fmt.Errorf("%d prefixes for %d payloads", len(prefixes), len(payloads))
	}
	if len(payloads) > s.cfg.MaxBatchCount {
		return nil, fmt.Errorf("%w: %d messages > %d", ErrBatchTooLarge, len(payloads), s.cfg.MaxBatchCount)
	}
	// The byte limit bounds the Multi request, so it counts what each
	// message adds to it besides its payload (MessageOverhead), not the
	// payloads alone: with MaxBatchBytes <= HardMaxPayload a batch is one
	// request below jute.maxbuffer.
	total, overhead := 0, 0
	for _, p := range payloads {
		if err := s.CheckPayload(p); err != nil {
			return nil, err
		}
		total += len(p)
		overhead += s.MessageOverhead()
	}
	if total+overhead > s.cfg.MaxBatchBytes {
		return nil, fmt.Errorf("%w: %d messages are %d bytes including %d bytes of per-message overhead > %d",
			ErrBatchTooLarge, len(payloads), total+overhead, overhead, s.cfg.MaxBatchBytes)
	}
	now := time.Now()
	ops := make([]any, len(payloads))
	for i, p := range payloads {
		ops[i] = &zk.CreateRequest{
			Path:  s.path + "/" + prefixes[i],
			Data:  EncodeData(p, now, 0),
			Acl:   zk.WorldACL(zk.PermAll),
			Flags: zk.FlagSequence,
		}
	}
	res, err := s.write(ops...)
	if err != nil {
		return nil, fmt.Errorf("multi create in %s: %w", s.path, err)
	}
	ids := make([]string, len(res))
	for i, r := range res {
		ids[i] = s.created(r.String, ops[i].(*zk.CreateRequest).Data)
	}
	return ids, nil
}

// MessageOverhead is what each message of a batch counts against
// MaxBatchBytes besides its payload: its header (HeaderMax), its node path
// (the parent's path and "/" + the longest name prefix + 10 digits) and the
// framing and ACL of its create op. For a queue's items under /qbroker it
// is 157 bytes plus the length of the queue name.
func (s *Store) MessageOverhead() int {
	return HeaderMax + len(s.path) + 16 + opOverhead
}

// created notes a message this process created at path p with data, and
// returns its name.
func (s *Store) created(p string, data []byte) string {
	name := path.Base(p)
	if n, ok := ParseName(name); ok {
		s.recent.put(n, data)
	}
	return name
}

// reader returns the session for a claim's read, round-robin.
func (s *Store) reader() observed {
	if len(s.readers) == 1 {
		return s.readers[0]
	}
	return s.readers[int(s.next.Add(1))%len(s.readers)]
}

// write runs ops as one transaction: through the Batcher when there is
// one, else as a plain request (one op) or a Multi. Errors name the
// failing op's cause.
func (s *Store) write(ops ...any) ([]zk.MultiResponse, error) {
	if s.cfg.Batcher != nil {
		return s.cfg.Batcher.Do(ops...)
	}
	if len(ops) == 1 {
		switch o := ops[0].(type) {
		case *zk.CreateRequest:
			p, err := s.zk.Create(o.Path, o.Data, o.Flags, o.Acl)
			return []zk.MultiResponse{{String: p, Error: err}}, err
		case *zk.DeleteRequest:
			err := s.zk.Delete(o.Path, o.Version)
			return []zk.MultiResponse{{Error: err}}, err
		}
	}
	res, err := s.zk.Multi(ops...)
	return res, multiErr(res, err)
}

// firstMultiError returns the error of the failing op of a Multi, which is
// more telling than the transaction's.
func firstMultiError(res []zk.MultiResponse, err error) error {
	for _, r := range res {
		if r.Error != nil && !errors.Is(r.Error, zk.ErrAPIError) {
			return r.Error
		}
	}
	return err
}

// scan lists the children into a new snapshot. It is called with s.mu
// held and returns with it held, but releases it for the round trip, so
// claims finishing meanwhile (Done) and callers served from the snapshot
// are not held up; concurrent callers that need a listing wait for this
// one. It is called once the watch has fired (or was never set), and arms
// a new one with the listing.
func (s *Store) scan() error {
	if s.scanning != nil {
		ch := s.scanning
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
		return nil
	}
	done := make(chan struct{})
	s.scanning = done
	clear(s.doneWhileScanning)
	s.mu.Unlock()

	children, _, w, err := s.zk.ChildrenW(s.path)
	var names []Name
	var foreign []string
	if err == nil {
		names, foreign = SortNames(children)
		s.recent.prune(names)
	}

	s.mu.Lock()
	s.scanning = nil
	close(done)
	if err != nil {
		return fmt.Errorf("children %s: %w", s.path, err)
	}
	s.watch = w
	if len(s.claims) > 0 || len(s.doneWhileScanning) > 0 {
		// Candidates being claimed by this process's consumers, or
		// claimed while the listing was under way (it may predate
		// their delete), are not handed out again: that would be a
		// race with ourselves.
		names = slices.DeleteFunc(names, func(n Name) bool {
			return s.claims[n.Raw] > 0 || s.doneWhileScanning[n.Raw]
		})
	}
	for _, f := range foreign {
		if !s.foreign[f] && len(s.foreign) < 1000 {
			s.foreign[f] = true
			s.cfg.Logger.Warn("skipping foreign node in queue", "znode", s.path+"/"+f)
		}
	}
	s.pending, s.others = splitShare(names, s.cfg.Share)
	return nil
}

// watchFiredLocked reports whether the armed watch has fired, disarming it.
// Fired watch channels are closed by the client, so every waiter holding
// the same channel still wakes.
func (s *Store) watchFiredLocked() bool {
	if s.watch == nil {
		return true
	}
	select {
	case <-s.watch:
		s.watch = nil
		return true
	default:
		return false
	}
}

// Next hands out the next candidate message name. When there is none it
// returns ok == false and a channel that fires on the next change of the
// children. Candidates are handed out once per snapshot, so concurrent
// callers in this process never get the same name from one snapshot.
func (s *Store) Next() (n Name, ok bool, wait <-chan zk.Event, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for scanned := false; ; scanned = true {
		fired := s.watchFiredLocked()
		if fired && s.cfg.Strict && !scanned {
			s.pending, s.others = nil, nil
		}
		if len(s.pending) == 0 && fired && !scanned {
			// Something changed since the last scan (or there was none).
			if err := s.scan(); err != nil {
				return Name{}, false, nil, err
			}
			continue
		}
		switch {
		case len(s.pending) > 0:
			n = s.pending[0]
			s.pending = s.pending[1:]
		case len(s.others) > 0:
			// Our share is used up and nothing new arrived: help the
			// others with theirs, in queue order.
			n = s.others[0]
			s.others = s.others[1:]
		default:
			if s.watch == nil {
				// The children changed again since the listing just
				// made, or the listing we waited for failed: the
				// caller tries again at once.
				return Name{}, false, closedWatch, nil
			}
			// The watch is armed and unfired: the children are what
			// the last listing saw, all of them handed out.
			return Name{}, false, s.watch, nil
		}
		s.claims[n.Raw]++
		return n, true, nil, nil
	}
}

// closedWatch is a fired wait: the caller tries again at once.
var closedWatch = func() <-chan zk.Event {
	ch := make(chan zk.Event)
	close(ch)
	return ch
}()

// Done reports that the claim of a candidate from Next has finished, won
// or lost. Until then, rescans leave the candidate out.
func (s *Store) Done(n Name) {
	s.mu.Lock()
	if s.claims[n.Raw]--; s.claims[n.Raw] <= 0 {
		delete(s.claims, n.Raw)
	}
	if s.scanning != nil {
		s.doneWhileScanning[n.Raw] = true
	}
	s.mu.Unlock()
}

// giveBack returns a candidate from Next whose claim was not attempted
// (it did not fit the caller's Room): it is handed out again first. A FIFO
// snapshot would otherwise pass it by until the children change.
func (s *Store) giveBack(n Name) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claims[n.Raw]--; s.claims[n.Raw] <= 0 {
		delete(s.claims, n.Raw)
	}
	// A listing under way includes it (it was not deleted) and replaces
	// the snapshot anyway.
	i, _ := slices.BinarySearchFunc(s.pending, n, Compare)
	for j := i; j < len(s.pending) && Compare(s.pending[j], n) == 0; j++ {
		if s.pending[j].Raw == n.Raw {
			return
		}
	}
	s.pending = slices.Insert(s.pending, i, n)
}

// splitShare divides a sorted snapshot between the processes consuming the
// queue: a message belongs to process seq mod n, which takes its own share
// first. Shares are stable across snapshots (the sequence number never
// changes), so processes claim disjoint messages unless one steals from
// another's share after using up its own.
func splitShare(names []Name, share func() (rank, n int)) (mine, others []Name) {
	if share == nil {
		return names, nil
	}
	rank, n := share()
	if n <= 1 || rank < 0 || rank >= n {
		return names, nil
	}
	mine = make([]Name, 0, len(names)/n+1)
	others = make([]Name, 0, len(names)-len(names)/n)
	for _, nm := range names {
		if int(uint32(nm.Seq)%uint32(n)) == rank {
			mine = append(mine, nm)
		} else {
			others = append(others, nm)
		}
	}
	return mine, others
}

// Reset drops the cached snapshot so the next call scans again: after an
// error left the snapshot in doubt, or after this process put a message
// back at the head, which a FIFO snapshot would pass over until used up.
func (s *Store) Reset() {
	s.mu.Lock()
	s.pending, s.others = nil, nil
	s.watch = nil
	s.mu.Unlock()
}

// ClaimFunc claims one candidate. It returns zk.ErrNoNode or
// zk.ErrBadVersion when another consumer won the race.
type ClaimFunc[T any] func(ctx context.Context, n Name) (T, error)

// FitClaimFunc claims one candidate within a Room: after reading the
// candidate and before writing anything, it asks fit whether the
// message's payload still fits, and if not returns an error wrapping
// ErrNoRoom with the candidate untouched. It calls fit at most once.
// Lost races are as for ClaimFunc.
type FitClaimFunc[T any] func(ctx context.Context, n Name, fit Fit) (T, error)

// Fit reports whether a message with a payload of the given size fits
// what the caller can still take. A nil Fit admits everything.
type Fit func(payload int) bool

func (f Fit) admits(payload int) bool { return f == nil || f(payload) }

// Room bounds the bytes of the messages one take hands out, for callers
// whose answer has a size limit (a gRPC response). Each message counts
// its payload plus Overhead. The first message claimed always fits, so a
// message larger than Bytes is still delivered, alone; the zero Room is
// unbounded.
type Room struct {
	Bytes    int
	Overhead int
}

// fitter decides, in queue order, which of one round's candidates fit its
// Room: candidate i's decision waits for candidate i-1's, so the messages
// taken are a prefix of the round's candidates in queue order (less the
// races lost), whatever order their reads finish in. Once one does not
// fit, no later one does.
type fitter struct {
	room    Room
	decided []chan struct{} // decided[i] is closed once candidate i is decided
	once    []sync.Once

	mu    sync.Mutex
	used  int
	taken int
	full  bool
}

// newFitter returns the fitter of n candidates; nil for an unbounded
// Room, which admits everything.
func newFitter(room Room, n int) *fitter {
	if room.Bytes <= 0 {
		return nil
	}
	f := &fitter{room: room, decided: make([]chan struct{}, n), once: make([]sync.Once, n)}
	for i := range f.decided {
		f.decided[i] = make(chan struct{})
	}
	return f
}

// done marks candidate i decided (called after its claim too, for claims
// that ended before asking).
func (f *fitter) done(i int) {
	if f != nil {
		f.once[i].Do(func() { close(f.decided[i]) })
	}
}

func (f *fitter) fit(ctx context.Context, i int) Fit {
	if f == nil {
		return nil
	}
	return func(payload int) bool {
		defer f.done(i)
		if i > 0 {
			select {
			case <-f.decided[i-1]:
			case <-ctx.Done():
				return false
			}
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		size := payload + f.room.Overhead
		switch {
		case f.full:
			return false
		case f.taken == 0 || f.used+size <= f.room.Bytes:
			f.used += size
			f.taken++
			return true
		}
		f.full = true
		return false
	}
}

// Take walks the candidates, claiming with claim until one succeeds. Lost
// races move on to the next candidate; the snapshot is re-scanned only when
// used up. With block it waits on the children watch for new messages
// until ctx ends; without, it returns ErrEmpty.
func Take[T any](ctx context.Context, s *Store, block bool, claim ClaimFunc[T]) (T, error) {
	var zero T
	vs, err := TakeN(ctx, s, 1, block, claim)
	if err != nil {
		return zero, err
	}
	return vs[0], nil
}

// TakeN claims up to k messages: it waits (with block) for the first
// candidate, adds the candidates available at once, up to k, and claims
// them concurrently, so their writes share a Multi when the Store has a
// Batcher. Results come in queue order; lost races are skipped (and, if
// all were lost, TakeN tries again). It returns ErrEmpty when nothing is
// there and block is false.
func TakeN[T any](ctx context.Context, s *Store, k int, block bool, claim ClaimFunc[T]) ([]T, error) {
	return TakeWithin(ctx, s, k, Room{}, block, func(ctx context.Context, n Name, _ Fit) (T, error) {
		return claim(ctx, n)
	})
}

// TakeWithin is TakeN bounded by room as well as by count: claims stop
// at the first message that would take the total past room.Bytes (the
// first message always fits). A candidate that does not fit is given back
// untouched, at its place in the queue, and is the first one handed out
// next.
func TakeWithin[T any](ctx context.Context, s *Store, k int, room Room, block bool, claim FitClaimFunc[T]) ([]T, error) {
	s.recent.taking(+1)
	defer s.recent.taking(-1)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, ok, wait, err := s.Next()
		if err != nil {
			return nil, err
		}
		if !ok {
			if !block {
				return nil, ErrEmpty
			}
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		cands := []Name{n}
		for len(cands) < k {
			n, ok, _, err := s.Next()
			if err != nil || !ok {
				break
			}
			cands = append(cands, n)
		}
		f := newFitter(room, len(cands))
		vals := make([]T, len(cands))
		errs := make([]error, len(cands))
		claimOne := func(i int) {
			vals[i], errs[i] = claim(ctx, cands[i], f.fit(ctx, i))
			f.done(i)
			if errors.Is(errs[i], ErrNoRoom) {
				s.giveBack(cands[i])
			} else {
				s.Done(cands[i])
			}
		}
		if len(cands) == 1 {
			claimOne(0)
		} else {
			var wg sync.WaitGroup
			for i := range cands {
				wg.Add(1)
				go func() {
					defer wg.Done()
					claimOne(i)
				}()
			}
			wg.Wait()
		}
		var out []T
		var failed error
		for i, err := range errs {
			switch {
			case err == nil:
				out = append(out, vals[i])
			case errors.Is(err, ErrNoRoom):
			case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
				if s.cfg.ConflictHook != nil {
					s.cfg.ConflictHook()
				}
			default:
				failed = err
			}
		}
		if failed != nil {
			s.Reset()
			if len(out) == 0 {
				return nil, failed
			}
		}
		if len(out) > 0 {
			return out, nil
		}
	}
}

// ClaimDelete is the at-most-once claim: getData, then delete at the read
// version. Whoever deletes the node owns the message. If the delete's
// outcome is unknown (connection lost), the message is not returned: it
// may be lost, never delivered twice.
func (s *Store) ClaimDelete(ctx context.Context, n Name) (Message, error) {
	return s.ClaimDeleteFit(ctx, n, nil)
}

// ClaimDeleteFit is ClaimDelete within a Room (see FitClaimFunc): a
// message that does not fit is not deleted.
func (s *Store) ClaimDeleteFit(ctx context.Context, n Name, fit Fit) (Message, error) {
	p := s.path + "/" + n.Raw
	data, version, ctime, err := s.readItem(p, n)
	if err != nil {
		return Message{}, err
	}
	// Undecodable data is deleted all the same (and reported), so that
	// it cannot block the queue.
	m, decodeErr := decodeMessage(n, data, ctime, 1)
	if decodeErr == nil && !fit.admits(len(m.Payload)) {
		s.unread(n, data, version)
		return Message{}, fmt.Errorf("%s: %w", n.Raw, ErrNoRoom)
	}
	if _, err := s.write(&zk.DeleteRequest{Path: p, Version: version}); err != nil {
		return Message{}, fmt.Errorf("delete %s: %w", p, err)
	}
	return m, decodeErr
}

// readItem returns the data, version and creation time of candidate n at
// p for its claim: remembered when this process published it, else read.
func (s *Store) readItem(p string, n Name) (data []byte, version int32, ctime time.Time, err error) {
	if data, ok := s.recent.take(n.Raw); ok {
		// Created by this process with a header, so ctime is not needed.
		return data, 0, time.Now(), nil
	}
	data, stat, err := s.reader().Get(p)
	if err != nil {
		return nil, 0, time.Time{}, fmt.Errorf("get %s: %w", p, err)
	}
	return data, stat.Version, ctimeOf(stat), nil
}

// unread puts back what readItem took from the memory of published
// messages, for a candidate given back unclaimed. Data at version 0 is
// what the message was created with, whoever read it.
func (s *Store) unread(n Name, data []byte, version int32) {
	if version == 0 {
		s.recent.put(n, data)
	}
}

func ctimeOf(stat *zk.Stat) time.Time { return time.UnixMilli(stat.Ctime) }

func decodeMessage(n Name, data []byte, ctime time.Time, addDeliveries int) (Message, error) {
	payload, pub, deliveries, err := DecodeData(data, ctime)
	if err != nil {
		return Message{}, fmt.Errorf("%s: %w", n.Raw, ErrBadData)
	}
	return Message{ID: n.Base, Payload: payload, Priority: n.Priority, Published: pub, Deliveries: deliveries + addDeliveries}, nil
}

// TryDequeue claims the head message (at-most-once) or returns ErrEmpty.
func (s *Store) TryDequeue(ctx context.Context) (Message, error) {
	return Take(ctx, s, false, s.ClaimDelete)
}

// Dequeue claims the head message (at-most-once), waiting for one until
// ctx ends.
func (s *Store) Dequeue(ctx context.Context) (Message, error) {
	return Take(ctx, s, true, s.ClaimDelete)
}

// Peek returns the head message without claiming it, or ErrEmpty. It always
// reads a fresh child list.
func (s *Store) Peek(ctx context.Context) (Message, error) {
	children, _, err := s.zk.Children(s.path)
	if err != nil {
		return Message{}, fmt.Errorf("children %s: %w", s.path, err)
	}
	names, _ := SortNames(children)
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return Message{}, err
		}
		data, stat, err := s.zk.Get(s.path + "/" + n.Raw)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return Message{}, fmt.Errorf("get %s/%s: %w", s.path, n.Raw, err)
		}
		return decodeMessage(n, data, ctimeOf(stat), 0)
	}
	return Message{}, ErrEmpty
}

// Len returns the number of children from the parent's Stat, without
// listing them. Foreign children, if any, are counted too.
func (s *Store) Len(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	_, stat, err := s.zk.Exists(s.path)
	if err != nil {
		return 0, fmt.Errorf("exists %s: %w", s.path, err)
	}
	if stat == nil {
		return 0, nil
	}
	return int(stat.NumChildren), nil
}

// OldestAge returns the age of the head message (0 when empty). It reads
// the head of the cached snapshot when it still exists, without listing
// the children (an approximation: a message put back at the head since the
// last scan is not seen), else the head of a fresh listing.
func (s *Store) OldestAge(ctx context.Context) (time.Duration, error) {
	// The head of the cached snapshot, when there is one, saves listing
	// the children; if it is gone, Peek lists them.
	s.mu.Lock()
	var head Name
	switch {
	case len(s.pending) > 0 && (len(s.others) == 0 || Compare(s.pending[0], s.others[0]) < 0):
		head = s.pending[0]
	case len(s.others) > 0:
		head = s.others[0]
	}
	s.mu.Unlock()
	if head.Raw != "" {
		data, stat, err := s.zk.Get(s.path + "/" + head.Raw)
		if err == nil {
			if m, err := decodeMessage(head, data, ctimeOf(stat), 0); err == nil {
				return time.Since(m.Published), nil
			}
		}
	}
	m, err := s.Peek(ctx)
	if errors.Is(err, ErrEmpty) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return time.Since(m.Published), nil
}

// Purge deletes every message present when it starts and returns how many
// it deleted. Messages claimed concurrently are not counted.
func (s *Store) Purge(ctx context.Context) (int, error) {
	children, _, err := s.zk.Children(s.path)
	if err != nil {
		return 0, fmt.Errorf("children %s: %w", s.path, err)
	}
	names, _ := SortNames(children)
	raw := make([]string, len(names))
	for i, n := range names {
		raw[i] = s.path + "/" + n.Raw
	}
	return DeleteNodes(ctx, s.conn, raw)
}

// DeleteNodes deletes the given nodes, 500 to a Multi; a chunk that fails
// because a node vanished is retried node by node. It returns the count
// it deleted.
func DeleteNodes(ctx context.Context, conn *zk.Conn, paths []string) (int, error) {
	deleted := 0
	for len(paths) > 0 {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		chunk := paths[:min(500, len(paths))]
		paths = paths[len(chunk):]
		ops := make([]any, len(chunk))
		for i, p := range chunk {
			ops[i] = &zk.DeleteRequest{Path: p, Version: -1}
		}
		if _, err := conn.Multi(ops...); err == nil {
			deleted += len(chunk)
			continue
		} else if zkutil.IsUnavailable(err) {
			return deleted, err
		}
		for _, p := range chunk {
			err := conn.Delete(p, -1)
			switch {
			case err == nil:
				deleted++
			case errors.Is(err, zk.ErrNoNode):
			default:
				return deleted, fmt.Errorf("delete %s: %w", p, err)
			}
		}
	}
	return deleted, nil
}
