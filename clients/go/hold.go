package qbroker

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// hold is what a Lock and a Permit share: the holder's side of the stream
// that keeps a holding at the broker. It watches the stream for
// revocation requests and for its end, which is the holding's end: a
// release when the holder asked for it, a loss otherwise. It is safe for
// concurrent use.
type hold struct {
	what    string // what the loss's error calls it: "lock", "semaphore"
	name    string
	cancel  context.CancelFunc // ends the stream
	lost    chan struct{}      // closed when the holding ends
	revoked chan struct{}      // closed at the first revocation request

	mu        sync.Mutex
	releasing bool
	err       error
}

func newHold(what, name string, cancel context.CancelFunc) hold {
	return hold{what: what, name: name, cancel: cancel, lost: make(chan struct{}), revoked: make(chan struct{})}
}

// run owns the stream's receiving side until the holding ends: recv
// receives the next event and says whether it is a revocation request.
func (h *hold) run(recv func() (revoke bool, err error)) {
	var err error
	for {
		var revoke bool
		if revoke, err = recv(); err != nil {
			break
		}
		if revoke {
			select {
			case <-h.revoked:
			default:
				close(h.revoked)
			}
		}
	}
	h.mu.Lock()
	// After a release the stream ends with OK, or cancelled by the
	// release's ctx: both release the holding.
	released := h.releasing && (errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled)
	if !released {
		if errors.Is(err, io.EOF) {
			err = ErrUnavailable // the broker ended the stream without a reason
		}
		h.err = errorf("qbroker: %s %s: %w: %w", h.what, h.name, ErrLost, convErr(err))
	}
	h.mu.Unlock()
	h.cancel()
	close(h.lost)
}

// loss returns nil while held and after a release, the loss's error
// otherwise.
func (h *hold) loss() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// release asks the broker, with the stream's last request (last, sent
// by the first call only), to release the holding, and waits until ctx
// ends for the stream's end; when ctx ends first it closes the stream,
// which releases the holding as well. It returns loss's error.
func (h *hold) release(ctx context.Context, last func()) error {
	h.mu.Lock()
	first := !h.releasing
	h.releasing = true
	h.mu.Unlock()
	if first {
		// Only a release sends once the holding is granted, and only once.
		last()
	}
	select {
	case <-h.lost:
	case <-ctx.Done():
		h.cancel() // the stream's end releases the holding
		<-h.lost
	}
	return h.loss()
}
