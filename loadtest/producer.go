package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	qbroker "github.com/qbroker/qbroker/clients/go"
)

// producer publishes one producer's messages in sequence, one call (of
// --batch messages) at a time, so its sequence order is its publish order.
type producer struct {
	*shared
	id     int
	client *qbroker.Client
	quota  int       // messages to publish; 0: until the deadline
	until  time.Time // stop publishing at; zero: no deadline
	// Open loop: the first send is due at next, then one every interval
	// per message. Closed loop: interval is 0.
	next     time.Time
	interval time.Duration

	hist *hdrhistogram.Histogram // publish call latency; read once run returned
	rng  *rand.Rand
	// maxLag: open loop, how late the latest publish call started after
	// its due time; read once run returned.
	maxLag time.Duration
}

// run publishes until the quota or the deadline is reached or ctx ends.
//
// In open loop, a message's send time (in its payload) is when it was due,
// not when the producer got to it: when publishing falls behind schedule,
// end-to-end latency includes the wait (no coordinated omission).
func (p *producer) run(ctx context.Context) {
	seq := uint64(1)
	bufs := make([][]byte, p.cfg.Batch)
	msgs := make([]qbroker.OutMessage, 0, p.cfg.Batch)
	for {
		n := p.cfg.Batch
		if p.quota > 0 {
			n = min(n, p.quota-int(seq-1))
		}
		if n <= 0 || ctx.Err() != nil {
			return
		}
		sent := time.Now()
		if p.interval > 0 {
			sent = p.next
			p.next = p.next.Add(time.Duration(n) * p.interval)
		}
		if !p.until.IsZero() && !sent.Before(p.until) {
			return
		}
		if p.interval > 0 && !sleepUntil(ctx, sent) {
			return
		}
		msgs = msgs[:0]
		for i := range n {
			bufs[i] = encodePayload(bufs[i], p.cfg.Payload, msgKey{p.id, seq + uint64(i)}, sent)
			m := qbroker.OutMessage{Payload: bufs[i]}
			if p.cfg.Tenants > 0 {
				m.Headers = map[string]string{tenantHeader: tenantName(tenantOf(p.cfg, p.id))}
			}
			if len(p.cfg.PriorityMix) > 0 {
				m.Priority = pickPriority(p.cfg.PriorityMix, 100*p.rng.Float64())
			}
			msgs = append(msgs, m)
		}
		start := time.Now()
		if p.interval > 0 {
			p.maxLag = max(p.maxLag, start.Sub(sent))
		}
		ids, err := p.client.PublishBatch(ctx, p.cfg.Queue, msgs)
		if err != nil {
			refused := refusedByBroker(err)
			for i := range n {
				if refused {
					p.checker.Refused(msgKey{p.id, seq + uint64(i)})
				} else {
					p.checker.Published(msgKey{p.id, seq + uint64(i)}, "", false)
				}
			}
			if ctx.Err() != nil {
				return
			}
			p.errs.add("publish", err)
			if !sleepUntil(ctx, time.Now().Add(50*time.Millisecond)) {
				return
			}
		} else {
			record(p.hist, time.Since(start))
			for i, id := range ids {
				p.checker.Published(msgKey{p.id, seq + uint64(i)}, id, true)
			}
			p.live.published.Add(int64(n))
		}
		seq += uint64(n)
	}
}

// refusedByBroker reports whether a failed publish was certainly not
// applied: the broker refused it before writing (the queue is full, the
// request is bad, the queue is missing or of the wrong kind). Any other
// failure (Unavailable, DeadlineExceeded, Canceled, Internal, Unknown, an
// error without a status) may have been applied after all, so its messages
// are uncertain.
func refusedByBroker(err error) bool {
	for _, refusal := range []error{qbroker.ErrResourceExhausted, qbroker.ErrInvalidArgument, qbroker.ErrNotFound,
		qbroker.ErrFailedPrecondition, qbroker.ErrAlreadyExists} {
		if errors.Is(err, refusal) {
			return true
		}
	}
	return false
}

// sleepUntil waits until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
