package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// brokerCounters are the broker-side counters of one queue, summed over
// all brokers, and the brokers' ZooKeeper requests (of all queues) by
// "op/result", such as "delete/no_node".
type brokerCounters struct {
	Conflicts  float64            `json:"claim_conflicts"`
	Delivered  float64            `json:"delivered"`
	Published  float64            `json:"published"`
	Acked      float64            `json:"acked"`
	Nacked     float64            `json:"nacked"`
	ZKRequests map[string]float64 `json:"zk_requests,omitempty"`
}

// combine applies op to every counter of a and b (zero when missing).
func (a brokerCounters) combine(b brokerCounters, op func(x, y float64) float64) brokerCounters {
	out := brokerCounters{
		Conflicts: op(a.Conflicts, b.Conflicts),
		Delivered: op(a.Delivered, b.Delivered),
		Published: op(a.Published, b.Published),
		Acked:     op(a.Acked, b.Acked),
		Nacked:    op(a.Nacked, b.Nacked),
	}
	for _, m := range []map[string]float64{a.ZKRequests, b.ZKRequests} {
		for k := range m {
			if out.ZKRequests == nil {
				out.ZKRequests = map[string]float64{}
			}
			if v := op(a.ZKRequests[k], b.ZKRequests[k]); v != 0 {
				out.ZKRequests[k] = v
			}
		}
	}
	return out
}

func (a brokerCounters) add(b brokerCounters) brokerCounters {
	return a.combine(b, func(x, y float64) float64 { return x + y })
}

func (a brokerCounters) sub(b brokerCounters) brokerCounters {
	return a.combine(b, func(x, y float64) float64 { return x - y })
}

// httpClient fetches /metrics. No keep-alive: a scrape is rare, and idle
// connections would outlive the run.
var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}

// scrapeAll reads every broker's /metrics and sums queue's counters.
// token ("" none) is sent as a bearer token: brokers with authentication
// on serve /metrics only to an identity.
func scrapeAll(ctx context.Context, addrs []string, queue, token string) (brokerCounters, error) {
	var sum brokerCounters
	for _, a := range addrs {
		fams, err := scrape(ctx, a, token)
		if err != nil {
			return sum, err
		}
		sum = sum.add(queueCounters(fams, queue))
	}
	return sum, nil
}

func scrape(ctx context.Context, addr, token string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", addr, err)
	}
	return fams, nil
}

// queueCounters sums the counters labelled queue=<queue> (all other
// labels, such as mode, summed over).
func queueCounters(fams map[string]*dto.MetricFamily, queue string) brokerCounters {
	sum := func(name string) float64 {
		f := fams[name]
		if f == nil {
			return 0
		}
		total := 0.0
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" && l.GetValue() == queue {
					total += m.GetCounter().GetValue()
					break
				}
			}
		}
		return total
	}
	c := brokerCounters{
		Conflicts: sum("qbroker_claim_conflicts_total"),
		Delivered: sum("qbroker_messages_delivered_total"),
		Published: sum("qbroker_messages_published_total"),
		Acked:     sum("qbroker_messages_acked_total"),
		Nacked:    sum("qbroker_messages_nacked_total"),
	}
	if f := fams["qbroker_zk_request_duration_seconds"]; f != nil {
		c.ZKRequests = map[string]float64{}
		for _, m := range f.GetMetric() {
			var op, result string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "op":
					op = l.GetValue()
				case "result":
					result = l.GetValue()
				}
			}
			c.ZKRequests[op+"/"+result] += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return c
}
