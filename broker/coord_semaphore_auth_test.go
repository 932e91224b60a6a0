package broker_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/broker"
)

const semaphoreRules = `# identity  actions    patterns
admin       all        *
alice       semaphore  pool
bob         semaphore  pool
carol       lock       pool
`

// Permissions per action: semaphore lets an identity acquire and give
// back or revoke its own leases, never another identity's (even with its
// key and token, and without learning them); semaphore.admin (in admin)
// may act on any lease and change the limit; lock grants nothing on
// semaphores. Refusals and the calls by key are in the audit log.
func TestSemaphorePermissions(t *testing.T) {
	e := newAuthBroker(t, semaphoreRules, []string{"admin", "alice", "bob", "carol"})
	ctx := callCtx(t)
	alice, bob := pb.NewSemaphoreClient(e.conn(t, "alice")), pb.NewSemaphoreClient(e.conn(t, "bob"))
	carol, admin := pb.NewSemaphoreClient(e.conn(t, "carol")), pb.NewSemaphoreClient(e.conn(t, "admin"))

	_, _, err := acquired(ctx, carol, "pool", 2, 1, "")
	mustCode(t, "Acquire by carol (lock only)", err, codes.PermissionDenied)
	_, _, err = acquired(ctx, alice, "other", 2, 1, "")
	mustCode(t, "Acquire by alice of a semaphore no rule gives her", err, codes.PermissionDenied)

	s, g, err := acquired(ctx, alice, "pool", 2, 1, "alice's")
	if err != nil {
		t.Fatal(err)
	}
	bs, _, err := acquired(ctx, bob, "pool", 2, 1, "bob's")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := bob.Revoke(ctx, &pb.SemaphoreRevokeRequest{Name: "pool"})
	mustCode(t, "Revoke of every holder by bob, alice among them", err, codes.PermissionDenied)
	if len(resp.GetHolders()) != 0 {
		t.Fatalf("bob's refused Revoke disclosed %v", resp.GetHolders())
	}
	_, err = bob.Revoke(ctx, &pb.SemaphoreRevokeRequest{Name: "pool", Key: g.GetKey()})
	mustCode(t, "Revoke of alice's lease by bob, by key", err, codes.PermissionDenied)
	_, err = bob.Release(ctx, &pb.SemaphoreReleaseRequest{Name: "pool", Key: g.GetKey(), Token: g.GetToken()})
	mustCode(t, "Release of alice's lease by bob, with its key and token", err, codes.PermissionDenied)
	_, err = alice.SetLimit(ctx, &pb.SemaphoreSetLimitRequest{Name: "pool", Limit: 3})
	mustCode(t, "SetLimit by alice (no semaphore.admin)", err, codes.PermissionDenied)

	own, err := alice.Revoke(ctx, &pb.SemaphoreRevokeRequest{Name: "pool", Key: g.GetKey()})
	if err != nil || len(own.GetHolders()) != 1 || own.GetHolders()[0].GetToken() != g.GetToken() {
		t.Fatalf("alice's Revoke of her own lease: %v, %v", own, err)
	}
	if ev, err := s.Recv(); err != nil || ev.GetType() != pb.SemaphoreEvent_TYPE_REVOKE_REQUESTED {
		t.Fatalf("alice's stream: got %v, %v; want REVOKE_REQUESTED (and no loss before)", ev, err)
	}
	all, err := admin.Revoke(ctx, &pb.SemaphoreRevokeRequest{Name: "pool"})
	if err != nil || len(all.GetHolders()) != 2 {
		t.Fatalf("admin's Revoke of every holder: %v, %v", all, err)
	}
	if _, err := admin.SetLimit(ctx, &pb.SemaphoreSetLimitRequest{Name: "pool", Limit: 3}); err != nil {
		t.Fatalf("admin's SetLimit: %v", err)
	}
	if _, err := admin.Release(ctx, &pb.SemaphoreReleaseRequest{Name: "pool", Key: g.GetKey(), Token: g.GetToken()}); err != nil {
		t.Fatalf("admin's Release: %v", err)
	}
	for {
		ev, err := s.Recv()
		if err != nil {
			mustCode(t, "alice's stream after the admin's Release", err, codes.Aborted)
			break
		}
		if ev.GetType() != pb.SemaphoreEvent_TYPE_LOST {
			t.Fatalf("alice's stream after the admin's Release: %v", ev)
		}
	}
	if ev, err := bs.Recv(); err != nil || ev.GetType() != pb.SemaphoreEvent_TYPE_REVOKE_REQUESTED {
		t.Fatalf("bob's stream after the admin's Revoke: got %v, %v; want REVOKE_REQUESTED", ev, err)
	}
	if err := releaseStream(bs); err != nil {
		t.Fatal(err)
	}
	_, g2, err := acquired(ctx, alice, "pool", 3, 2, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Release(ctx, &pb.SemaphoreReleaseRequest{Name: "pool", Key: g2.GetKey(), Token: g2.GetToken()}); err != nil {
		t.Fatalf("alice's Release of her own lease: %v", err)
	}

	e.wantAudit(t,
		`msg=audit .*action=semaphore semaphore=pool .*grpc_code=PermissionDenied identity=carol via=token`,
		`msg=audit .*action=revoke semaphore=pool .*grpc_code=PermissionDenied identity=bob via=token`,
		`msg=audit .*action=release semaphore=pool .*grpc_code=PermissionDenied identity=bob via=token`,
		`msg=audit .*action=set_limit semaphore=pool .*grpc_code=PermissionDenied identity=alice via=token`,
		`msg=audit .*action=revoke semaphore=pool .*grpc_code=OK identity=alice via=token`,
		`msg=audit .*action=set_limit semaphore=pool .*grpc_code=OK identity=admin via=token`,
		`msg=audit .*action=release semaphore=pool .*grpc_code=OK identity=admin via=token`,
		`msg=audit .*action=release semaphore=pool .*grpc_code=OK identity=alice via=token`,
	)
}

// The semaphore actions: admin grants semaphore.admin, not semaphore;
// all grants both.
func TestSemaphoreActions(t *testing.T) {
	r, err := broker.ParseRules([]byte(semaphoreRules + "ops admin *\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		id, action, name string
		want             bool
	}{
		{"alice", broker.ActSemaphore, "pool", true},
		{"alice", broker.ActSemaphoreAdmin, "pool", false},
		{"carol", broker.ActSemaphore, "pool", false},
		{"ops", broker.ActSemaphoreAdmin, "anything", true},
		{"ops", broker.ActSemaphore, "anything", false},
		{"admin", broker.ActSemaphore, "x", true},
		{"admin", broker.ActSemaphoreAdmin, "x", true},
	} {
		if got := r.Allowed(tt.id, tt.action, tt.name); got != tt.want {
			t.Errorf("Allowed(%s, %s, %s): got %v, want %v", tt.id, tt.action, tt.name, got, tt.want)
		}
	}
}
