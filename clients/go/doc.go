// Package qbroker is the Go client of qbroker, a message-queue broker
// whose only state is in Apache ZooKeeper.
//
//	c, err := qbroker.Dial(ctx, "127.0.0.1:7070")
//	...
//	defer c.Close()
//	_, err = c.CreateQueue(ctx, "orders", qbroker.QueueOptions{})
//	id, err := c.Publish(ctx, "orders", []byte("hello"))
//
//	cons, err := c.Consume(ctx, "orders", qbroker.ConsumeOptions{Mode: qbroker.AtLeastOnce, Prefetch: 8})
//	...
//	defer cons.Close()
//	for m := range cons.Messages() {
//		handle(m.Payload)
//		_ = m.Ack(ctx)
//	}
//
// # Connections
//
// Dial takes one broker address, a comma-separated list, or more with
// WithAddrs; calls are spread over the brokers round-robin, and the
// connection to each reconnects by itself. Unary calls that are safe to
// repeat (GetQueue, ListQueues, Stats, DeadLetters, CreateQueue,
// Message.Extend) are retried by gRPC when a broker is unavailable; the
// others (Publish, Receive, Ack, Nack, Purge, DeleteQueue, Redrive) are
// not, because a repeat could publish twice, lose a message or report a
// spurious error. A Consumer re-subscribes, with backoff, when its stream
// breaks because a broker went away, so it survives broker restarts.
//
// # Delivery
//
// AtMostOnce deletes a message as it is claimed: it is never delivered
// twice and is lost if the consumer dies before handling it. AtLeastOnce
// claims a lease for the visibility timeout: Ack deletes the message;
// Nack, an expired lease or a consumer that goes away redelivers it,
// with a higher DeliveryCount; past the queue's MaxDeliveries it becomes
// a dead letter (DeadLetters, Redrive). Ack tokens are opaque and any
// broker accepts them. A message handed to the application had a live
// lease at that moment: a delivery whose lease ran out before the
// application took it (one that waited in transit or in the prefetch
// while the application was busy) is dropped, since the broker redelivers
// it (Consumer.Expired counts them).
//
// A Consumer grants the broker credit, so it is never flooded: Prefetch
// messages may be in flight; at most once, one more is granted each time
// the application takes one; at least once, each time it settles one.
// The broker may send the messages it has ready for the stream together
// (up to Prefetch in one stream message); the Consumer hands them out one
// by one, as any other. Settlements go back the same way: the Consumer
// gathers them, with the credit they give back, into one stream message
// (up to a quarter of Prefetch, for at most a millisecond, at once when
// the application has nothing left to take). Ack then returns once its
// settlement is on its way; with ConsumeOptions.Confirm it returns once
// the broker answered that the ack committed, as the Ack call does, while
// the credit it gives back brings the next message meanwhile. Receive is
// the request/response alternative: a long poll for up to 100 messages.
//
// # Locks and elections
//
// Lock takes a distributed lock and holds it while its stream to the
// broker is open: Unlock releases it, and so does this process's death
// (the stream ends) or the broker's (its ZooKeeper session ends). Lost
// closes when the holding ends; Token is the grant's fencing token, to
// pass to what is written under the lock; Revoked closes when another
// client asks for the lock (Revoke). Campaign runs for leader the same
// way (Resign, Done, Token, Proclaim); Leader and Observe look on.
//
//	l, err := c.Lock(ctx, "nightly-report")
//	...
//	defer l.Unlock(ctx)
//	select {
//	case <-l.Lost():   // stop: someone else may hold it now
//	case <-work(l.Token()):
//	}
//
// Acquire takes permits of a counting semaphore the same way (a Permit:
// Release, Lost, Revoked, Token); RevokePermits, ReleasePermit and
// SetSemaphoreLimit act on any holder's lease or on the limit.
//
//	p, err := c.Acquire(ctx, "render-farm", 4) // one of 4 permits
//	...
//	defer p.Release(ctx)
//
// # Barriers
//
// SetBarrier, RemoveBarrier and WaitBarrier are the Barrier service: a
// set barrier holds every WaitBarrier until someone removes it.
// EnterBarrier is one participant of a double barrier: it returns once
// count participants are present; Participant.Leave returns once all of
// them left. Like a lock, a participant is present while its stream is
// open: Close, this process's death or its broker's leave at once.
//
// # Errors
//
// Broker errors are *Error values carrying the gRPC code; errors.Is
// matches them against ErrNotFound, ErrAlreadyExists,
// ErrInvalidArgument, ErrFailedPrecondition, ErrResourceExhausted,
// ErrUnavailable, ErrAborted, ErrInternal, ErrUnauthenticated,
// ErrPermissionDenied, context.Canceled and context.DeadlineExceeded. Each
// method names the ones it returns; any call to a broker with
// authentication on may fail with ErrUnauthenticated or
// ErrPermissionDenied.
//
// # Security
//
// WithTLS or WithTLSFiles dial over TLS (a client certificate for mutual
// TLS is re-read when its files change); WithToken sends a bearer token
// (of the brokers' tokens file, or a JWT) with every call, over TLS only;
// WithTokenSource sends one that changes, such as a JWT refreshed before
// it expires. A stream whose token is revoked or expires is ended by the
// broker with ErrUnauthenticated.
//
// # Goroutines
//
// A Client starts none of its own beyond gRPC's. Each Consumer and
// Membership runs one goroutine that owns its stream (with a helper that
// receives from it); Close and Leave stop them and wait. Each Lock and
// Leadership (and Participant) runs one goroutine receiving from its
// stream; it ends with the holding (Unlock, Resign, Leave, Close, or the
// loss).
package qbroker
