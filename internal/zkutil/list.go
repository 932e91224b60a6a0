package zkutil

import (
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"
)

// ChildrenData returns the children of p with their data, leaving out a
// child deleted between the listing and its read (ephemeral nodes come
// and go).
func ChildrenData(conn *zk.Conn, p string) (map[string][]byte, error) {
	names, _, err := conn.Children(p)
	if err != nil {
		return nil, fmt.Errorf("zkutil: children %s: %w", p, err)
	}
	out := make(map[string][]byte, len(names))
	for _, n := range names {
		data, _, err := conn.Get(p + "/" + n)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			continue
		case err != nil:
			return nil, fmt.Errorf("zkutil: get %s/%s: %w", p, n, err)
		}
		out[n] = data
	}
	return out, nil
}
