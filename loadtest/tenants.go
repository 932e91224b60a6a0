package main

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// Tenants (--tenants N): producer i publishes for tenant i mod N, with a
// "tenant" header; tenant t0 is the noisy one, publishing --noisy-factor
// times the rate of each other tenant, at the open-loop --rate shared out
// by those weights. Consumers spend --work on each message before
// settling it, so a rate above their capacity builds a backlog. --fair
// creates the queue with fair dispatch by the tenant header. The report
// gives each tenant's time in queue (send time to first delivery).

// tenantHeader is the header the tenants' messages carry.
const tenantHeader = "tenant"

// TenantLatency is one tenant's time in queue.
type TenantLatency struct {
	Tenant string         `json:"tenant"`
	Noisy  bool           `json:"noisy,omitempty"`
	Rate   float64        `json:"rate"`
	Queue  LatencySummary `json:"time_in_queue"`
}

// tenantHists records each tenant's time in queue. Safe for concurrent
// use.
type tenantHists struct {
	mu sync.Mutex
	h  []*hdrhistogram.Histogram
}

func newTenantHists(n int) *tenantHists {
	t := &tenantHists{h: make([]*hdrhistogram.Histogram, n)}
	for i := range t.h {
		t.h[i] = newHist()
	}
	return t
}

func (t *tenantHists) record(tenant int, d time.Duration) {
	if t == nil {
		return
	}
	t.mu.Lock()
	record(t.h[tenant], d)
	t.mu.Unlock()
}

// summaries returns each tenant's latency.
func (t *tenantHists) summaries(cfg *Config) []TenantLatency {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]TenantLatency, len(t.h))
	for i, h := range t.h {
		s := summarize(h)
		s.CDF, s.Histogram = nil, nil
		out[i] = TenantLatency{Tenant: tenantName(i), Noisy: i == 0 && cfg.NoisyFactor != 1, Rate: tenantRate(cfg, i), Queue: s}
	}
	return out
}

func tenantName(t int) string { return fmt.Sprint("t", t) }

// tenantOf returns the tenant producer i publishes for.
func tenantOf(cfg *Config, producer int) int { return producer % cfg.Tenants }

// tenantRate is tenant t's share of --rate.
func tenantRate(cfg *Config, t int) float64 {
	w := 1.0
	if t == 0 {
		w = cfg.NoisyFactor
	}
	return cfg.Rate * w / (cfg.NoisyFactor + float64(cfg.Tenants-1))
}

// tenantInterval is the open-loop interval between the messages of
// producer i.
func tenantInterval(cfg *Config, i int) time.Duration {
	perProducer := tenantRate(cfg, tenantOf(cfg, i)) / float64(cfg.Producers/cfg.Tenants)
	return time.Duration(float64(time.Second) / perProducer)
}

// tenantSchedule returns when producer i's first call is due and its
// interval per message (tenantInterval). The first calls are staggered by
// i/Producers of each producer's own interval, so that every tenant's
// calls, and the quiet tenants' calls together, arrive evenly spread:
// staggered over the noisy rate's period instead (openLoopSchedule), the
// quiet producers' calls would all fall in its first fraction of their
// much longer interval, a burst of every quiet tenant's messages at once.
// Without a noisy tenant it is openLoopSchedule's schedule.
func tenantSchedule(cfg *Config, i int, start time.Time) (first time.Time, interval time.Duration) {
	interval = tenantInterval(cfg, i)
	return start.Add(time.Duration(int64(interval) * int64(i) / int64(cfg.Producers))), interval
}

// validateTenants checks the tenant flags.
func (c *Config) validateTenants() error {
	switch {
	case c.Tenants < 0 || c.Tenants > 1000:
		return fmt.Errorf("--tenants %d not in [0, 1000]", c.Tenants)
	case c.Tenants == 0 && (c.NoisyFactor != 1 || c.Fair):
		return errors.New("--noisy-factor and --fair need --tenants")
	case c.Tenants > 0 && (c.Rate <= 0 || c.Producers%c.Tenants != 0):
		return errors.New("--tenants needs an open-loop --rate and --producers a multiple of --tenants")
	case c.NoisyFactor < 1 || c.NoisyFactor > 10000:
		return fmt.Errorf("--noisy-factor %v not in [1, 10000]", c.NoisyFactor)
	case c.Work < 0 || c.Work > time.Second:
		return fmt.Errorf("--work %v not in [0, 1s]", c.Work)
	}
	return nil
}

// queueOptions returns the options the load test creates its queue with.
func (c *Config) queueOptions() qbroker.QueueOptions {
	o := qbroker.QueueOptions{Kind: c.Kind, SingleActiveConsumer: c.SingleActive, VisibilityTimeout: c.VisibilityTimeout,
		Packed: c.Packed}
	if c.Fair {
		o.Fairness = qbroker.Fairness{Key: qbroker.FairByHeader(tenantHeader)}
	}
	return o
}

// writeTenants writes the tenants' lines of the text report.
func writeTenants(b *strings.Builder, ts []TenantLatency, fair bool) {
	if len(ts) == 0 {
		return
	}
	mode := "queue order"
	if fair {
		mode = "fair dispatch by tenant"
	}
	var worst float64
	for _, t := range ts {
		if !t.Noisy {
			worst = max(worst, t.Queue.P99MS)
		}
	}
	fmt.Fprintf(b, "tenants      %d (%s); time in queue p99 of the quiet tenants: worst %s\n", len(ts), mode, ms(worst))
	for _, t := range ts {
		noisy := ""
		if t.Noisy {
			noisy = " noisy"
		}
		fmt.Fprintf(b, "  %-4s %6.0f msg/s%-6s delivered %6d  p50 %s p99 %s max %s\n", t.Tenant, t.Rate, noisy,
			t.Queue.Count, ms(t.Queue.P50MS), ms(t.Queue.P99MS), ms(t.Queue.MaxMS))
	}
}
