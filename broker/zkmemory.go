package broker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// ZooKeeper keeps every node in its heap, so a queue with no depth cap is
// bounded by ZooKeeper's memory: a server out of heap exits, and every
// queue with it. The broker therefore refuses publishes past a data
// budget, an estimate of the heap ZooKeeper's data needs:
//
//	DataCharge * zk_approximate_data_size + NodeCharge * zk_znode_count
//
// from mntr, the largest any server of the ensemble reports (replicas
// hold the same tree; the largest errs on the safe side), plus what this
// broker admitted since it last read them.
//
// The charges are measured on ZooKeeper 3.8 (OpenJDK 17, SerialGC;
// docs/operations.md, Limits): 1,000,000 messages of 100 B in one parent took 480 MB of live
// heap for an approximate data size of 122 MB, 358 B more per node; and a
// flood of 500 KiB messages through a broker exhausted a heap of 128 MiB
// with 28 MB of data (a server holds copies of recent requests' data
// besides the tree), so each byte of data counts twice.
const (
	NodeCharge = 384
	DataCharge = 2
)

// Budget refreshes: every dataInterval while the broker publishes (it
// admitted a publish within dataActive), else every dataIdleInterval, each
// server asked within dataTimeout. A read older than dataStale is no read
// at all.
const (
	dataInterval     = time.Second
	dataActive       = 10 * time.Second
	dataIdleInterval = 10 * time.Second
	dataTimeout      = 2 * time.Second
	dataStale        = 15 * time.Second
)

// zkMemory tracks the estimate against the budget. The publish path only
// reads what the background loop (run) last found: it never waits on
// ZooKeeper's monitoring port.
//
// Unknown (no server answered mntr for dataStale, or never): publishes are
// admitted, and the loop logs a warning while it lasts. Refusing every
// publish because the monitoring port is closed or mntr is not in
// 4lw.commands.whitelist would turn a configuration gap into an outage of
// every queue; the warning names the fix.
type zkMemory struct {
	servers []string
	budget  int64 // 0: no budget
	log     *slog.Logger
	gauge   func(float64) // the estimate, -1 while unknown

	mu       sync.Mutex
	used     int64     // the estimate at readAt
	readAt   time.Time // zero: never read
	pending  int64     // bytes admitted since the read that set used began
	admitted time.Time // the last admit
}

func newZKMemory(servers []string, budget int64, log *slog.Logger, gauge func(float64)) *zkMemory {
	// As the ZooKeeper client does: a server without a port is on 2181.
	return &zkMemory{servers: zk.FormatServers(servers), budget: budget, log: log, gauge: gauge}
}

// refusal is the error of a create past the budget: why, and what to do.
// what names the create ("this publish").
func (m *zkMemory) refusal(used, n int64, what string) error {
	return fmt.Errorf("%w: ZooKeeper data budget reached: ZooKeeper holds about %s of data (twice its approximate data size plus %d B per znode) and %s adds %s, over the budget of %s (--zk-data-budget); consume or purge messages, or give ZooKeeper more heap and the brokers a larger budget",
		errLimit, mib(used), NodeCharge, what, mib(n), mib(m.budget))
}

func mib(n int64) string {
	if n < 10<<20 {
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

// admit charges a publish's n bytes against the budget, or refuses them
// with errLimit. It never blocks on ZooKeeper.
func (m *zkMemory) admit(n int64) error { return m.admitFor(n, "this publish") }

// admitNode charges the create of a coordination node (a lock holder or
// waiter, an election candidate) with data bytes, named by what: the
// budget bounds every node the broker makes, not only messages.
func (m *zkMemory) admitNode(data int, what string) error {
	return m.admitFor(NodeCharge+DataCharge*int64(data), what)
}

// admitFor is admit for a create that what names.
func (m *zkMemory) admitFor(n int64, what string) error {
	if m.budget <= 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.admitted = time.Now()
	if m.readAt.IsZero() || time.Since(m.readAt) > dataStale {
		return nil // unknown: admitted (see zkMemory), warned by run
	}
	used := m.used + m.pending
	if used+n > m.budget {
		return m.refusal(used, n, what)
	}
	m.pending += n
	return nil
}

// run refreshes the estimate until ctx ends: every dataInterval while
// the broker publishes, every dataIdleInterval otherwise (an idle broker
// keeps the estimate fresh enough for its next publish at a tenth of the
// cost).
func (m *zkMemory) run(ctx context.Context) {
	if m.budget <= 0 {
		return
	}
	t := time.NewTicker(dataInterval)
	defer t.Stop()
	var lastWarn, lastRead time.Time
	known := false
	for {
		if m.due(lastRead) {
			lastRead = time.Now()
			err := m.refresh(ctx)
			switch {
			case ctx.Err() != nil:
				return
			case err == nil && !known:
				known = true
				if !lastWarn.IsZero() {
					m.log.Info("ZooKeeper data size known again: the data budget is enforced", "budget_bytes", m.budget)
				}
			case err != nil && m.stale():
				if known || time.Since(lastWarn) > time.Minute {
					m.log.Warn("ZooKeeper data size unknown: publishes are admitted without the data budget until a server answers mntr",
						"err", err, "servers", m.servers, "fix", "list mntr in each server's 4lw.commands.whitelist and let the brokers reach its client port")
					lastWarn = time.Now()
				}
				known = false
				m.gauge(-1)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// due reports whether a refresh is due, the last having begun at last.
func (m *zkMemory) due(last time.Time) bool {
	m.mu.Lock()
	active := time.Since(m.admitted) < dataActive
	m.mu.Unlock()
	return active || time.Since(last) >= dataIdleInterval-dataInterval/2
}

func (m *zkMemory) stale() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.readAt.IsZero() || time.Since(m.readAt) > dataStale
}

// refresh reads every server and keeps the largest estimate; it fails only
// when none answered. What was admitted before the reads began is in
// their answers (committed) or about to be (in flight): it stops counting
// as pending, a small undercount the budget's margin absorbs.
func (m *zkMemory) refresh(ctx context.Context) error {
	m.mu.Lock()
	before := m.pending
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, dataTimeout)
	defer cancel()
	type answer struct {
		ds  zkutil.DataSize
		err error
	}
	answers := make(chan answer, len(m.servers))
	var wg sync.WaitGroup
	for _, s := range m.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ds, err := zkutil.Mntr(ctx, s)
			answers <- answer{ds, err}
		}()
	}
	wg.Wait()
	close(answers)
	var (
		est   int64 = -1
		first error
	)
	for a := range answers {
		if a.err != nil {
			if first == nil {
				first = a.err
			}
			continue
		}
		est = max(est, DataCharge*a.ds.Bytes+NodeCharge*a.ds.Znodes)
	}
	if est < 0 {
		return first
	}
	m.mu.Lock()
	m.used, m.readAt = est, time.Now()
	m.pending = max(m.pending-before, 0)
	m.mu.Unlock()
	m.gauge(float64(est))
	return nil
}
