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

// A claim round reads the messages this process does not remember (those
// published before it consumed the queue, or by another broker) before
// its claims start, in a few multiRead requests rather than one getData
// per message. ZooKeeper's cost is per request far more than per byte:
// measured on this machine, a getData cost the server 110-185 µs of CPU,
// a read inside a multiRead of 8 paths 24 µs and of 64 paths 4-7 µs. A
// deep backlog, where every claim must read, drains at the rate ZooKeeper
// answers reads, so this is its main cost.
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
)

// readResult is one prefetched read.
type readResult struct {
	data    []byte
	version int32
	stat    *zk.Stat
	err     error
}

// prefetched holds a round's reads until its claims take them.
type prefetched struct {
	off atomic.Bool // the server refused multiRead
	mu  sync.Mutex
	m   map[string]readResult
}

// connectionLoss reports errors of the connection rather than of the
// request.
func connectionLoss(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrSessionExpired) ||
		errors.Is(err, zk.ErrClosing) || errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrSessionMoved)
}

// prefetch reads the candidates of a round that are neither remembered
// nor already read, in multiRead requests of at most maxReadBatch paths,
// run concurrently. A request that fails leaves its candidates to be read
// one by one by their claims, which report the error.
func (s *Queue) prefetch(cands []Name) {
	var names []Name
	for _, n := range cands {
		if !s.recent.has(n.Raw) {
			names = append(names, n)
		}
	}
	if len(names) < 2 || s.fetched.off.Load() {
		return // a single read costs the same either way
	}
	var wg sync.WaitGroup
	for i := 0; i < len(names); i += maxReadBatch {
		batch := names[i:min(i+maxReadBatch, len(names))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.readBatch(batch)
		}()
	}
	wg.Wait()
}

func (s *Queue) readBatch(names []Name) {
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i] = itemPath(s.path, n)
	}
	rs, err := s.multiGet(paths)
	if err != nil {
		return
	}
	s.fetched.mu.Lock()
	defer s.fetched.mu.Unlock()
	if s.fetched.m == nil {
		s.fetched.m = make(map[string]readResult)
	}
	for i, r := range rs {
		s.fetched.m[names[i].Raw] = r
	}
}

// multiGet reads paths (at most maxReadBatch) in one multiRead.
func (s *Queue) multiGet(paths []string) ([]readResult, error) {
	rs, err := s.reader().MultiGet(paths...)
	if err != nil {
		if !connectionLoss(err) && s.fetched.off.CompareAndSwap(false, true) {
			// ZooKeeper before 3.6 has no multiRead: read one by one.
			s.opt.logger.Warn("multiRead refused; claims read each message on its own", "queue", s.path, "err", err)
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

// readPaths reads the data of paths, in multiRead requests of at most
// maxReadBatch paths, or one getData each where multiRead is refused. A
// missing node is an error of its readResult; the error returned is the
// connection's.
func (s *Queue) readPaths(paths []string) ([]readResult, error) {
	out := make([]readResult, 0, len(paths))
	for i := 0; i < len(paths); i += maxReadBatch {
		batch := paths[i:min(i+maxReadBatch, len(paths))]
		if !s.fetched.off.Load() {
			rs, err := s.multiGet(batch)
			if err == nil {
				out = append(out, rs...)
				continue
			}
			if connectionLoss(err) {
				return out, err
			}
		}
		for _, p := range batch {
			data, stat, err := s.zk.Get(p)
			if connectionLoss(err) {
				return out, err
			}
			r := readResult{data: data, err: err, stat: stat}
			if err != nil {
				r.err = fmt.Errorf("get %s: %w", p, err)
			} else {
				r.version = stat.Version
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// takeFetched returns and forgets the prefetched read of n, if any.
func (s *Queue) takeFetched(n Name) (readResult, bool) {
	s.fetched.mu.Lock()
	defer s.fetched.mu.Unlock()
	r, ok := s.fetched.m[n.Raw]
	if ok {
		delete(s.fetched.m, n.Raw)
	}
	return r, ok
}

// forgetFetched drops what a round prefetched and did not use (a claim
// not attempted), so a later round reads it afresh.
func (s *Queue) forgetFetched(cands []Name) {
	s.fetched.mu.Lock()
	defer s.fetched.mu.Unlock()
	for _, n := range cands {
		delete(s.fetched.m, n.Raw)
	}
}

// MultiGet is the observed multiRead ("multiread" to the Observer).
func (o observed) MultiGet(paths ...string) ([]zk.ReadResponse, error) {
	start := time.Now()
	rs, err := o.conn.MultiGet(paths...)
	o.done("multiread", start, err)
	return rs, err
}
