package broker

import (
	"context"
	"errors"

	pb "github.com/qbroker/qbroker/api/queuepb"
)

var errSyncGroup = errors.New("sync group")

type syncGate struct{}

func (b *Broker) newSyncGate(q *queue) (*syncGate, error)                           { return &syncGate{}, nil }
func (g *syncGate) checkOpen(ctx context.Context) error                             { return errNotOpen }
func (g *syncGate) state(ctx context.Context) (int, bool, error)                    { return 0, false, nil }
func (b *Broker) JoinSync(req *pb.JoinSyncRequest, s pb.Queue_JoinSyncServer) error { return nil }
