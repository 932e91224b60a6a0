package main

import (
	"context"
	"fmt"
	"sync"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// connPool holds the client connections of a run. Producers and consumers
// are spread round-robin over the brokers; within a broker they share
// perBroker connections round-robin, or each get their own when perBroker
// is 0.
type connPool struct {
	brokers   []string
	perBroker int
	shared    [][]*qbroker.Client // [broker][conn], perBroker > 0
	own       []*qbroker.Client   // perBroker == 0: every client dialled
	opts      []qbroker.Option    // TLS and token
	deadMu    sync.Mutex
	dead      map[int]bool // brokers killed during the run (--kill-active-after)
}

func newConnPool(ctx context.Context, brokers []string, perBroker int, opts ...qbroker.Option) (*connPool, error) {
	p := &connPool{brokers: brokers, perBroker: perBroker, opts: opts}
	if perBroker == 0 {
		return p, nil
	}
	for _, b := range brokers {
		var cs []*qbroker.Client
		for range perBroker {
			c, err := dial(ctx, b, p.opts)
			if err != nil {
				p.Close()
				return nil, err
			}
			cs = append(cs, c)
		}
		p.shared = append(p.shared, cs)
	}
	return p, nil
}

func dial(ctx context.Context, addr string, opts []qbroker.Option) (*qbroker.Client, error) {
	c, err := qbroker.Dial(ctx, addr, append([]qbroker.Option{qbroker.WithWaitConnected()}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return c, nil
}

// client returns the connection of worker i (a producer's or a
// consumer's index): broker i mod B, then connection (i div B) mod
// perBroker. Not safe for concurrent use: workers are set up by one
// goroutine.
func (p *connPool) client(ctx context.Context, i int) (*qbroker.Client, error) {
	b := i % len(p.brokers)
	if p.perBroker > 0 {
		return p.shared[b][(i/len(p.brokers))%p.perBroker], nil
	}
	c, err := dial(ctx, p.brokers[b], p.opts)
	if err != nil {
		return nil, err
	}
	p.own = append(p.own, c)
	return c, nil
}

// admin returns a connection for setup and check calls, to the first
// broker not killed.
func (p *connPool) admin(ctx context.Context) (*qbroker.Client, error) {
	for b := range p.brokers {
		if !p.killed(b) {
			return p.client(ctx, b)
		}
	}
	return nil, fmt.Errorf("every broker was killed")
}

// markDead records that broker b was killed: admin uses another.
func (p *connPool) markDead(b int) {
	p.deadMu.Lock()
	defer p.deadMu.Unlock()
	if p.dead == nil {
		p.dead = map[int]bool{}
	}
	p.dead[b] = true
}

func (p *connPool) killed(b int) bool {
	p.deadMu.Lock()
	defer p.deadMu.Unlock()
	return p.dead[b]
}

// workerKilled reports whether the broker of worker i (see client) was
// killed.
func (p *connPool) workerKilled(i int) bool { return p.killed(i % len(p.brokers)) }

// Close closes every connection.
func (p *connPool) Close() {
	for _, cs := range p.shared {
		for _, c := range cs {
			_ = c.Close()
		}
	}
	for _, c := range p.own {
		_ = c.Close()
	}
}
