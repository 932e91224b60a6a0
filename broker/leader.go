package broker

import (
	"errors"
	"path"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/zkqueue"
)

// Membership and leadership.
//
// Each broker registers an EPHEMERAL node /<root>/brokers/<id> (kept by
// the registry, registry.go: created again under every new session, and
// taken over from an earlier session of the same id) and takes part in an
// election (the seeds' recipe): it creates an EPHEMERAL_SEQUENTIAL node
// under /<root>/election; the lowest node leads, every other broker
// watches only its predecessor (no herd). The leader sweeps expired
// leases, while it has a session. When the session expires, the election
// node vanishes and the broker runs again with its new session.

func (b *Broker) runMembership() {
	defer b.wg.Done()
	for b.ctx.Err() == nil {
		err := b.memberOnce()
		if b.ctx.Err() != nil {
			return
		}
		if err != nil {
			b.log.Debug("membership", "err", err)
		}
		select {
		case <-b.ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// memberOnce runs the election and, when leading, the sweep, until the
// session expires or the broker closes.
func (b *Broker) memberOnce() error {
	// Drop a stale expiry signal: this round starts with a live session.
	select {
	case <-b.expired:
	default:
	}
	acl := zk.WorldACL(zk.PermAll)
	me, err := b.conn.Create(b.electionPath()+"/n-", []byte(b.cfg.ID), zk.FlagEphemeral|zk.FlagSequence, acl)
	if err != nil {
		return err
	}
	me = path.Base(me)
	defer func() {
		// Best effort: on close or expiry the session takes it anyway;
		// when this fails, the next round removes it (dropOrphans).
		_ = b.conn.Delete(b.electionPath()+"/"+me, -1)
	}()
	for {
		children, _, err := b.conn.Children(b.electionPath())
		if err != nil {
			return err
		}
		if err := b.dropOrphans(children, me); err != nil {
			return err
		}
		pred, lead := predecessor(children, me)
		if lead {
			return b.lead()
		}
		ok, st, w, err := b.conn.ExistsW(b.electionPath() + "/" + pred)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if st.EphemeralOwner == b.conn.SessionID() {
			continue // an orphan of ours, deleted by the next pass
		}
		select {
		case <-w:
		case <-b.expired:
			return errors.New("session expired")
		case <-b.ctx.Done():
			return nil
		}
	}
}

// dropOrphans deletes this session's election nodes other than me: a
// create whose answer was lost with the connection, or a node whose
// delete failed, would otherwise stay, owned by a live session, and stall
// the election (no broker would ever lead past it).
func (b *Broker) dropOrphans(children []string, me string) error {
	sid := b.conn.SessionID()
	for _, c := range children {
		if c == me {
			continue
		}
		p := b.electionPath() + "/" + c
		ok, st, err := b.conn.Exists(p)
		if err != nil {
			return err
		}
		if !ok || st.EphemeralOwner != sid {
			continue
		}
		b.log.Info("removing an orphaned election node of this session", "znode", p)
		if err := b.conn.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return err
		}
	}
	return nil
}

// predecessor returns the election node just before me, or lead when me
// is the lowest. Election nodes are "n-<seq>", ordered by their sequence.
func predecessor(children []string, me string) (pred string, lead bool) {
	mine, ok := zkqueue.ParseName("qn-" + me[2:])
	if !ok {
		return "", true
	}
	var best zkqueue.Name
	for _, c := range children {
		n, ok := zkqueue.ParseName("qn-" + c[min(2, len(c)):])
		if !ok || n.Seq >= mine.Seq {
			continue
		}
		if best.Raw == "" || n.Seq > best.Seq {
			best, pred = n, c
		}
	}
	return pred, pred == ""
}

// lead sweeps expired leases every SweepInterval while this broker leads
// and has a session: without one it cannot know whether it still leads
// (qbroker_leader is 0 meanwhile).
func (b *Broker) lead() error {
	b.log.Info("leadership acquired")
	b.leading.Store(true)
	b.updateLeader()
	defer func() {
		b.leading.Store(false)
		b.updateLeader()
		b.log.Info("leadership released")
	}()
	t := time.NewTicker(b.cfg.SweepInterval)
	defer t.Stop()
	sw := b.newLeaseSweep()
	for {
		select {
		case <-b.ctx.Done():
			return nil
		case <-b.expired:
			return errors.New("session expired")
		case <-t.C:
		}
		if !b.hasSession.Load() {
			continue
		}
		if err := sw.run(); err != nil {
			b.log.Debug("sweep", "err", err)
		}
	}
}
