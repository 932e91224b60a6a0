// Package brokertest runs in-process brokers for tests: a broker serving
// gRPC on a 127.0.0.1 listener, stopped in the order `qbroker serve`
// stops one. It is shared by the tests of the broker, the Go client and
// the command line, so that they start and stop brokers the same way.
package brokertest

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/qbroker/qbroker/broker"
	"github.com/qbroker/qbroker/internal/ports"
)

// StopTimeout is how long Stop lets in-flight calls drain before it
// cuts the remaining connections.
const StopTimeout = 5 * time.Second

// Options adjust how Start serves a broker.
type Options struct {
	// Addr is the address to listen on; "" picks a free 127.0.0.1 port.
	// An address a stopped broker just released is retried while the
	// kernel still holds it, until the context of Start ends.
	Addr string
	// Limited wraps the listener in the broker's connection limits
	// (Broker.LimitListener), as `qbroker serve` does.
	Limited bool
	// ServerOptions are added to the broker's gRPC server.
	ServerOptions []grpc.ServerOption
}

// Server is a broker serving gRPC until Stop. Stop is safe for
// concurrent use; the fields are not to be changed.
type Server struct {
	Broker *broker.Broker
	GRPC   *grpc.Server
	Addr   string

	served chan struct{} // closed when Serve returned
	once   sync.Once
}

// Start creates a broker with cfg and serves it on o.Addr. The caller
// must Stop it.
func Start(ctx context.Context, cfg broker.Config, o Options) (*Server, error) {
	b, err := broker.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var lis net.Listener
	if o.Addr == "" {
		lis, err = listenFree()
	} else {
		lis, err = listen(ctx, o.Addr)
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	s := &Server{Broker: b, GRPC: b.GRPCServer(o.ServerOptions...), Addr: lis.Addr().String(), served: make(chan struct{})}
	if o.Limited {
		lis = b.LimitListener(lis)
	}
	go func() {
		defer close(s.served)
		_ = s.GRPC.Serve(lis)
	}()
	return s, nil
}

// listenFree listens on a port of ports.Free, so that a test can stop the
// server and start it again on its address, trying others while another
// process takes the one picked first.
func listenFree() (net.Listener, error) {
	for tries := 1; ; tries++ {
		addr, err := ports.FreeAddr()
		if err != nil {
			return nil, err
		}
		lis, err := net.Listen("tcp", addr)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || tries == 10 {
			return lis, err
		}
	}
}

// listen retries while a just-closed listener still holds the address.
func listen(ctx context.Context, addr string) (net.Listener, error) {
	for {
		lis, err := net.Listen("tcp", addr)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return lis, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop shuts the broker down the way `qbroker serve` does: health
// NOT_SERVING and streams ended, GracefulStop (a forced Stop after
// StopTimeout), then the ZooKeeper sessions closed. It returns when the
// server stopped serving. Only the first call does anything.
func (s *Server) Stop() {
	s.once.Do(func() {
		s.Broker.Stop(s.GRPC, StopTimeout)
		<-s.served
	})
}
