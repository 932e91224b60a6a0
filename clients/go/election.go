package qbroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// Leader describes the leader of an election.
type Leader struct {
	// Key is the leader's key (its candidate node's name).
	Key string
	// Value is the leader's value: as campaigned, or as last proclaimed.
	Value []byte
	// Token is the leadership's fencing token, greater for every later
	// leadership of the election.
	Token int64
}

// Leadership is a won election (the broker's Election service): held
// while its stream to the broker is open, ended by Resign, by the broker
// when the stream ends (this process died), or when the broker's
// ZooKeeper session ends (the broker died). A Leadership is safe for
// concurrent use.
type Leadership struct {
	c      *Client
	name   string
	key    string
	token  int64
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	resigned bool
	err      error
}

// CampaignOption configures Campaign.
type CampaignOption func(*campaignOptions)

type campaignOptions struct{ delay time.Duration }

// CampaignDelay sets the leadership's lock-delay (at most a minute; 0, the
// default, is none): when the leadership is lost without Resign (this
// process died or was cut off from the broker, or the broker's ZooKeeper
// session ended), nobody else leads until d has passed, so a leader that
// was only cut off can notice (Done) and stop first. Resign frees the
// election at once.
func CampaignDelay(d time.Duration) CampaignOption { return func(o *campaignOptions) { o.delay = d } }

// Campaign campaigns in the election name ([A-Za-z0-9._-]{1,200}) with
// value (at most 64 KiB) and waits until it leads, or ctx ends (which
// withdraws the candidate). ctx bounds the wait only: once won, the
// leadership lasts until Resign or its loss (Done). Errors:
// ErrInvalidArgument, ErrResourceExhausted (the broker's stream limit),
// ErrUnavailable, the context's error.
func (c *Client) Campaign(ctx context.Context, name string, value []byte, opts ...CampaignOption) (*Leadership, error) {
	var o campaignOptions
	for _, opt := range opts {
		opt(&o)
	}
	req := &pb.CampaignRequest{Name: name, Value: value}
	if o.delay != 0 {
		req.LockDelay = durationpb.New(o.delay)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s, err := c.elect.Campaign(sctx, req)
	var ev *pb.LeaderEvent
	if err == nil {
		ev, err = recvFirst(ctx, cancel, s.Recv)
	}
	if err == nil && ev.GetType() != pb.LeaderEvent_TYPE_LEADING {
		err = fmt.Errorf("unexpected first event %v", ev.GetType())
	}
	if err != nil {
		cancel()
		return nil, errorf("qbroker: campaign %s: %w", name, convErr(err))
	}
	l := &Leadership{c: c, name: name, key: ev.GetKey(), token: ev.GetToken(), cancel: cancel, done: make(chan struct{})}
	go l.run(s)
	return l, nil
}

// run owns the stream's receiving side until the leadership ends.
func (l *Leadership) run(s pb.Election_CampaignClient) {
	var err error
	for err == nil {
		_, err = s.Recv() // LOST, then the stream's end
	}
	l.mu.Lock()
	if !l.resigned {
		if errors.Is(err, io.EOF) {
			err = ErrUnavailable // the broker ended the stream without a reason
		}
		l.err = errorf("qbroker: leadership of %s: %w: %w", l.name, ErrLost, convErr(err))
	}
	l.mu.Unlock()
	l.cancel()
	close(l.done)
}

// Key returns the leader's key (for Client.Resign and Client.Proclaim).
func (l *Leadership) Key() string { return l.key }

// Token returns the leadership's fencing token.
func (l *Leadership) Token() int64 { return l.token }

// Done returns a channel closed when the leadership ends: at Resign, or
// at its loss (Err tells which). Stop acting as leader when it closes.
func (l *Leadership) Done() <-chan struct{} { return l.done }

// Err returns nil while leading and after Resign; once lost, an error
// matching ErrLost and the cause.
func (l *Leadership) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Proclaim sets the leader's value. Errors: ErrFailedPrecondition (no
// longer leading), ErrNotFound (the candidate is gone), ErrUnavailable.
func (l *Leadership) Proclaim(ctx context.Context, value []byte) error {
	return l.c.Proclaim(ctx, l.name, l.key, value)
}

// Resign ends the leadership: it removes the candidate (the next one
// leads once Resign returns nil) and closes the stream, whose end would
// remove it as well. It is idempotent; it returns the loss's error when
// the leadership had been lost before.
func (l *Leadership) Resign(ctx context.Context) error {
	l.mu.Lock()
	resigning := !l.resigned && l.err == nil
	l.resigned = l.resigned || resigning
	l.mu.Unlock()
	if resigning {
		if err := l.c.Resign(ctx, l.name, l.key); err != nil && !errors.Is(err, ErrNotFound) {
			l.cancel() // the stream's end resigns
			<-l.done
			return err
		}
	}
	l.cancel()
	select {
	case <-l.done:
		return l.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Proclaim sets the value of the leader key of the election name, through
// any broker. Errors: ErrFailedPrecondition (key does not lead),
// ErrNotFound (no such candidate), ErrInvalidArgument, ErrUnavailable.
func (c *Client) Proclaim(ctx context.Context, name, key string, value []byte) error {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	if _, err := c.elect.Proclaim(ctx, &pb.ProclaimRequest{Name: name, Key: key, Value: value}); err != nil {
		return errorf("qbroker: proclaim %s %s: %w", name, key, convErr(err))
	}
	return nil
}

// Resign removes the candidate key of the election name, leading or
// waiting, through any broker; its Leadership's Done closes with ErrLost.
// Errors: ErrNotFound (no such candidate), ErrInvalidArgument,
// ErrUnavailable.
func (c *Client) Resign(ctx context.Context, name, key string) error {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	if _, err := c.elect.Resign(ctx, &pb.ResignRequest{Name: name, Key: key}); err != nil {
		return errorf("qbroker: resign %s %s: %w", name, key, convErr(err))
	}
	return nil
}

// Leader returns the leader of the election name. Errors: ErrNotFound (no
// leader), ErrInvalidArgument, ErrUnavailable.
func (c *Client) Leader(ctx context.Context, name string) (Leader, error) {
	ctx, cancel := c.callCtx(ctx, 0)
	defer cancel()
	l, err := c.elect.Leader(ctx, &pb.LeaderRequest{Name: name})
	if err != nil {
		return Leader{}, errorf("qbroker: leader of %s: %w", name, convErr(err))
	}
	return Leader{Key: l.GetKey(), Value: l.GetValue(), Token: l.GetToken()}, nil
}

// Observe calls fn with the leader of the election name, then with each
// new leader and each value a leader proclaims, until ctx ends (it
// returns ctx's error), fn returns an error (returned), or the stream
// breaks (ErrUnavailable, ...). A leader that comes and goes while fn
// runs may be skipped; tokens never decrease. Errors: ErrInvalidArgument,
// ErrResourceExhausted, ErrUnavailable.
func (c *Client) Observe(ctx context.Context, name string, fn func(Leader) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.elect.Observe(ctx, &pb.ObserveRequest{Name: name})
	for err == nil {
		var l *pb.LeaderInfo
		if l, err = s.Recv(); err == nil {
			if ferr := fn(Leader{Key: l.GetKey(), Value: l.GetValue(), Token: l.GetToken()}); ferr != nil {
				return ferr
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, io.EOF) {
		err = ErrUnavailable
	}
	return errorf("qbroker: observe %s: %w", name, convErr(err))
}
