package qbroker

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestErrorIs(t *testing.T) {
	all := []error{ErrNotFound, ErrAlreadyExists, ErrInvalidArgument, ErrFailedPrecondition, ErrResourceExhausted,
		ErrUnavailable, ErrAborted, ErrInternal, context.Canceled, context.DeadlineExceeded}
	for _, tc := range []struct {
		code codes.Code
		want error // nil: matches none
	}{
		{codes.NotFound, ErrNotFound},
		{codes.AlreadyExists, ErrAlreadyExists},
		{codes.InvalidArgument, ErrInvalidArgument},
		{codes.FailedPrecondition, ErrFailedPrecondition},
		{codes.ResourceExhausted, ErrResourceExhausted},
		{codes.Unavailable, ErrUnavailable},
		{codes.Aborted, ErrAborted},
		{codes.Internal, ErrInternal},
		{codes.Canceled, context.Canceled},
		{codes.DeadlineExceeded, context.DeadlineExceeded},
		{codes.Unimplemented, nil},
		{codes.PermissionDenied, nil},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			err := fmt.Errorf("qbroker: op: %w", convErr(status.Error(tc.code, "msg")))
			for _, s := range all {
				if got, want := errors.Is(err, s), s == tc.want; got != want {
					t.Errorf("errors.Is(%v, %v): got %v, want %v", err, s, got, want)
				}
			}
			if got := status.Code(err); got != tc.code {
				t.Errorf("status.Code: got %v, want %v", got, tc.code)
			}
			var e *Error
			if !errors.As(err, &e) || e.Code != tc.code || e.Message != "msg" {
				t.Errorf("errors.As: got %+v, want code %v message msg", e, tc.code)
			}
		})
	}
	if got := convErr(nil); got != nil {
		t.Errorf("convErr(nil): got %v, want nil", got)
	}
	plain := errors.New("plain")
	if got := convErr(plain); got != plain {
		t.Errorf("convErr(plain): got %v, want it unchanged", got)
	}
}

func TestTextRoundTrip(t *testing.T) {
	for _, k := range []QueueKind{KindFIFO, KindPriority, KindSync} {
		var got QueueKind
		b, _ := k.MarshalText()
		if err := got.UnmarshalText(b); err != nil || got != k {
			t.Errorf("QueueKind %v: got %v, %v", k, got, err)
		}
	}
	for _, m := range []DeliveryMode{AtMostOnce, AtLeastOnce} {
		var got DeliveryMode
		b, _ := m.MarshalText()
		if err := got.UnmarshalText(b); err != nil || got != m {
			t.Errorf("DeliveryMode %v: got %v, %v", m, got, err)
		}
	}
	var k QueueKind
	if err := k.UnmarshalText([]byte("lifo")); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("UnmarshalText(lifo): got %v, want ErrInvalidArgument", err)
	}
	var m DeliveryMode
	if err := m.UnmarshalText([]byte("exactly-once")); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("UnmarshalText(exactly-once): got %v, want ErrInvalidArgument", err)
	}
}

func TestServiceConfigParses(t *testing.T) {
	// grpc.NewClient validates the default service config.
	c, err := Dial(context.Background(), "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// An error of this package names the package once, however many of its
// errors it wraps, and still matches each of them.
func TestErrorfSaysPrefixOnce(t *testing.T) {
	err := errorf("qbroker: create %s: negative option: %w", "q", ErrInvalidArgument)
	if got, want := err.Error(), "qbroker: create q: negative option: invalid argument"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("errors.Is(%v, ErrInvalidArgument): false", err)
	}
	err = errorf("qbroker: lock %s: %w: %w", "l", ErrClosed, convErr(status.Error(codes.Aborted, "lost")))
	if got, want := err.Error(), "qbroker: lock l: closed: lost (Aborted)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrAborted) || status.Code(err) != codes.Aborted {
		t.Errorf("%v: want it to match ErrClosed, ErrAborted and code Aborted", err)
	}
}
