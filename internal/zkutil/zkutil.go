// Package zkutil holds small ZooKeeper helpers shared by the recipes and the
// broker: connecting with a quiet logger, creating parent paths, and the
// classification of ZooKeeper errors.
package zkutil

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// MaxBuffer is the largest packet the client accepts, ZooKeeper's default
// jute.maxbuffer (1 MiB). A larger child list fails the read, which is why
// queues bound their size.
const MaxBuffer = 1 << 20

// Connect opens a session to servers. Connection events go to onEvent when
// it is not nil; go-zookeeper's own log lines go to logger at debug level.
func Connect(servers []string, sessionTimeout time.Duration, logger *slog.Logger, onEvent func(zk.Event)) (*zk.Conn, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cb := func(ev zk.Event) {
		if onEvent != nil {
			onEvent(ev)
		}
	}
	conn, _, err := zk.Connect(servers, sessionTimeout,
		zk.WithLogger(slogAdapter{logger}),
		zk.WithMaxBufferSize(4*MaxBuffer),
		zk.WithEventCallback(cb))
	if err != nil {
		return nil, fmt.Errorf("zk connect %v: %w", servers, err)
	}
	// The event channel is filled without blocking and dropped when full;
	// the callback sees every event, so the channel is not read.
	return conn, nil
}

// WaitConnected blocks until conn has a session (StateHasSession) or the
// timeout passes.
func WaitConnected(conn *zk.Conn, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for conn.State() != zk.StateHasSession {
		if time.Now().After(deadline) {
			return fmt.Errorf("zk: no session after %v (state %v)", timeout, conn.State())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Printf(format string, args ...any) {
	a.l.Debug(strings.TrimSpace(fmt.Sprintf(format, args...)), "component", "zk")
}

// EnsurePath creates p and its missing parents as persistent nodes with
// empty data. Existing nodes are left alone.
func EnsurePath(conn *zk.Conn, p string) error {
	if p == "/" {
		return nil
	}
	if ok, _, err := conn.Exists(p); err != nil {
		return fmt.Errorf("exists %s: %w", p, err)
	} else if ok {
		return nil
	}
	if err := EnsurePath(conn, path.Dir(p)); err != nil {
		return err
	}
	if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("create %s: %w", p, err)
	}
	return nil
}

// DeleteTree deletes p and everything below it. Nodes that vanish
// concurrently are not an error.
func DeleteTree(conn *zk.Conn, p string) error {
	children, _, err := conn.Children(p)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("children %s: %w", p, err)
	}
	for _, c := range children {
		if err := DeleteTree(conn, path.Join(p, c)); err != nil {
			return err
		}
	}
	if err := conn.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("delete %s: %w", p, err)
	}
	return nil
}

// IsUnavailable reports whether err means ZooKeeper could not be reached or
// the session is gone: the operation may be retried once it is back.
func IsUnavailable(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrSessionExpired) ||
		errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrClosing) ||
		errors.Is(err, zk.ErrSessionMoved)
}
