package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// A publish passes three bounds before it is written, each refused with
// ResourceExhausted (errLimit) and a message naming it:
//   - the queue's depth quota: the smaller of its own max_depth and the
//     broker's MaxDepth, whichever are set, against the ready messages
//     (the engine's Len, read at most every depthTTL);
//   - the queue's bytes quota (max_bytes), against the data bytes
//     ZooKeeper counts under the queue's node (its quota statistics:
//     one getData, read at most every depthTTL);
//   - ZooKeeper's data budget (zkMemory), shared by all queues.
// The quotas are approximate by what the queue takes in while a read is
// cached (and by what other brokers publish meanwhile): they bound a
// queue, not a message.

// depthLimit returns the depth quota that applies to q and what sets it,
// 0 when none does.
func (hs *handles) depthLimit(q *queue) (int, string) {
	b := hs.b
	own, broker := q.meta.MaxDepth, b.cfg.MaxDepth
	switch {
	case own > 0 && (broker == 0 || own <= broker):
		return own, "the queue's max_depth"
	case broker > 0:
		return broker, "--max-depth"
	}
	return 0, ""
}

// admitQuota checks the depth and data quotas of q against publishing n
// messages of payload bytes in all. Publish calls it, and counts what it
// published (queue.published, queue.addData), only for a queue with a
// quota.
func (hs *handles) admitQuota(ctx context.Context, q *queue, n int, payload int64) error {
	b := hs.b
	if limit, by := hs.depthLimit(q); limit > 0 {
		depth, err := q.depth(ctx)
		if err != nil {
			return err
		}
		if depth+n > limit {
			return fmt.Errorf("%w: queue %s holds %d ready or delayed messages, at most %d (%s)", errLimit, q.name, depth, limit, by)
		}
	}
	if q.meta.MaxBytes > 0 {
		held, err := q.dataBytes(ctx, b.conn, b.acl)
		if err != nil {
			return err
		}
		if held+payload > q.meta.MaxBytes {
			return fmt.Errorf("%w: queue %s holds %d bytes of data, and this publish adds %d, over its max_bytes of %d",
				errLimit, q.name, held, payload, q.meta.MaxBytes)
		}
	}
	return nil
}

// dataBytes returns the data bytes ZooKeeper counts under the queue's
// node, read at most every depthTTL, plus what this broker published
// since. A queue without quota statistics (created by a broker that did
// not set them up, or whose setup failed) gets them now.
func (q *queue) dataBytes(ctx context.Context, conn *zk.Conn, acl []zk.ACL) (int64, error) {
	q.dataMu.Lock()
	defer q.dataMu.Unlock()
	if time.Since(q.dataRead) < depthTTL {
		return q.dataN, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	_, n, err := zkutil.QuotaStats(conn, q.path)
	if errors.Is(err, zk.ErrNoNode) {
		if err = zkutil.EnsureQuota(conn, q.path, acl); err == nil {
			_, n, err = zkutil.QuotaStats(conn, q.path)
		}
	}
	if err != nil {
		return 0, err
	}
	q.dataN, q.dataRead = n, time.Now()
	return n, nil
}

// addData counts n bytes this broker published into the cached data size.
func (q *queue) addData(n int64) {
	q.dataMu.Lock()
	q.dataN += n
	q.dataMu.Unlock()
}
