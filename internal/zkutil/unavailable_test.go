package zkutil

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/go-zookeeper/zk"
)

func TestIsUnavailable(t *testing.T) {
	brokenPipe := &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{zk.ErrConnectionClosed, true},
		{fmt.Errorf("create /q/items/qn-: %w", zk.ErrSessionExpired), true},
		{fmt.Errorf("multi: %w", brokenPipe), true},
		{fmt.Errorf("get: %w", io.EOF), true},
		{syscall.ECONNRESET, true},
		{zk.ErrNoNode, false},
		{zk.ErrBadVersion, false},
		{errors.New("something else"), false},
	} {
		if got := IsUnavailable(tc.err); got != tc.want {
			t.Errorf("IsUnavailable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
