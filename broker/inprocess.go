package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// In-process calls.
//
// A front end served by the broker's process over another protocol (the
// web console, HTTP) must act exactly as a gRPC call of its user would:
// the same validation, quotas, authentication, authorization and audit.
// The Queue methods alone skip the interceptors that authenticate and
// authorize, so such a front end calls Invoke, with the caller described
// by CallerContext.

// CallerContext returns ctx as the broker sees an incoming call from the
// client at addr, over a connection with TLS state tlsState (nil: without
// TLS; a client certificate its handshake verified identifies the
// caller) and bearer token ("" none).
func CallerContext(ctx context.Context, addr net.Addr, tlsState *tls.ConnectionState, token string) context.Context {
	p := &peer.Peer{Addr: addr}
	if tlsState != nil {
		p.AuthInfo = credentials.TLSInfo{State: *tlsState,
			CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
	}
	md := metadata.MD{}
	if token != "" {
		md.Set("authorization", "Bearer "+token)
	}
	return metadata.NewIncomingContext(peer.NewContext(ctx, p), md)
}

// Authenticate returns the identity of the caller of ctx (see
// CallerContext); on is false when the broker runs without
// authentication (Config.Auth nil), and every caller may do everything.
// The error is an Unauthenticated status.
func (b *Broker) Authenticate(ctx context.Context) (id Identity, on bool, err error) {
	if b.cfg.Auth == nil {
		return Identity{}, false, nil
	}
	id, err = b.cfg.Auth.authenticate(ctx)
	return id, true, err
}

// Allowed reports whether the rules let id do action on name; without
// authentication everything is allowed.
func (b *Broker) Allowed(id Identity, action, name string) bool {
	if b.cfg.Auth == nil {
		return true
	}
	return b.cfg.Auth.rules.Get().Allowed(id.Name, action, name)
}

// Invoke calls the Queue service's unary method (its full name, such as
// queuepb.Queue_Purge_FullMethodName) with req, in process, through the
// same authentication, authorization, audit and call log
// as a gRPC call, on behalf of the caller ctx describes (CallerContext).
// Errors are gRPC statuses.
func (b *Broker) Invoke(ctx context.Context, method string, req proto.Message) (proto.Message, error) {
	var desc *grpc.MethodDesc
	for i, m := range pb.Queue_ServiceDesc.Methods {
		if "/"+pb.Queue_ServiceDesc.ServiceName+"/"+m.MethodName == method {
			desc = &pb.Queue_ServiceDesc.Methods[i]
		}
	}
	if desc == nil {
		return nil, status.Errorf(codes.Unimplemented, "no unary Queue method %s", method)
	}
	dec := func(m any) error {
		in := m.(proto.Message)
		if in.ProtoReflect().Descriptor() != req.ProtoReflect().Descriptor() {
			return status.Errorf(codes.InvalidArgument, "%s takes %s, not %s", method,
				in.ProtoReflect().Descriptor().FullName(), req.ProtoReflect().Descriptor().FullName())
		}
		proto.Merge(in, req)
		return nil
	}
	resp, err := desc.Handler(b, ctx, dec, b.gate.callUnary)
	if err != nil {
		return nil, err
	}
	return resp.(proto.Message), nil
}

// Member is a live broker.
type Member struct {
	ID string
	// Since is when it registered (its registration's time).
	Since time.Time
	// Leader: it leads the election (and sweeps expired leases).
	Leader bool
}

// Members lists the live brokers, by their registrations
// (/<root>/brokers/<id>), sorted by id, and marks the one the election
// names leader.
func (b *Broker) Members(ctx context.Context) ([]Member, error) {
	regs, err := zkutil.ChildrenData(b.conn, b.root.Brokers())
	if err != nil {
		return nil, b.fail(fmt.Errorf("broker: members: %w", err))
	}
	leader := ""
	el, err := election.New(b.conn, b.root.Election(), election.WithCreateParents(false))
	if err != nil {
		return nil, b.fail(err)
	}
	defer el.Close()
	switch li, err := el.Leader(ctx); {
	case err == nil:
		leader = string(li.Value)
	case !errors.Is(err, election.ErrNoLeader):
		return nil, b.fail(err)
	}
	ms := make([]Member, 0, len(regs))
	for id, data := range regs {
		m := Member{ID: id, Leader: id == leader}
		m.Since, _ = time.Parse(time.RFC3339, string(data))
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return ms, nil
}
