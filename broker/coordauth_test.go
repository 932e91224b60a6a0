package broker_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/zktest"
)

const coordRules = `# identity  actions           patterns
admin       all               *
alice       lock              shared,own
bob         lock              shared
carol       election          sched
dave        election          sched
watcher     election.observe  sched
`

// newCoordBroker starts a broker with TLS and authentication, tokens for
// the identities of coordRules and its log in e.log.
func newCoordBroker(t *testing.T) *secureEnv {
	t.Helper()
	return newAuthBroker(t, coordRules, []string{"admin", "alice", "bob", "carol", "dave", "watcher"})
}

func (e *secureEnv) conn(t *testing.T, identity string) *grpc.ClientConn {
	return dialTLS(t, e.tb.addr, e.roots(), nil, e.tokens[identity])
}

// wantAudit waits for an audit line matching each pattern.
func (e *secureEnv) wantAudit(t *testing.T, patterns ...string) {
	t.Helper()
	for _, p := range patterns {
		re := regexp.MustCompile(p)
		zktest.WaitFor(t, 10*time.Second, "an audit line matching "+p, func() bool { return re.MatchString(e.log.String()) })
	}
}

// An identity with lock on a name can neither release nor revoke another
// identity's grant, even with its key and token, and never learns them;
// the holder can, and so can an admin (lock.admin). The refusals and the
// revocations are in the audit log.
func TestLockOfAnotherIdentity(t *testing.T) {
	e := newCoordBroker(t)
	ctx := callCtx(t)
	alice, bob, admin := pb.NewLockClient(e.conn(t, "alice")), pb.NewLockClient(e.conn(t, "bob")), pb.NewLockClient(e.conn(t, "admin"))

	s, granted, err := lockGranted(ctx, alice, "shared", "alice's")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := bob.Revoke(ctx, &pb.RevokeRequest{Name: "shared"})
	mustCode(t, "Revoke of alice's lock by bob", err, codes.PermissionDenied)
	if resp.GetHolder().GetKey() != "" || resp.GetHolder().GetToken() != 0 {
		t.Fatalf("bob's refused Revoke disclosed %v", resp.GetHolder())
	}
	_, err = bob.Unlock(ctx, &pb.UnlockRequest{Name: "shared", Key: granted.GetKey(), Token: granted.GetToken()})
	mustCode(t, "Unlock of alice's grant by bob, with its key and token", err, codes.PermissionDenied)

	// Nothing reached alice: her next event is the revocation she asks
	// for herself, answered with her own key and token.
	own, err := alice.Revoke(ctx, &pb.RevokeRequest{Name: "shared"})
	if err != nil {
		t.Fatalf("alice's Revoke of her own lock: %v", err)
	}
	if own.GetHolder().GetKey() != granted.GetKey() || own.GetHolder().GetToken() != granted.GetToken() {
		t.Fatalf("alice's Revoke answered %v, want her grant %s %d", own.GetHolder(), granted.GetKey(), granted.GetToken())
	}
	if ev, err := s.Recv(); err != nil || ev.GetType() != pb.LockEvent_TYPE_REVOKE_REQUESTED {
		t.Fatalf("alice's stream: got %v, %v; want REVOKE_REQUESTED (and no loss before)", ev, err)
	}

	// An admin may revoke and release it.
	h, err := admin.Revoke(ctx, &pb.RevokeRequest{Name: "shared"})
	if err != nil || h.GetHolder().GetKey() != granted.GetKey() {
		t.Fatalf("admin's Revoke: %v, %v", h, err)
	}
	if _, err := admin.Unlock(ctx, &pb.UnlockRequest{Name: "shared", Key: granted.GetKey(), Token: granted.GetToken()}); err != nil {
		t.Fatalf("admin's Unlock: %v", err)
	}
	for {
		ev, err := s.Recv()
		if err != nil {
			mustCode(t, "alice's stream after the admin's Unlock", err, codes.Aborted)
			break
		}
		if ev.GetType() == pb.LockEvent_TYPE_LOST {
			continue
		}
	}

	// The holder releases its own grant by key.
	_, g2, err := lockGranted(ctx, alice, "own", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Unlock(ctx, &pb.UnlockRequest{Name: "own", Key: g2.GetKey(), Token: g2.GetToken()}); err != nil {
		t.Fatalf("alice's Unlock of her own grant: %v", err)
	}

	// No credentials at all.
	_, err = pb.NewLockClient(dialTLS(t, e.tb.addr, e.roots(), nil, "")).Revoke(ctx, &pb.RevokeRequest{Name: "shared"})
	mustCode(t, "Revoke without credentials", err, codes.Unauthenticated)

	e.wantAudit(t,
		`msg=audit .*action=revoke lock=shared .*grpc_code=PermissionDenied identity=bob via=token`,
		`msg=audit .*action=unlock lock=shared .*grpc_code=PermissionDenied identity=bob via=token`,
		`msg=audit .*action=revoke lock=shared .*grpc_code=OK identity=alice via=token`,
		`msg=audit .*action=revoke lock=shared .*grpc_code=OK identity=admin via=token`,
		`msg=audit .*action=unlock lock=shared .*grpc_code=OK identity=admin via=token`,
		`msg=audit .*action=unlock lock=own .*grpc_code=OK identity=alice via=token`,
		`msg=audit .*action=revoke lock=shared .*grpc_code=Unauthenticated`,
	)
}

// An identity allowed only to observe an election sees its leader but
// can neither campaign, proclaim nor resign; a candidate with election
// can change only its own leadership; an admin (election.admin) can
// change any.
func TestElectionObserveOnly(t *testing.T) {
	e := newCoordBroker(t)
	ctx := callCtx(t)
	carol, dave := pb.NewElectionClient(e.conn(t, "carol")), pb.NewElectionClient(e.conn(t, "dave"))
	watcher, admin := pb.NewElectionClient(e.conn(t, "watcher")), pb.NewElectionClient(e.conn(t, "admin"))

	camp, err := carol.Campaign(ctx, &pb.CampaignRequest{Name: "sched", Value: []byte("carol")})
	if err != nil {
		t.Fatal(err)
	}
	lead, err := camp.Recv()
	if err != nil || lead.GetType() != pb.LeaderEvent_TYPE_LEADING {
		t.Fatalf("carol's campaign: %v, %v", lead, err)
	}
	key := lead.GetKey()
	leaderIs := func(value string) {
		t.Helper()
		l, err := watcher.Leader(ctx, &pb.LeaderRequest{Name: "sched"})
		if err != nil || l.GetKey() != key || string(l.GetValue()) != value {
			t.Fatalf("Leader seen by watcher: %v, %v; want %s with %q", l, err, key, value)
		}
	}
	leaderIs("carol")
	obs, err := watcher.Observe(ctx, &pb.ObserveRequest{Name: "sched"})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := obs.Recv(); err != nil || l.GetKey() != key {
		t.Fatalf("watcher's Observe: %v, %v", l, err)
	}

	c, err := watcher.Campaign(ctx, &pb.CampaignRequest{Name: "sched", Value: []byte("w")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Recv()
	mustCode(t, "Campaign by watcher", err, codes.PermissionDenied)
	for _, who := range []struct {
		name string
		c    pb.ElectionClient
	}{{"watcher", watcher}, {"dave", dave}} {
		_, err = who.c.Proclaim(ctx, &pb.ProclaimRequest{Name: "sched", Key: key, Value: []byte(who.name)})
		mustCode(t, "Proclaim over carol's leadership by "+who.name, err, codes.PermissionDenied)
		_, err = who.c.Resign(ctx, &pb.ResignRequest{Name: "sched", Key: key})
		mustCode(t, "Resign of carol's leadership by "+who.name, err, codes.PermissionDenied)
	}
	leaderIs("carol")

	if _, err := carol.Proclaim(ctx, &pb.ProclaimRequest{Name: "sched", Key: key, Value: []byte("carol-2")}); err != nil {
		t.Fatalf("carol's Proclaim of her own leadership: %v", err)
	}
	leaderIs("carol-2")
	if _, err := admin.Proclaim(ctx, &pb.ProclaimRequest{Name: "sched", Key: key, Value: []byte("admin")}); err != nil {
		t.Fatalf("admin's Proclaim: %v", err)
	}
	leaderIs("admin")
	if _, err := admin.Resign(ctx, &pb.ResignRequest{Name: "sched", Key: key}); err != nil {
		t.Fatalf("admin's Resign: %v", err)
	}
	for {
		ev, err := camp.Recv()
		if err != nil {
			mustCode(t, "carol's campaign after the admin's Resign", err, codes.Aborted)
			break
		}
		if ev.GetType() != pb.LeaderEvent_TYPE_LOST {
			t.Fatalf("carol's campaign: got %v, want LOST", ev)
		}
	}
	e.wantAudit(t,
		`msg=audit .*action=proclaim election=sched .*grpc_code=PermissionDenied identity=watcher via=token`,
		`msg=audit .*action=resign election=sched .*grpc_code=PermissionDenied identity=dave via=token`,
		`msg=audit .*action=proclaim election=sched .*grpc_code=OK identity=admin via=token`,
		`msg=audit .*action=resign election=sched .*grpc_code=OK identity=admin via=token`,
		`msg=audit .*action=election election=sched .*grpc_code=PermissionDenied identity=watcher via=token`,
	)
}

// Refusals of any call are audited with identity, action, name and code,
// and a JoinSync is audited.
func TestAuditRefusalsAndJoin(t *testing.T) {
	e := newCoordBroker(t)
	ctx := callCtx(t)
	_, err := pb.NewQueueClient(e.conn(t, "bob")).Publish(ctx, &pb.PublishRequest{Queue: "orders", Messages: []*pb.OutMessage{{Payload: []byte("x")}}})
	mustCode(t, "Publish by bob", err, codes.PermissionDenied)
	admin := pb.NewQueueClient(e.conn(t, "admin"))
	if _, err := admin.CreateQueue(ctx, &pb.CreateQueueRequest{Name: "meet", Kind: pb.QueueKind_QUEUE_KIND_SYNC, SyncMembers: 2}); err != nil {
		t.Fatal(err)
	}
	j, err := admin.JoinSync(ctx, &pb.JoinSyncRequest{Queue: "meet", MemberId: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Recv(); err != nil {
		t.Fatal(err)
	}
	j2, err := pb.NewQueueClient(e.conn(t, "bob")).JoinSync(ctx, &pb.JoinSyncRequest{Queue: "meet", MemberId: "m2"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = j2.Recv()
	mustCode(t, "JoinSync by bob", err, codes.PermissionDenied)
	e.wantAudit(t,
		`msg=audit .*action=publish queue=orders .*grpc_code=PermissionDenied identity=bob via=token`,
		`msg=audit .*action=join queue=meet .*grpc_code=OK identity=admin via=token`,
		`msg=audit .*action=join queue=meet .*grpc_code=PermissionDenied identity=bob via=token`,
	)
}

// The coordination actions: election implies election.observe, admin
// grants lock.admin and election.admin (not lock or election), and the
// .admin actions do not imply taking part.
func TestCoordinationActions(t *testing.T) {
	r, err := broker.ParseRules([]byte(coordRules + "ops admin *\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		id, action, name string
		want             bool
	}{
		{"watcher", broker.ActElectionObserve, "sched", true},
		{"watcher", broker.ActElection, "sched", false},
		{"watcher", broker.ActElectionAdmin, "sched", false},
		{"carol", broker.ActElectionObserve, "sched", true},
		{"carol", broker.ActElectionAdmin, "sched", false},
		{"bob", broker.ActLock, "shared", true},
		{"bob", broker.ActLockAdmin, "shared", false},
		{"ops", broker.ActLockAdmin, "anything", true},
		{"ops", broker.ActElectionAdmin, "anything", true},
		{"ops", broker.ActElectionObserve, "anything", true},
		{"ops", broker.ActLock, "anything", false},
		{"ops", broker.ActElection, "anything", false},
		{"admin", broker.ActLockAdmin, "x", true}, // all
	} {
		if got := r.Allowed(tt.id, tt.action, tt.name); got != tt.want {
			t.Errorf("Allowed(%s, %s, %s): got %v, want %v", tt.id, tt.action, tt.name, got, tt.want)
		}
	}
	if _, err := broker.ParseRules([]byte("x lock.owner *\n")); err == nil || !strings.Contains(err.Error(), "lock.admin") {
		t.Errorf("unknown action: got %v, want an error listing the actions", err)
	}
}
