package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
)

// zkWaitFirstReport and zkWaitReportEvery pace the reports of a broker
// still waiting for its first ZooKeeper session.
const (
	zkWaitFirstReport = 2 * time.Second
	zkWaitReportEvery = 5 * time.Second
)

// zkWait reports a start's wait for ZooKeeper: at once, the servers it
// connects to; then, until stop, every few seconds the servers it is
// still waiting for and what a TCP connection to each of them gets (a
// typo in --zk looks like a hang otherwise).
type zkWait struct {
	servers []string
	timeout time.Duration
	log     *slog.Logger
	start   time.Time
	cancel  context.CancelFunc
	done    chan struct{}
}

// startZKWait logs the connection attempt and starts the reports.
func startZKWait(ctx context.Context, log *slog.Logger, servers []string, timeout time.Duration) *zkWait {
	w := &zkWait{servers: servers, timeout: timeout, log: log, start: time.Now(), done: make(chan struct{})}
	log.Info("connecting to ZooKeeper", "zk", strings.Join(servers, ","), "timeout", timeout)
	ctx, w.cancel = context.WithCancel(ctx)
	go w.run(ctx)
	return w
}

func (w *zkWait) run(ctx context.Context) {
	defer close(w.done)
	t := time.NewTimer(zkWaitFirstReport)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.log.Warn("still waiting for ZooKeeper", "zk", w.probe(ctx),
			"waited", time.Since(w.start).Round(time.Second), "timeout", w.timeout)
		t.Reset(zkWaitReportEvery)
	}
}

// probe says, per server, what a TCP connection to it gets.
func (w *zkWait) probe(ctx context.Context) string {
	parts := make([]string, len(w.servers))
	var wg sync.WaitGroup
	for i, s := range w.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{Timeout: time.Second}
			c, err := d.DialContext(ctx, "tcp", s)
			if err != nil {
				var oe *net.OpError
				if errors.As(err, &oe) && oe.Err != nil {
					err = oe.Err
				}
				parts[i] = fmt.Sprintf("%s (%v)", s, err)
				return
			}
			c.Close()
			parts[i] = s + " (accepts connections, no session yet)"
		}()
	}
	wg.Wait()
	return strings.Join(parts, ", ")
}

// stop ends the reports. err is the start's error: a wait that ran out
// (ctx's deadline, not its end) becomes an error naming the servers,
// what they answered and the flag that bounds the wait.
func (w *zkWait) stop(ctx context.Context, err error) error {
	w.cancel()
	<-w.done
	if err == nil || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return err
	}
	pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return fmt.Errorf("no ZooKeeper session within %v (--zk-connect-timeout): %s; check --zk and that ZooKeeper runs there: %w",
		w.timeout, w.probe(pctx), err)
}
