package broker

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

// The audit log: one info line "audit" per call that changes or removes
// what others use (a queue's creation, deletion, purge, redrive; a
// release, revocation, resignation or proclamation by key; a counter's
// Set; a sync member's join; a barrier set or removed), done or not, and per call refused for want of
// credentials or permission, whatever its method. Each line names the
// action, the kind and name of what it acts on, the caller (identity and
// how it authenticated; its address always) and the outcome (grpc_code).

// auditedMethods maps the audited calls to the action, kind and name
// their request names.
var auditedMethods = map[string]func(req any) (action, kind, name string){
	pb.Queue_CreateQueue_FullMethodName: func(r any) (string, string, string) {
		return ActCreate, "queue", r.(*pb.CreateQueueRequest).GetName()
	},
	pb.Queue_DeleteQueue_FullMethodName: func(r any) (string, string, string) {
		return ActDelete, "queue", r.(*pb.DeleteQueueRequest).GetName()
	},
	pb.Queue_Purge_FullMethodName: func(r any) (string, string, string) { return ActPurge, "queue", r.(*pb.PurgeRequest).GetName() },
	pb.Queue_Redrive_FullMethodName: func(r any) (string, string, string) {
		return ActRedrive, "queue", r.(*pb.RedriveRequest).GetQueue()
	},
	pb.Queue_JoinSync_FullMethodName: func(r any) (string, string, string) {
		return ActJoin, "queue", r.(*pb.JoinSyncRequest).GetQueue()
	},
	pb.Lock_Unlock_FullMethodName:       func(r any) (string, string, string) { return "unlock", "lock", r.(*pb.UnlockRequest).GetName() },
	pb.Lock_Revoke_FullMethodName:       func(r any) (string, string, string) { return "revoke", "lock", r.(*pb.RevokeRequest).GetName() },
	pb.Election_Resign_FullMethodName:   func(r any) (string, string, string) { return "resign", "election", r.(*pb.ResignRequest).GetName() },
	pb.Election_Proclaim_FullMethodName: func(r any) (string, string, string) { return "proclaim", "election", r.(*pb.ProclaimRequest).GetName() },
	pb.Counter_Set_FullMethodName:       func(r any) (string, string, string) { return "set", "counter", r.(*pb.CounterSetRequest).GetName() },
	pb.Semaphore_Release_FullMethodName: func(r any) (string, string, string) {
		return "release", "semaphore", r.(*pb.SemaphoreReleaseRequest).GetName()
	},
	pb.Semaphore_Revoke_FullMethodName: func(r any) (string, string, string) {
		return "revoke", "semaphore", r.(*pb.SemaphoreRevokeRequest).GetName()
	},
	pb.Semaphore_SetLimit_FullMethodName: func(r any) (string, string, string) {
		return "set_limit", "semaphore", r.(*pb.SemaphoreSetLimitRequest).GetName()
	},
	pb.Barrier_Set_FullMethodName: func(r any) (string, string, string) { return "set", "barrier", r.(*pb.SetBarrierRequest).GetName() },
	pb.Barrier_Remove_FullMethodName: func(r any) (string, string, string) {
		return "remove", "barrier", r.(*pb.RemoveBarrierRequest).GetName()
	},
}

// Refusals audited per caller and second; beyond, they are counted and
// the count goes with the caller's next audited refusal.
const auditRefusalsPerSecond = 20

// auditLimit bounds the audit lines of refused calls per caller.
type auditLimit struct {
	mu   sync.Mutex
	keys map[string]*auditKey
}

type auditKey struct {
	second  time.Time // the second being counted
	lines   int       // lines logged in it
	skipped int       // refusals not logged since the last line
}

// take reports whether a refusal of key may be logged now and how many
// were not logged before it.
func (l *auditLimit) take(key string) (skipped int, ok bool) {
	now := time.Now().Truncate(time.Second)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = map[string]*auditKey{}
	}
	if len(l.keys) > 10000 {
		// Identities come from the rules, but bound the map all the same.
		clear(l.keys)
	}
	k := l.keys[key]
	if k == nil {
		k = &auditKey{}
		l.keys[key] = k
	}
	if !k.second.Equal(now) {
		k.second, k.lines = now, 0
	}
	if k.lines >= auditRefusalsPerSecond {
		k.skipped++
		return 0, false
	}
	k.lines++
	skipped, k.skipped = k.skipped, 0
	return skipped, true
}

// audit logs an audited call of method with request req (nil when not
// read yet) by id, with its outcome err, and any call refused with
// Unauthenticated or PermissionDenied. Refusals are rate-limited per
// caller (auditLimit), so a client retrying a refused call in a loop
// cannot flood the log; what was left out is counted in the next line.
func (gt *gate) audit(ctx context.Context, method string, req any, id Identity, err error) {
	b := gt.b
	code := status.Code(err)
	refused := code == codes.Unauthenticated || code == codes.PermissionDenied
	f, audited := auditedMethods[method]
	if !audited && !refused {
		return
	}
	var action, kind, name string
	switch {
	case audited && req != nil:
		action, kind, name = f(req)
	default:
		action = method
		if ma, ok := authFor(method); ok && ma.needs != nil && req != nil {
			if need := ma.needs(req); len(need) > 0 {
				action, kind, name = need[0].action, need[0].kind, need[0].name
			}
		}
	}
	args := []any{"action", action}
	if kind != "" {
		args = append(args, kind, printable(name)) // queue=..., lock=..., election=...
	}
	args = append(args, "method", method, "peer", peerAddr(ctx), "grpc_code", code.String())
	if b.cfg.Auth != nil {
		args = append(args, "identity", id.Name, "via", id.Via)
	}
	if refused {
		key := id.Name
		if code == codes.Unauthenticated {
			key = "" // no identity: one budget for every unauthenticated caller
		}
		n, ok := gt.refusals.take(key)
		if !ok {
			return
		}
		if n > 0 {
			args = append(args, "refusals_not_logged", n)
		}
	}
	b.log.Info("audit", args...)
}
