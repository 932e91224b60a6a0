// Package zkutil holds small ZooKeeper helpers shared by the recipes and the
// broker: connecting with a quiet logger, creating parent paths, and the
// classification of ZooKeeper errors.
package zkutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/go-zookeeper/zk"
)

// MaxBuffer is the largest packet the client accepts, ZooKeeper's default
// jute.maxbuffer (1 MiB). A larger child list fails the read, which is why
// queues bound their size.
const MaxBuffer = 1 << 20

// MaxAnswer is the largest packet Connect's sessions accept: a multiRead
// answer of up to 16 MiB (zkqueue reads a claim round's messages in one,
// sized for the largest messages) plus one node's worth. go-zookeeper
// grows its receive buffer to the largest packet seen, so only sessions
// that read large messages in bulk pay for it.
const MaxAnswer = 16<<20 + MaxBuffer

// Connect opens a session to servers. Connection events go to onEvent when
// it is not nil; go-zookeeper's own log lines go to logger at debug level.
func Connect(servers []string, sessionTimeout time.Duration, logger *slog.Logger, onEvent func(zk.Event)) (*zk.Conn, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var (
		conn *zk.Conn
		err  error
	)
	logs, answers := zk.WithLogger(slogAdapter{logger}), zk.WithMaxBufferSize(MaxAnswer)
	if onEvent != nil {
		conn, _, err = zk.Connect(servers, sessionTimeout, logs, answers, zk.WithEventCallback(onEvent))
	} else {
		conn, _, err = zk.Connect(servers, sessionTimeout, logs, answers)
	}
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
// empty data and ACL acl (OpenACL when empty). Existing nodes are left
// alone.
func EnsurePath(conn *zk.Conn, p string, acl []zk.ACL) error {
	if p == "/" {
		return nil
	}
	if ok, _, err := conn.Exists(p); err != nil {
		return fmt.Errorf("exists %s: %w", p, err)
	} else if ok {
		return nil
	}
	if err := EnsurePath(conn, path.Dir(p), acl); err != nil {
		return err
	}
	if _, err := conn.Create(p, nil, 0, ACLOr(acl)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("create %s: %w", p, err)
	}
	return nil
}

// ErrGuardChanged is returned by DeleteTree when its Guard no longer holds:
// the guarded node is gone or has another version.
var ErrGuardChanged = errors.New("zk: delete guard changed")

// Guard makes DeleteTree conditional on a node's version: every delete
// checks it in the same transaction, and the guarded node itself, when it
// is part of the tree, is deleted at that version. A caller that marked a
// node for deletion with a versioned setData guards with the version the
// mark produced, so the deletion never reaches into a node created anew
// under the same path.
type Guard struct {
	Path    string
	Version int32
}

// testHookListed, set by this package's tests only, runs after DeleteTree
// listed p's children: tests create nodes there to stage a concurrent
// writer (DeleteTreeHooked does the same for other packages' tests).
var testHookListed func(p string)

// deleteChunk bounds the deletes of one Multi: 500 paths of a few hundred
// bytes stay far below jute.maxbuffer.
const deleteChunk = 500

// DeleteTree deletes p and everything below it, bottom-up, until ctx ends.
// Children created concurrently are deleted too: a node that is not empty
// when its delete runs is listed again. Nodes that vanish concurrently are
// not an error, and a p that does not exist is deleted already. Siblings
// are deleted up to 500 to a Multi.
//
// With guard set, DeleteTree returns ErrGuardChanged, without deleting
// anything more, once the guard no longer holds.
func DeleteTree(ctx context.Context, conn *zk.Conn, p string, guard *Guard) error {
	return DeleteTreeHooked(ctx, conn, p, guard, testHookListed)
}

// DeleteTreeHooked is DeleteTree running listed, when not nil, after each
// listing of a node's children and before their deletes: a test creates
// nodes there to stage, deterministically, a writer racing the deletion.
func DeleteTreeHooked(ctx context.Context, conn *zk.Conn, p string, guard *Guard, listed func(p string)) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		children, _, err := conn.Children(p)
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("children %s: %w", p, err)
		}
		if listed != nil {
			listed(p)
		}
		for len(children) > 0 {
			chunk := children[:min(deleteChunk, len(children))]
			children = children[len(chunk):]
			if err := deleteChildren(ctx, conn, p, chunk, guard, listed); err != nil {
				return err
			}
		}
		err = deleteNode(conn, p, guard)
		switch {
		case err == nil, errors.Is(err, zk.ErrNoNode):
			return nil
		case errors.Is(err, zk.ErrNotEmpty):
			// A child was created since the listing: list again.
		default:
			return err
		}
	}
}

// deleteChildren deletes the children names of p in one Multi (with the
// guard's check). An op that fails is taken out: a child that vanished is
// dropped, a child with children of its own is deleted as a tree; then the
// rest is tried again.
func deleteChildren(ctx context.Context, conn *zk.Conn, p string, names []string, guard *Guard, listed func(string)) error {
	for len(names) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		ops := make([]any, 0, len(names)+1)
		if guard != nil {
			ops = append(ops, &zk.CheckVersionRequest{Path: guard.Path, Version: guard.Version})
		}
		for _, c := range names {
			ops = append(ops, &zk.DeleteRequest{Path: path.Join(p, c), Version: -1})
		}
		res, err := conn.Multi(ops...)
		if err == nil {
			return nil
		}
		i, cause := failedOp(res, err)
		if guard != nil {
			if i == 0 {
				return guardErr(cause)
			}
			i--
		}
		if i < 0 || i >= len(names) {
			return fmt.Errorf("delete children of %s: %w", p, cause)
		}
		switch {
		case errors.Is(cause, zk.ErrNoNode):
		case errors.Is(cause, zk.ErrNotEmpty):
			if err := DeleteTreeHooked(ctx, conn, path.Join(p, names[i]), guard, listed); err != nil {
				return err
			}
		default:
			return fmt.Errorf("delete %s: %w", path.Join(p, names[i]), cause)
		}
		names = append(names[:i:i], names[i+1:]...)
	}
	return nil
}

// deleteNode deletes p alone: at the guard's version when p is the guarded
// node, in a Multi with the guard's check when it is below it.
func deleteNode(conn *zk.Conn, p string, guard *Guard) error {
	switch {
	case guard == nil:
		return wrapDelete(p, conn.Delete(p, -1))
	case guard.Path == p:
		err := conn.Delete(p, guard.Version)
		if errors.Is(err, zk.ErrBadVersion) {
			return ErrGuardChanged
		}
		return wrapDelete(p, err)
	}
	res, err := conn.Multi(&zk.CheckVersionRequest{Path: guard.Path, Version: guard.Version},
		&zk.DeleteRequest{Path: p, Version: -1})
	if err == nil {
		return nil
	}
	i, cause := failedOp(res, err)
	if i == 0 {
		return guardErr(cause)
	}
	return wrapDelete(p, cause)
}

func wrapDelete(p string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("delete %s: %w", p, err)
}

// guardErr is the outcome of a failed guard check: a guarded node that is
// gone or has another version has changed; anything else (the session
// lost) is returned as is.
func guardErr(err error) error {
	if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) {
		return ErrGuardChanged
	}
	return err
}

// failedOp returns the index and error of the op that failed a Multi, or
// -1 and the transaction's error when no op says (the request itself
// failed). The ops around the failing one answer ZAPIERROR ("not run
// because another op failed"), which says nothing of the cause.
func failedOp(res []zk.MultiResponse, err error) (int, error) {
	for i, r := range res {
		if r.Error != nil && !errors.Is(r.Error, zk.ErrAPIError) {
			return i, r.Error
		}
	}
	return -1, err
}

// MultiError returns the cause of a failed Multi: the failing op's error,
// more telling than the transaction's; nil when err is nil.
func MultiError(res []zk.MultiResponse, err error) error {
	if err == nil {
		return nil
	}
	_, cause := failedOp(res, err)
	return cause
}

// LoadOrCreate returns the data of p, creating p first with the data gen
// returns when p does not exist, with ACL acl (OpenACL when empty). Of
// concurrent callers, the first create wins and all of them return its
// data.
func LoadOrCreate(conn *zk.Conn, p string, acl []zk.ACL, gen func() ([]byte, error)) ([]byte, error) {
	data, err := gen()
	if err != nil {
		return nil, err
	}
	_, err = conn.Create(p, data, 0, ACLOr(acl))
	if err == nil {
		return data, nil
	}
	if !errors.Is(err, zk.ErrNodeExists) {
		return nil, fmt.Errorf("create %s: %w", p, err)
	}
	data, _, err = conn.Get(p)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", p, err)
	}
	return data, nil
}

// NumChildren returns the number of children of p from its Stat, without
// listing them; 0 when p does not exist.
func NumChildren(conn *zk.Conn, p string) (int, error) {
	_, stat, err := conn.Exists(p)
	if err != nil {
		return 0, fmt.Errorf("exists %s: %w", p, err)
	}
	if stat == nil {
		return 0, nil
	}
	return int(stat.NumChildren), nil
}

// Fired reports whether watch w has fired (a nil watch counts as fired:
// none is armed).
func Fired(w <-chan zk.Event) bool {
	if w == nil {
		return true
	}
	select {
	case <-w:
		return true
	default:
		return false
	}
}

// IsUnavailable reports whether err means ZooKeeper could not be reached or
// the session is gone: the operation may be retried once it is back.
func IsUnavailable(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrSessionExpired) ||
		errors.Is(err, zk.ErrNoServer) || errors.Is(err, zk.ErrClosing) ||
		errors.Is(err, zk.ErrSessionMoved) || isConnError(err)
}

// isConnError reports a failure of the connection itself: the client hands
// a request whose write or read failed the socket's error (a broken pipe
// after a pause or a server's death), not one of its own sentinels.
func isConnError(err error) bool {
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op)
}

// DeleteNodes deletes the given nodes, 500 to a Multi; a chunk that fails
// because a node vanished is retried node by node. It returns the count
// it deleted.
func DeleteNodes(ctx context.Context, conn *zk.Conn, paths []string) (int, error) {
	deleted := 0
	for len(paths) > 0 {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		chunk := paths[:min(500, len(paths))]
		paths = paths[len(chunk):]
		ops := make([]any, len(chunk))
		for i, p := range chunk {
			ops[i] = &zk.DeleteRequest{Path: p, Version: -1}
		}
		if _, err := conn.Multi(ops...); err == nil {
			deleted += len(chunk)
			continue
		} else if IsUnavailable(err) {
			return deleted, err
		}
		for _, p := range chunk {
			err := conn.Delete(p, -1)
			switch {
			case err == nil:
				deleted++
			case errors.Is(err, zk.ErrNoNode):
			default:
				return deleted, fmt.Errorf("delete %s: %w", p, err)
			}
		}
	}
	return deleted, nil
}

// MaxNameLen is the longest name CheckName accepts.
const MaxNameLen = 200

// nameByte reports whether c may appear in a name: [A-Za-z0-9._-].
func nameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}

// CheckName checks a name that becomes one path element (a queue name, a
// member or participant id): [A-Za-z0-9._-]{1,200}, not "." or "..". Such
// a name cannot escape its parent. The error says what is wrong, to follow
// what the name is ("queue name is empty").
func CheckName(s string) error {
	if s == "" {
		return errors.New("is empty")
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("is %d characters long, at most %d", len(s), MaxNameLen)
	}
	bad := s == "." || s == ".."
	for i := 0; i < len(s) && !bad; i++ {
		bad = !nameByte(s[i])
	}
	if bad {
		return fmt.Errorf("%q: only letters, digits, '.', '_' and '-' (not '.' or '..')", Printable(s))
	}
	return nil
}

// Printable shortens s to 40 bytes and makes it valid UTF-8, for error
// messages that quote what a client sent.
func Printable(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
