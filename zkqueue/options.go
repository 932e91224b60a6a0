package zkqueue

import (
	"fmt"
	"log/slog"
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

// Option configures a Queue.
type Option func(*options)

// options is what the Options set; New fills the defaults and validates
// them (validate).
type options struct {
	limits       Limits
	priorities   bool
	conflictHook func()
	badDataHook  func(znode string)
	logger       *slog.Logger
	observer     Observer
	share        func() Share
	publisher    string // the publisher tag of this process (WithPublisher)
	readers      []*zk.Conn
	committer    *Committer
	memory       *Budget
	noCreate     bool
	acl          []zk.ACL
	segmentSize  int
	dedupDir     string        // WithDedup (dedup.go)
	dedupWindow  time.Duration // WithDedup
	expiry       Expiry
	groupsDir    string // WithGroups (groups.go)

	fairness Fairness    // WithFairness (fairness.go)
	packing  *PackLimits // WithPacking (pack.go); nil: one message per node
	packHook func(count int)
}

// Limits bounds what a Queue accepts from publishers. Zero fields take the
// defaults.
type Limits struct {
	// MaxPayload is the largest payload (default 512 KiB, at most
	// HardMaxPayload).
	MaxPayload int
	// MaxBatchBytes bounds one PublishBatch: its payloads plus
	// MessageOverhead each (default 900 KiB, at most HardMaxPayload).
	MaxBatchBytes int
	// MaxBatchCount bounds the messages of one PublishBatch (default
	// 1000).
	MaxBatchCount int
}

// Validate fills the defaults and checks the ranges. It is the one place
// the limits are checked; the broker validates its flags with it.
func (l *Limits) Validate() error {
	if l.MaxPayload == 0 {
		l.MaxPayload = DefaultMaxPayload
	}
	if l.MaxBatchBytes == 0 {
		l.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if l.MaxBatchCount == 0 {
		l.MaxBatchCount = DefaultMaxBatchCount
	}
	if l.MaxPayload < 0 || l.MaxPayload > HardMaxPayload {
		return fmt.Errorf("zkqueue: max payload %d out of range (0, %d]", l.MaxPayload, HardMaxPayload)
	}
	if l.MaxBatchBytes < 0 || l.MaxBatchBytes > HardMaxPayload {
		return fmt.Errorf("zkqueue: max batch bytes %d out of range (0, %d]", l.MaxBatchBytes, HardMaxPayload)
	}
	if l.MaxBatchCount < 0 {
		return fmt.Errorf("zkqueue: max batch count %d < 0", l.MaxBatchCount)
	}
	return nil
}

func (o *options) validate() error {
	if err := o.limits.Validate(); err != nil {
		return err
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	if o.memory == nil {
		o.memory = NewBudget(DefaultMemoryBytes)
	}
	o.acl = zkutil.ACLOr(o.acl)
	if o.segmentSize == 0 {
		o.segmentSize = DefaultSegmentSize
	}
	if o.segmentSize < 2 || o.segmentSize > MaxSegmentSize {
		return fmt.Errorf("zkqueue: segment size %d out of range [2, %d]", o.segmentSize, MaxSegmentSize)
	}
	if err := o.validateGroups(); err != nil {
		return err
	}
	if o.fairness.Key != "" || o.fairness.Weights != nil {
		if err := o.fairness.Validate(); err != nil {
			return err
		}
	}
	if o.packing != nil {
		if err := o.packing.validate(); err != nil {
			return err
		}
	}
	if o.expiry.TTL < 0 {
		return fmt.Errorf("zkqueue: message TTL %v < 0", o.expiry.TTL)
	}
	return o.validateDedup()
}

// MaxSegmentSize bounds WithSegmentSize: a listing of a full segment
// (names of up to 36 bytes, plus the transactions that passed the seal)
// must stay well below jute.maxbuffer.
const MaxSegmentSize = 50_000

// WithSegmentSize sets the number of messages after which a segment is
// sealed and the next one started (node.go); default
// DefaultSegmentSize. Consumers list one segment at a time, so it bounds a
// listing; every process publishing to a queue should use the same size
// (a segment is sealed by the first publish past its size).
func WithSegmentSize(n int) Option { return func(o *options) { o.segmentSize = n } }

// WithLimits sets the publish limits (see Limits).
func WithLimits(l Limits) Option { return func(o *options) { o.limits = l } }

// WithMaxPayload sets the largest payload Publish accepts (default 512 KiB;
// at most HardMaxPayload, just under 1 MiB).
func WithMaxPayload(n int) Option { return func(o *options) { o.limits.MaxPayload = n } }

// WithMaxBatchBytes bounds the total size of one PublishBatch.
func WithMaxBatchBytes(n int) Option { return func(o *options) { o.limits.MaxBatchBytes = n } }

// WithMaxBatchCount bounds the number of messages in one PublishBatch.
func WithMaxBatchCount(n int) Option { return func(o *options) { o.limits.MaxBatchCount = n } }

// WithPriorities makes the queue a priority queue: messages carry a
// priority in [0, MaxPriority] in their names and are delivered most
// urgent (smallest) first, FIFO within a priority. The dispatcher then
// drops its cached snapshot whenever the children changed, so that a
// newly published, more urgent message is seen at the next claim (a FIFO
// queue walks its snapshot to the end: new messages sort after it).
func WithPriorities() Option { return func(o *options) { o.priorities = true } }

// WithLogger sets the logger for skipped foreign nodes; default discards.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithPackHook sets a function called with the message count of every
// pack the queue writes (WithPacking), for metrics.
func WithPackHook(f func(count int)) Option { return func(o *options) { o.packHook = f } }

// WithConflictHook sets a function called once per lost race for a head
// message (NoNode or BadVersion while claiming).
func WithConflictHook(f func()) Option { return func(o *options) { o.conflictHook = f } }

// WithBadDataHook sets a function called once for each message node
// whose data does not decode (see baddata.go), with the node's path.
func WithBadDataHook(f func(znode string)) Option { return func(o *options) { o.badDataHook = f } }

// WithObserver sets a function that sees the latency and outcome of every
// ZooKeeper request of the queue, for metrics.
func WithObserver(f Observer) Option { return func(o *options) { o.observer = f } }

// WithShare sets the function that tells this process's rank among the n
// processes consuming the queue; it is asked at every listing. Each
// process takes the messages whose sequence number is its rank modulo n
// first, so processes do not race each other for the same head (see
// dispatch.go). ConsumerGroup.Rank (consumers.go) computes the rank from
// the consumer registrations in ZooKeeper. WithOwners also says who
// published what.
func WithShare(f func() (rank, n int)) Option {
	return WithOwners(func() Share {
		rank, n := f()
		return Share{Rank: rank, N: n}
	})
}

// WithOwners is WithShare with the consuming processes' publisher tags
// (ConsumerGroup.Share computes them): a message published by one of them
// (WithPublisher) is that process's, which remembers its data and claims
// it without reading it; the others are shared by sequence number.
func WithOwners(f func() Share) Option { return func(o *options) { o.share = f } }

// WithPublisher makes this queue's publishes carry the publisher tag of
// processID (PublisherTag) in their names while it consumes the queue, for
// WithOwners; "" means no tag. Use the process id of the queue's
// ConsumerGroup.
func WithPublisher(processID string) Option {
	return func(o *options) {
		o.publisher = ""
		if processID != "" {
			o.publisher = PublisherTag(processID)
		}
	}
}

// WithReaders sets the sessions (to the same ensemble) over which claims
// spread their reads instead of the queue's own. Keep them free of
// writes: ZooKeeper answers a session's read only after that session's
// earlier writes have committed.
func WithReaders(conns ...*zk.Conn) Option { return func(o *options) { o.readers = conns } }

// WithCommitter makes the queue's writes (publishes, claims, acks,
// releases) go through c, so that concurrent ones share Multi
// transactions (group commit, see commit.go). One Committer may serve
// many queues.
func WithCommitter(c *Committer) Option { return func(o *options) { o.committer = c } }

// WithMemory sets the Budget bounding the memory the queue spends
// remembering the messages this process published, so its consumers claim
// them without reading them back (producer.go). Share one Budget among the
// queues of a process to bound the total; default: a Budget of
// DefaultMemoryBytes for this queue alone.
func WithMemory(b *Budget) Option { return func(o *options) { o.memory = b } }

// Creates reports whether a Queue opened with opts creates its missing
// nodes, that is, whether opts lack WithoutCreate. A layer over a Queue
// that has nodes of its own (syncqueue's members) creates them alike.
func Creates(opts ...Option) bool {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return !o.noCreate
}

// WithoutCreate makes New and NewLeases only read: the parents must exist
// (a missing one fails the requests that need it with zk.ErrNoNode). A
// process that also deletes queues needs this: a Queue opened while its
// queue is being deleted would otherwise create the parents again.
func WithoutCreate() Option { return func(o *options) { o.noCreate = true } }

// WithACL sets the ACL of every node the queue creates: its parents,
// messages, leases and dead letters (default: open to anyone,
// zk.WorldACL(zk.PermAll)). Give the same ACL to every process of the
// queue; zk.DigestACL with the processes' digest identity (added to their
// sessions with AddAuth) lets only them change the queue.
func WithACL(acl []zk.ACL) Option { return func(o *options) { o.acl = acl } }

// ACLOf returns the ACL a Queue opened with opts gives the nodes it
// creates (see WithACL). A layer over a Queue that has nodes of its own
// (syncqueue's members) creates them with it.
func ACLOf(opts ...Option) []zk.ACL {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return zkutil.ACLOr(o.acl)
}
