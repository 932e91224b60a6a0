package main

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/status"
)

// liveCounters are updated by producers and consumers as they go and read
// by the progress line and the timeline.
type liveCounters struct {
	published  atomic.Int64 // messages whose publish succeeded
	deliveries atomic.Int64 // deliveries, redeliveries included
	acked      atomic.Int64
	errors     atomic.Int64
}

// errorCounts counts errors by gRPC code and by operation. It is safe for
// concurrent use.
type errorCounts struct {
	live *liveCounters

	mu     sync.Mutex
	byCode map[string]int64
	byOp   map[string]int64
}

func newErrorCounts(live *liveCounters) *errorCounts {
	return &errorCounts{live: live, byCode: map[string]int64{}, byOp: map[string]int64{}}
}

// add counts err (of operation op: "publish", "ack", ...).
func (e *errorCounts) add(op string, err error) {
	code := errCode(err)
	e.live.errors.Add(1)
	e.mu.Lock()
	e.byCode[code]++
	e.byOp[op]++
	e.mu.Unlock()
}

// snapshot returns copies of the counts.
func (e *errorCounts) snapshot() (byCode, byOp map[string]int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.byCode), maps.Clone(e.byOp)
}

// errCode names err's gRPC code; the client's errors carry one.
func errCode(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "Canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "DeadlineExceeded"
	}
	return status.Code(err).String()
}
