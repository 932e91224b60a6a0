package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/go-zookeeper/zk"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/lock"
	"github.com/qbroker/qbroker/zkqueue"
)

func TestToStatus(t *testing.T) {
	tests := []struct {
		err  error
		want codes.Code
	}{
		{invalidf("bad name"), codes.InvalidArgument},
		{fmt.Errorf("publish: %w", zkqueue.ErrTooLarge), codes.InvalidArgument},
		{zkqueue.ErrBatchTooLarge, codes.InvalidArgument},
		{zkqueue.ErrEmptyBatch, codes.InvalidArgument},
		{fmt.Errorf("message 0: %w: 65 headers > 64", zkqueue.ErrBadAttributes), codes.InvalidArgument},
		{invalidPriority(300), codes.InvalidArgument},
		{fmt.Errorf("%w: q", errQueueNotFound), codes.NotFound},
		{errQueueExists, codes.AlreadyExists},
		{fmt.Errorf("member m %w queue q", errMemberExists), codes.AlreadyExists},
		{errWrongKind, codes.FailedPrecondition},
		{errNotOpen, codes.FailedPrecondition},
		{fmt.Errorf("ack: %w", zkqueue.ErrUnknownLease), codes.FailedPrecondition},
		{errSyncGroup, codes.FailedPrecondition},
		{errLimit, codes.ResourceExhausted},
		{fmt.Errorf("%w: 3 queues exist", zkqueue.ErrTooManyQueues), codes.ResourceExhausted},
		{zkqueue.ErrBadSpec, codes.InvalidArgument},
		{zkqueue.ErrBadName, codes.InvalidArgument},
		{errQueueDeleting, codes.Aborted},
		{errClosing, codes.Unavailable},
		{fmt.Errorf("get: %w", zk.ErrConnectionClosed), codes.Unavailable},
		{zk.ErrSessionExpired, codes.Unavailable},
		{zk.ErrNoServer, codes.Unavailable},
		{fmt.Errorf("claim: %w", zk.ErrNoNode), codes.Aborted},
		{zk.ErrBadVersion, codes.Aborted},
		{context.Canceled, codes.Canceled},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{errors.New("runtime error: index out of range [3] with length 3"), codes.Internal},
		{status.Error(codes.PermissionDenied, "kept"), codes.PermissionDenied},
		{fmt.Errorf("leader: %w", election.ErrNoLeader), codes.NotFound},
		{fmt.Errorf("resign: %w", election.ErrNoCandidate), codes.NotFound},
		{fmt.Errorf("proclaim: %w", election.ErrNotLeader), codes.FailedPrecondition},
		{election.ErrInvalid, codes.InvalidArgument},
		{errLeadershipLost, codes.Aborted},
		{errLockLost, codes.Aborted},
		{election.ErrNodeLost, codes.Aborted},
		{fmt.Errorf("unlock: %w", lock.ErrNotHeld), codes.FailedPrecondition},
		{lock.ErrInvalid, codes.InvalidArgument},
		{fmt.Errorf("x: %w", lock.ErrLost), codes.Aborted},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			err := toStatus(tt.err)
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code = %v, want %v", got, tt.want)
			}
			if tt.want == codes.Internal && strings.Contains(status.Convert(err).Message(), "index out of range") {
				t.Fatalf("internal details sent to the client: %q", status.Convert(err).Message())
			}
		})
	}
	if toStatus(nil) != nil {
		t.Fatal("toStatus(nil) != nil")
	}
}
