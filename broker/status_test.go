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
	"github.com/qbroker/qbroker/syncqueue"
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
		{fmt.Errorf("%w: 300 not in [0, 9]", zkqueue.ErrBadPriority), codes.InvalidArgument},
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

// An engine's refusal reaches the client in the broker's words: the code
// of what it means, the queue, message or member it concerns, and no
// ZooKeeper path or package prefix.
func TestEngineErrorsInWords(t *testing.T) {
	fifo := &queue{name: "f", meta: zkqueue.Spec{Kind: kindFIFO}}
	prio := &queue{name: "p", meta: zkqueue.Spec{Kind: kindPriority}}
	g := &queue{name: "g", meta: zkqueue.Spec{Kind: kindSync}}
	tests := []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{ofMember(g, "m1", fmt.Errorf("syncqueue: join /t/queues/g: %w: m1", syncqueue.ErrDuplicateMember)),
			codes.AlreadyExists, "member m1 already joined queue g"},
		{ofMember(g, "m2", fmt.Errorf("join /t/queues/g: %w: queue is open", syncqueue.ErrGroupFull)),
			codes.FailedPrecondition, "sync group: queue g admits no more members (it is open, or its group completed without m2)"},
		{ofMember(g, "m3", zk.ErrSessionExpired), codes.Unavailable, zk.ErrSessionExpired.Error()},
		{ofMessage(fifo, 0, fmt.Errorf("%w: 3 in a FIFO queue", zkqueue.ErrBadPriority)),
			codes.FailedPrecondition, "wrong queue kind: queue f is fifo: a priority needs a PRIORITY queue"},
		{ofMessage(prio, 1, fmt.Errorf("%w: 300 not in [0, 9]", zkqueue.ErrBadPriority)),
			codes.InvalidArgument, "zkqueue: priority out of range: 300 not in [0, 9]"},
		{ofMessage(fifo, 2, fmt.Errorf("%w: \"a/b\": only letters", zkqueue.ErrBadGroup)),
			codes.InvalidArgument, "invalid argument: message 2: group \"a/b\": only letters"},
		{ofMessage(fifo, 3, fmt.Errorf("%w: 9 bytes > 8", zkqueue.ErrTooLarge)),
			codes.InvalidArgument, "message 3: zkqueue: payload too large: 9 bytes > 8"},
		{fmt.Errorf("create: %w: 3 queues exist", zkqueue.ErrTooManyQueues),
			codes.ResourceExhausted, "create: zkqueue: too many queues: 3 queues exist (--max-queues)"},
		{ofCaller(Identity{Name: "bob"}, ActLockAdmin, "lock", "l", fmt.Errorf("unlock /t/locks/l/x: %w", lock.ErrNotOwner)),
			codes.PermissionDenied, `bob may not lock.admin lock "l" (it is another identity's)`},
		{ofCaller(Identity{Name: "bob"}, ActElectionAdmin, "election", "e", election.ErrNotOwner),
			codes.PermissionDenied, `bob may not election.admin election "e" (it is another identity's)`},
		{ofCaller(Identity{Name: "bob"}, ActLockAdmin, "lock", "l", lock.ErrNotHeld),
			codes.FailedPrecondition, lock.ErrNotHeld.Error()},
		{fmt.Errorf("publish: %w: /t/queues/q/delayed holds 5, at most 5", zkqueue.ErrTooManyDelayed),
			codes.ResourceExhausted, "broker limit reached: publish: zkqueue: too many delayed messages: /t/queues/q/delayed holds 5, at most 5"},
	}
	for _, tt := range tests {
		st := status.Convert(toStatus(tt.err))
		if st.Code() != tt.code || st.Message() != tt.msg {
			t.Errorf("%v: got %v %q, want %v %q", tt.err, st.Code(), st.Message(), tt.code, tt.msg)
		}
	}
}
