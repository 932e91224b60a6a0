package syncqueue

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"
)

// The start node's data names the group that opened the queue:
//
//	"qbroker-sync 1\n" + member ids, one a line, sorted
//
// A start node without this header (created by another client of the seed
// recipe, or by hand) admits every member.
const groupHeader = "qbroker-sync 1\n"

func encodeGroup(ids []string) []byte {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return []byte(groupHeader + strings.Join(ids, "\n"))
}

// inGroup reports whether id belongs to the group recorded in start's data.
func inGroup(data []byte, id string) bool {
	s, ok := strings.CutPrefix(string(data), groupHeader)
	if !ok {
		return true
	}
	for _, m := range strings.Split(s, "\n") {
		if m == id {
			return true
		}
	}
	return false
}

// complete opens the queue if at least q.members members are present. Every
// joiner calls it after creating its member node: the joiner whose node
// completes the group (in ZooKeeper's total order of writes) necessarily
// sees a full list, so some joiner always creates start. When more members
// are present than the group size (joiners racing past the last place),
// the group is the q.members earliest arrivals by creation zxid. Only one
// create of start succeeds, so its data is the one group; members not in
// it learn from it that they are out (ErrGroupFull).
func (q *Queue) complete() error {
	children, _, err := q.conn.Children(q.membersPath())
	if err != nil {
		return fmt.Errorf("children %s: %w", q.membersPath(), err)
	}
	if len(children) < q.members {
		return nil
	}
	group := children
	if len(children) > q.members {
		type arrival struct {
			id    string
			czxid int64
		}
		arrivals := make([]arrival, 0, len(children))
		for _, c := range children {
			ok, stat, err := q.conn.Exists(q.membersPath() + "/" + c)
			if err != nil {
				return fmt.Errorf("exists %s/%s: %w", q.membersPath(), c, err)
			}
			if ok {
				arrivals = append(arrivals, arrival{c, stat.Czxid})
			}
		}
		if len(arrivals) < q.members {
			return nil // some left meanwhile; whoever joins next completes
		}
		slices.SortFunc(arrivals, func(a, b arrival) int { return cmp.Compare(a.czxid, b.czxid) })
		group = make([]string, q.members)
		for i := range group {
			group[i] = arrivals[i].id
		}
	}
	return q.createStart(group)
}

// createStart creates the start node naming group. An existing start node
// (someone else completed the group first) is not an error.
func (q *Queue) createStart(group []string) error {
	_, err := q.conn.Create(q.startPath(), encodeGroup(group), 0, q.acl)
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("create %s: %w", q.startPath(), err)
	}
	return nil
}
