package broker

import (
	"context"
	"fmt"
)

// held is what a coordination stream keeps for its client: a lock grant
// or a semaphore lease.
type held interface {
	Key() string
	Lost() <-chan struct{}
	Revoked() <-chan struct{}
	Err() error
}

// holdSpec says what holdStream tells the client and logs of a holding.
type holdSpec[M any] struct {
	service string // the logs' prefix and name key: "lock", "semaphore"
	kind    string // what the logs call the holding: "lock", "semaphore lease"
	verb    string // what the logs call its release: "unlock", "release"
	name    string
	errLost error // what the stream fails with when the holding is lost

	release, abandon func(context.Context) error

	// The events the client is sent.
	granted, revokeRequested, lost M
}

// holdStream tells the client of its holding h and of revocation
// requests until the client releases it, the stream ends, or h is lost
// (the lost event, then Aborted). It releases h in every case; a stream
// that the client cancelled or lost without its release (or half-close)
// releases as a loss (abandon): a lock-delay then runs, since the client
// may only be cut off from this broker.
func holdStream[R, M any](b *Broker, ctx context.Context, rx *receiver[R], send func(M) error, h held, s holdSpec[M]) error {
	defer func() {
		uctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		release := s.release
		if !rx.saidLast() && b.ctx.Err() == nil {
			release = s.abandon
		}
		if err := release(uctx); err != nil {
			// The holding goes on deleting its node until the session ends.
			b.log.Warn(s.service+": "+s.verb+" failed; retried until the session ends", s.service, s.name, "znode", h.Key(), "err", err)
		}
	}()
	out := newOutbox(b, send)
	defer out.close()
	if err := out.send(ctx, s.granted); err != nil {
		return b.streamEnd()
	}
	revoked := h.Revoked()
	for {
		select {
		case <-h.Lost():
			_ = out.send(ctx, s.lost)
			b.log.Debug(s.kind+" lost", s.service, s.name, "err", h.Err())
			return b.fail(fmt.Errorf("%w: %s", s.errLost, s.name))
		case <-revoked:
			revoked = nil
			if err := out.send(ctx, s.revokeRequested); err != nil {
				return b.streamEnd()
			}
		case <-rx.ended.Done():
			return b.streamEnd()
		}
	}
}
