package zkqueue

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Group read. A claim must read the message it claims unless this process
// remembers it from publishing it (recent.go), and ZooKeeper's cost is per
// request far more than per byte: measured on this machine, a getData cost
// the server 110-185 µs of CPU, a read inside a multiRead of 8 paths 24 µs
// and of 64 paths 4-7 µs. So concurrent claims of a Queue (a claim round's,
// and those of separate consumers taking one message each) read together:
// a read that finds fewer than maxReadsInFlight requests of its Queue in
// flight sends itself with the reads queued meanwhile, up to maxReadBatch,
// as one request (a multiRead when more than one, given ZooKeeper 3.6 or
// later and a client that has multiRead, multiReader);
// otherwise it queues, and whichever waiting read finds a request slot
// free sends the oldest queued ones. As with the group commit, a lone read
// goes at once and only reads that would have waited anyway share a
// request.
//
// Read-ahead. A consumer of a backlog it did not publish also reads the
// candidates its next claims will take: the dispatcher hands the next
// candidates of its snapshot to readAhead, their reads fill up the
// requests of the claims' own reads to maxReadBatch paths (or go in a
// request of their own alongside a claim round when a slot is free), and
// what they read is remembered as if this process had published it
// (recent.go, within the same memory budget). The claims then find their
// data at hand, as on a shallow queue, and a deep backlog drains without
// waiting for reads.
//
// The reads are not atomic with the claims: a claim still deletes (or
// leases) at the version it read, so a message claimed elsewhere in
// between is a lost race, as before.

// maxReadBatch bounds the paths of one multiRead: its answer must stay
// below what the session accepts even if every node holds the largest
// data a message may have (HardMaxPayload), since sizes are unknown before
// the read. Sessions of zkutil.Connect accept zkutil.MaxAnswer;
// go-zookeeper's default accepts any size.
const (
	maxReadAnswer = zkutil.MaxAnswer - zkutil.MaxBuffer
	maxReadBatch  = maxReadAnswer / (HardMaxPayload + HeaderMax + 64)
	// maxReadsInFlight bounds a Queue's read requests in flight, and
	// maxReadAhead the candidates queued for reading ahead. A drain of a
	// backlog reads at most maxReadsInFlight * maxReadBatch messages per
	// round trip: measured draining 300,000 messages with 64 consumers
	// (the README's deep-queue command), 2 requests and 64 ahead drained
	// at 0.51 of the shallow rate, 4 and 256 at 0.67, 8 and 512 at 0.83.
	// The memory of read messages stays within the Budget (WithMemory).
	maxReadsInFlight = 8
	maxReadAhead     = 32 * maxReadBatch
)

// readResult is one read's answer.
type readResult struct {
	data    []byte
	version int32
	stat    *zk.Stat
	err     error
}

// readGroup is a Queue's part for reads: it queues concurrent claims'
// reads for group read and reads ahead what the dispatcher offers,
// filling the memory of messages. It is safe for concurrent use.
type readGroup struct {
	*core
	readers []observed // the queue's session and WithReaders's, used round-robin
	next    atomic.Uint32
	recent  *recent
	pubs    *publishes

	off      atomic.Bool // no multiRead: the client has none, or the server refused it
	mu       sync.Mutex
	queued   []*readCall
	inFlight int
	ahead    []Name          // candidates to read ahead, next first
	aheadSet map[string]bool // names in ahead or in a request for it
}

func newReadGroup(c *core, r *recent, p *publishes) *readGroup {
	g := &readGroup{core: c, recent: r, pubs: p}
	for _, conn := range c.opt.readers {
		g.readers = append(g.readers, observed{conn, c.opt.observer})
	}
	if len(g.readers) == 0 {
		g.readers = []observed{c.zk}
	}
	// Readers are sessions of one client type: all have multiRead or none.
	g.off.Store(!hasMultiRead(c.conn))
	return g
}

type readCall struct {
	path string
	// ahead is the candidate read ahead (nobody waits for the call; its
	// data goes to the memory of messages); zero for a claim's read.
	ahead Name
	res   readResult
	done  chan struct{} // closed once res is set
	// turn is signalled when the call is first in the queue and a request
	// slot is free: the caller sends the next batch. Only the first
	// waiting call is woken, not every waiter.
	turn chan struct{}
}

// read reads the data of p, sharing a request with concurrent reads
// of the Queue.
func (g *readGroup) read(p string) readResult {
	c := &readCall{path: p, done: make(chan struct{}), turn: make(chan struct{}, 1)}
	g.mu.Lock()
	g.queued = append(g.queued, c)
	g.sendLocked()
	for {
		select {
		case <-c.done:
			return c.res
		case <-c.turn:
			g.mu.Lock()
			g.sendLocked()
		}
	}
}

// sendLocked, called with reads.mu held, sends the oldest queued reads
// as one request if a request slot is free, and releases the lock. When
// the request ends it hands the slot to the call first in the queue.
func (g *readGroup) sendLocked() {
	if g.inFlight >= maxReadsInFlight || len(g.queued) == 0 {
		g.mu.Unlock()
		return
	}
	batch := g.queued[:min(len(g.queued), maxReadBatch)]
	g.queued = g.queued[len(batch):]
	batch = append(batch[:len(batch):len(batch)], g.aheadCallsLocked(maxReadBatch-len(batch))...)
	g.inFlight++
	g.mu.Unlock()
	g.sendBatch(batch)
}

// sendBatch sends calls as one request, which holds a slot, answers the
// calls and hands the slot on (see sendLocked).
func (g *readGroup) sendBatch(batch []*readCall) {
	g.readCalls(batch)
	for _, b := range batch {
		if b.done != nil {
			close(b.done)
		}
	}

	g.mu.Lock()
	for _, b := range batch {
		if b.ahead.Raw != "" {
			delete(g.aheadSet, b.ahead.Raw)
			// A message node is never rewritten: data at version 0 is
			// what it was published with, as for the memory of own
			// messages (whose claims delete at version 0).
			if b.res.err == nil && b.res.version == 0 {
				g.recent.put(b.ahead, b.res.data)
			}
		}
	}
	g.inFlight--
	if len(g.queued) > 0 {
		select {
		case g.queued[0].turn <- struct{}{}:
		default: // already signalled
		}
	}
	g.mu.Unlock()
}

// aheadCallsLocked takes up to n candidates queued for reading ahead.
func (g *readGroup) aheadCallsLocked(n int) []*readCall {
	n = min(n, len(g.ahead))
	calls := make([]*readCall, n)
	for i, a := range g.ahead[:n] {
		calls[i] = &readCall{path: itemPath(g.path, a), ahead: a}
	}
	g.ahead = g.ahead[n:]
	return calls
}

// readAhead queues names, the candidates next in line, for reading ahead,
// but those remembered already or queued, while fewer than maxReadAhead
// are queued. listedPubs is the dispatcher's mark of the publishes begun
// before its snapshot's listing. It returns how many of names it looked
// at.
func (g *readGroup) readAhead(names []Name, listedPubs uint64) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.aheadSet == nil {
		g.aheadSet = make(map[string]bool)
	}
	// A message of this process's own that it does not remember may be
	// one whose publish has not returned yet, while a publish begun
	// before the snapshot's listing came back is under way: reading
	// ahead stops there until it ends (a round trip), and goes on then,
	// through the messages remembered meanwhile and those an earlier
	// process with the same tag left.
	answering := g.pubs.openSince(listedPubs)
	for i, n := range names {
		if len(g.ahead) >= maxReadAhead {
			return i
		}
		if answering && ownTag(n, g.opt.publisher) && !g.recent.has(n.Raw) {
			return i
		}
		if !g.aheadSet[n.Raw] && !g.recent.has(n.Raw) {
			g.ahead = append(g.ahead, n)
			g.aheadSet[n.Raw] = true
		}
	}
	return len(names)
}

// aheadDue reports whether a request of reads ahead alone should go now:
// a full batch is queued, no claim's read waits, and a slot is free.
func (g *readGroup) aheadDue() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.ahead) >= maxReadBatch && len(g.queued) == 0 && g.inFlight < maxReadsInFlight
}

// sendAhead sends a request of reads ahead alone, if a slot is free.
func (g *readGroup) sendAhead() {
	g.mu.Lock()
	if g.inFlight >= maxReadsInFlight || len(g.ahead) == 0 {
		g.mu.Unlock()
		return
	}
	batch := g.aheadCallsLocked(maxReadBatch)
	g.inFlight++
	g.mu.Unlock()
	g.sendBatch(batch)
}

// readCalls answers calls with one request (readBatch).
func (g *readGroup) readCalls(calls []*readCall) {
	paths := make([]string, len(calls))
	for i, c := range calls {
		paths[i] = c.path
	}
	for i, r := range g.readBatch(paths) {
		calls[i].res = r
	}
}

// readBatch reads paths (at most maxReadBatch) with one request: a
// getData for one, else a multiRead, or a getData each where the client
// has no multiRead or the server refuses it. A failure is each path's
// readResult error.
func (g *readGroup) readBatch(paths []string) []readResult {
	if len(paths) > 1 && !g.off.Load() {
		rs, err := g.multiGet(paths)
		if err == nil {
			return rs
		}
		if connectionLoss(err) {
			out := make([]readResult, len(paths))
			for i, p := range paths {
				out[i].err = fmt.Errorf("get %s: %w", p, err)
			}
			return out
		}
	}
	// One getData each, all in flight at once: the session pipelines
	// them, so the batch still costs one round trip of waiting.
	out := make([]readResult, len(paths))
	if len(paths) == 1 {
		out[0] = g.get(paths[0])
		return out
	}
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Go(func() { out[i] = g.get(p) })
	}
	wg.Wait()
	return out
}

func (g *readGroup) get(p string) readResult {
	data, stat, err := g.reader().Get(p)
	if err != nil {
		return readResult{err: fmt.Errorf("get %s: %w", p, err)}
	}
	return readResult{data: data, version: stat.Version, stat: stat}
}

// connectionLoss reports errors of the connection rather than of the
// request.
func connectionLoss(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrSessionExpired) ||
		errors.Is(err, zk.ErrClosing) || errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrSessionMoved)
}

// multiGet reads paths (at most maxReadBatch) in one multiRead. A
// refusal other than the connection's turns multiRead off for the Queue.
func (g *readGroup) multiGet(paths []string) ([]readResult, error) {
	rs, err := g.reader().MultiGet(paths...)
	if err != nil {
		if !connectionLoss(err) && g.off.CompareAndSwap(false, true) {
			// ZooKeeper before 3.6 has no multiRead: read one by one.
			g.opt.logger.Warn("multiRead refused; claims read each message on its own", "queue", g.path, "err", err)
		}
		return nil, err
	}
	out := make([]readResult, len(rs))
	for i, r := range rs {
		if r.Error != nil {
			out[i].err = fmt.Errorf("get %s: %w", paths[i], r.Error)
			continue
		}
		out[i] = readResult{data: r.Data, version: r.Stat.Version, stat: r.Stat}
	}
	return out, nil
}

// readPaths reads the data of paths, maxReadBatch at a time
// (readBatch). A missing node is an error of its readResult; the error
// returned is the connection's.
func (g *readGroup) readPaths(paths []string) ([]readResult, error) {
	out := make([]readResult, 0, len(paths))
	for i := 0; i < len(paths); i += maxReadBatch {
		for _, r := range g.readBatch(paths[i:min(i+maxReadBatch, len(paths))]) {
			if connectionLoss(r.err) {
				return out, r.err
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// multiReader is a client that reads many nodes in one request
// (ZooKeeper's multiRead): the go-zookeeper that this module's go.mod puts
// in place of the release (third_party/go-zookeeper, Conn.MultiGet). The
// release has no such method, and a replace in go.mod applies only to this
// module, so the engine builds against the release and asks the
// connection at run time (hasMultiRead): a program built with the release
// reads one getData per node, one built with the patched client (qbroker's
// own, or any module that replaces go-zookeeper with it) reads in
// multiRead requests. The signature names only types the release has too:
// the patched client's zk.ReadResponse is an alias of readResponse's
// struct type.
type multiReader interface {
	MultiGet(paths ...string) ([]readResponse, error)
}

// readResponse is the answer to one read of a multiRead.
type readResponse = struct {
	Data  []byte
	Stat  *zk.Stat
	Error error
}

// errNoMultiRead is returned by observed.MultiGet where the client has no
// multiRead; Queues check hasMultiRead first.
var errNoMultiRead = errors.New("zkqueue: the ZooKeeper client has no multiRead")

// hasMultiRead reports whether conn reads in multiRead requests.
func hasMultiRead(conn *zk.Conn) bool {
	_, ok := any(conn).(multiReader)
	return ok
}

// MultiGet is the observed multiRead ("multiread" to the Observer).
func (o observed) MultiGet(paths ...string) ([]readResponse, error) {
	m, ok := any(o.conn).(multiReader)
	if !ok {
		return nil, errNoMultiRead
	}
	start := time.Now()
	rs, err := m.MultiGet(paths...)
	o.done("multiread", start, err)
	return rs, err
}

// reader returns the session for a claim's read, round-robin.
func (g *readGroup) reader() observed {
	if len(g.readers) == 1 {
		return g.readers[0]
	}
	return g.readers[int(g.next.Add(1))%len(g.readers)]
}
