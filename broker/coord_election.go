package broker

import (
	"context"
	"path"
	"time"

	pb "github.com/qbroker/qbroker/api/queuepb"
	"github.com/qbroker/qbroker/election"
	"github.com/qbroker/qbroker/internal/events"
)

// electionServer serves qbroker.v1.Election (api/coord.proto) with the
// election recipe. It is its own type: the generated servers' embedded
// Unimplemented types cannot share one struct.
type electionServer struct {
	pb.UnimplementedElectionServer
	b *Broker
}

var _ pb.ElectionServer = electionServer{}

// electionPathOf checks an election's name and returns its node.
func (s electionServer) electionPathOf(name string) (string, error) {
	b := s.b
	if err := validName("election name", name); err != nil {
		return "", err
	}
	return b.root.ElectionOf(name)
}

// lookElection returns an Election under name for calls that only look
// or act by key: it creates no node.
func (s electionServer) lookElection(name string) (*election.Election, error) {
	b := s.b
	p, err := s.electionPathOf(name)
	if err != nil {
		return nil, err
	}
	return election.New(b.conn, p, election.WithCreateParents(false), election.WithLogger(b.log), election.WithACL(b.acl))
}

// Campaign implements pb.ElectionServer. The candidate is a node of the
// broker's primary session; the broker's other streams campaigning in the
// same election wait for their turn first (turns). The stream's end
// resigns (Close deletes the node).
func (s electionServer) Campaign(req *pb.CampaignRequest, stream pb.Election_CampaignServer) error {
	b := s.b
	ctx, end, err := b.openStream(stream.Context())
	if err != nil {
		return err
	}
	defer end()
	p, err := s.electionPathOf(req.GetName())
	if err == nil {
		err = checkValue(req.GetValue())
	}
	var delay time.Duration
	if err == nil {
		delay, err = lockDelayOf(req.GetLockDelay())
	}
	if err != nil {
		return b.fail(err)
	}
	release, err := b.coord.campaigns.acquire(ctx, req.GetName())
	if err != nil {
		return b.streamEnd()
	}
	defer release()
	owner := b.gate.coordOwner(ctx)
	if err := b.zkmem.admitNode(len(owner)+len(req.GetValue()), "this campaign"); err != nil {
		return b.fail(err)
	}
	e, err := election.New(b.conn, p, election.WithOwner(owner), election.WithLogger(b.log), election.WithACL(b.acl),
		election.WithDelay(delay))
	if err != nil {
		return b.fail(err)
	}
	defer s.closeElection(e)
	if err := e.Campaign(ctx, req.GetValue()); err != nil {
		if ctx.Err() != nil {
			return b.streamEnd()
		}
		return b.fail(err)
	}
	return s.holdLeadership(ctx, stream, req.GetName(), e)
}

// holdLeadership holds a won leadership until the stream or the
// leadership ends. A stream that the client cancelled or lost ends the
// leadership as a loss (Election.Abandon): a lock-delay then runs, since
// the client may only be cut off from this broker; Resign by key is the
// explicit end.
func (s electionServer) holdLeadership(ctx context.Context, stream pb.Election_CampaignServer, name string, e *election.Election) error {
	b := s.b
	done, key, token := e.Done(), e.Key(), e.Token()
	if key == "" {
		return b.fail(errLeadershipLost) // ended as soon as won
	}
	key = path.Base(key)
	b.metrics.leaders.Inc()
	defer b.metrics.leaders.Dec()
	b.ev.emitCoord(events.LeaderElected, "", name, key, token)
	defer b.ev.emitCoord(events.LeaderEnded, "", name, key, token)
	out := newOutbox(b, stream.Send)
	defer out.close()
	if err := out.send(ctx, &pb.LeaderEvent{Type: pb.LeaderEvent_TYPE_LEADING, Key: key, Token: token}); err != nil {
		return b.streamEnd()
	}
	select {
	case <-done:
		_ = out.send(ctx, &pb.LeaderEvent{Type: pb.LeaderEvent_TYPE_LOST, Key: key, Token: token})
		return b.fail(errLeadershipLost)
	case <-ctx.Done():
		if b.ctx.Err() == nil {
			actx, cancel := context.WithTimeout(context.Background(), closeTimeout)
			defer cancel()
			if err := e.Abandon(actx); err != nil {
				b.log.Warn("election: abandon failed; the node goes with the next campaign here or the session", "election", name, "err", err)
			}
		}
		return b.streamEnd()
	}
}

// closeElection resigns and ends e's goroutines. A failed delete leaves
// the node to the next campaign of this session in the election (it
// removes its session's orphans) or to the session's end.
func (s electionServer) closeElection(e *election.Election) {
	b := s.b
	if err := e.Close(); err != nil {
		b.log.Warn("election: resign failed; the node goes with the next campaign here or the session", "election", e.Path(), "err", err)
	}
}

// Proclaim implements pb.ElectionServer.
func (s electionServer) Proclaim(ctx context.Context, req *pb.ProclaimRequest) (*pb.ProclaimResponse, error) {
	b := s.b
	key, err := s.electionKey(req.GetName(), req.GetKey())
	if err == nil {
		err = checkValue(req.GetValue())
	}
	if err != nil {
		return nil, b.fail(err)
	}
	opts, id := s.electionKeyOpts(ctx, req.GetName())
	err = election.ProclaimKey(ctx, b.conn, key, req.GetValue(), opts...)
	if err != nil {
		return nil, b.fail(ofCaller(id, ActElectionAdmin, "election", req.GetName(), err))
	}
	return &pb.ProclaimResponse{}, nil
}

// Resign implements pb.ElectionServer.
func (s electionServer) Resign(ctx context.Context, req *pb.ResignRequest) (*pb.ResignResponse, error) {
	b := s.b
	key, err := s.electionKey(req.GetName(), req.GetKey())
	if err != nil {
		return nil, b.fail(err)
	}
	opts, id := s.electionKeyOpts(ctx, req.GetName())
	err = election.ResignKey(ctx, b.conn, key, opts...)
	if err != nil {
		return nil, b.fail(ofCaller(id, ActElectionAdmin, "election", req.GetName(), err))
	}
	return &pb.ResignResponse{}, nil
}

// electionKeyOpts: without election.admin on name, ctx's caller may
// proclaim or resign only its own candidates.
func (s electionServer) electionKeyOpts(ctx context.Context, name string) ([]election.KeyOption, Identity) {
	b := s.b
	own, id := b.gate.ownOnly(ctx, ActElectionAdmin, name)
	if own {
		return []election.KeyOption{election.IfOwner(id.Name)}, id
	}
	return nil, id
}

// electionKey checks an election's name and a candidate's key and returns
// the candidate's node.
func (s electionServer) electionKey(name, key string) (string, error) {
	p, err := s.electionPathOf(name)
	if err != nil {
		return "", err
	}
	return keyPath(p, key, "n-")
}

// Leader implements pb.ElectionServer.
func (s electionServer) Leader(ctx context.Context, req *pb.LeaderRequest) (*pb.LeaderInfo, error) {
	b := s.b
	e, err := s.lookElection(req.GetName())
	if err != nil {
		return nil, b.fail(err)
	}
	defer s.closeElection(e)
	l, err := e.Leader(ctx)
	if err != nil {
		return nil, b.fail(err)
	}
	return leaderInfo(l), nil
}

func leaderInfo(l election.LeaderInfo) *pb.LeaderInfo {
	return &pb.LeaderInfo{Key: path.Base(l.Key), Value: l.Value, Token: l.Token}
}

// Observe implements pb.ElectionServer: the recipe's Observe, sent as it
// comes, until the stream ends.
func (s electionServer) Observe(req *pb.ObserveRequest, stream pb.Election_ObserveServer) error {
	b := s.b
	ctx, end, err := b.openStream(stream.Context())
	if err != nil {
		return err
	}
	defer end()
	e, err := s.lookElection(req.GetName())
	if err != nil {
		return b.fail(err)
	}
	defer s.closeElection(e)
	out := newOutbox(b, stream.Send)
	defer out.close()
	for l := range e.Observe(ctx) {
		if err := out.send(ctx, leaderInfo(l)); err != nil {
			break
		}
	}
	return b.streamEnd()
}

// closeTimeout bounds the release of a lock or a leadership when its
// stream ends: the release is a ZooKeeper delete, and a failed one leaves
// the node to the session's end.
const closeTimeout = 5 * time.Second
