package zkutil

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/go-zookeeper/zk"
)

// ZooKeeper keeps the count and bytes of a subtree for the paths that have
// a quota: a node /zookeeper/quota/<path>/zookeeper_limits marks the path
// (the server adds it to its quota trie when the node is created), and
// /zookeeper/quota/<path>/zookeeper_stats holds "count=N,bytes=M", which
// the server computes over the subtree when the stats node is created and
// then updates with every create, delete and setData below the path, as
// part of applying the transaction. Reading it is one getData, whatever
// the subtree holds. The limits written here are -1 (none): ZooKeeper only
// logs a warning past a soft limit, and enforces hard limits only with
// zookeeper.enforceQuota, so the limit itself is qbroker's to enforce.
const (
	quotaRoot  = "/zookeeper/quota"
	quotaLimit = "zookeeper_limits"
	quotaStats = "zookeeper_stats"
	noLimits   = "count=-1,bytes=-1"
)

func quotaPath(p string) string { return quotaRoot + p }

// EnsureQuota makes ZooKeeper count the nodes and bytes under p (see
// QuotaStats). It is idempotent: existing quota nodes are left alone. The
// nodes it creates carry acl (nil: open), so that with a closed tree no
// other client can reset the counts the broker enforces quotas on; the
// server updates the statistics whatever their ACL.
func EnsureQuota(conn *zk.Conn, p string, acl []zk.ACL) error {
	qp := quotaPath(p)
	if err := EnsurePath(conn, qp, acl); err != nil {
		return fmt.Errorf("quota %s: %w", p, err)
	}
	for _, n := range []struct{ name, data string }{{quotaLimit, noLimits}, {quotaStats, "count=0,bytes=0"}} {
		if _, err := conn.Create(qp+"/"+n.name, []byte(n.data), 0, ACLOr(acl)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("quota %s: create %s: %w", p, n.name, err)
		}
	}
	return nil
}

// QuotaStats returns the nodes and data bytes ZooKeeper counts under p,
// p itself included: one getData. Without EnsureQuota for p it fails with
// zk.ErrNoNode.
func QuotaStats(conn *zk.Conn, p string) (count, bytes int64, err error) {
	data, _, err := conn.Get(quotaPath(p) + "/" + quotaStats)
	if err != nil {
		return 0, 0, fmt.Errorf("quota stats %s: %w", p, err)
	}
	count, bytes, err = parseQuotaStats(string(data))
	if err != nil {
		return 0, 0, fmt.Errorf("quota stats %s: %w", p, err)
	}
	return count, bytes, nil
}

// parseQuotaStats parses "count=N,bytes=M" (ZooKeeper's StatsTrack; newer
// servers add more keys, which are ignored).
func parseQuotaStats(s string) (count, bytes int64, err error) {
	seen := 0
	for _, kv := range strings.Split(strings.TrimSpace(s), ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		n, perr := strconv.ParseInt(v, 10, 64)
		switch k {
		case "count":
			count, err, seen = n, perr, seen|1
		case "bytes":
			bytes, err, seen = n, perr, seen|2
		default:
			continue
		}
		if err != nil {
			return 0, 0, fmt.Errorf("bad stats %q: %w", s, err)
		}
	}
	if seen != 3 {
		return 0, 0, fmt.Errorf("bad stats %q", s)
	}
	return count, bytes, nil
}

// RemoveQuota removes p's quota nodes and the parents under
// /zookeeper/quota that no other quota needs. Missing nodes are not an
// error.
func RemoveQuota(conn *zk.Conn, p string) error {
	qp := quotaPath(p)
	for _, n := range []string{qp + "/" + quotaStats, qp + "/" + quotaLimit} {
		if err := conn.Delete(n, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("remove quota %s: %w", p, err)
		}
	}
	for d := qp; d != quotaRoot && d != "/"; d = path.Dir(d) {
		err := conn.Delete(d, -1)
		if errors.Is(err, zk.ErrNotEmpty) {
			return nil // another quota lives below
		}
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return fmt.Errorf("remove quota %s: %w", p, err)
		}
	}
	return nil
}
