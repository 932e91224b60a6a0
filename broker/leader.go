package broker

import (
	"errors"
	"path"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/qcore"
)

// Membership and leadership.
//
// Each broker registers an EPHEMERAL node /<root>/brokers/<id> and takes
// part in an election (the seeds' recipe): it creates an
// EPHEMERAL_SEQUENTIAL node under /<root>/election; the lowest node leads,
// every other broker watches only its predecessor (no herd). The leader
// sweeps expired leases. When the session expires, both nodes vanish and
// the broker registers again with its new session.

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

// memberOnce registers, runs the election and, when leading, the sweep,
// until the session expires or the broker closes.
func (b *Broker) memberOnce() error {
	// Drop a stale expiry signal: this round starts with a live session.
	select {
	case <-b.expired:
	default:
	}
	acl := zk.WorldACL(zk.PermAll)
	reg := b.brokersPath() + "/" + b.cfg.ID
	if _, err := b.conn.Create(reg, []byte(time.Now().UTC().Format(time.RFC3339)), zk.FlagEphemeral, acl); err != nil &&
		!errors.Is(err, zk.ErrNodeExists) {
		return err
	}
	me, err := b.conn.Create(b.electionPath()+"/n-", []byte(b.cfg.ID), zk.FlagEphemeral|zk.FlagSequence, acl)
	if err != nil {
		return err
	}
	me = path.Base(me)
	defer func() {
		// Best effort: on close or expiry the session takes it anyway.
		_ = b.conn.Delete(b.electionPath()+"/"+me, -1)
	}()
	for {
		children, _, err := b.conn.Children(b.electionPath())
		if err != nil {
			return err
		}
		pred, lead := predecessor(children, me)
		if lead {
			return b.lead()
		}
		ok, _, w, err := b.conn.ExistsW(b.electionPath() + "/" + pred)
		if err != nil {
			return err
		}
		if !ok {
			continue
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

// predecessor returns the election node just before me, or lead when me
// is the lowest. Election nodes are "n-<seq>", ordered by their sequence.
func predecessor(children []string, me string) (pred string, lead bool) {
	mine, ok := qcore.ParseName("qn-" + me[2:])
	if !ok {
		return "", true
	}
	var best qcore.Name
	for _, c := range children {
		n, ok := qcore.ParseName("qn-" + c[min(2, len(c)):])
		if !ok || n.Seq >= mine.Seq {
			continue
		}
		if best.Raw == "" || n.Seq > best.Seq {
			best, pred = n, c
		}
	}
	return pred, pred == ""
}

// lead sweeps expired leases every SweepInterval while this broker leads.
func (b *Broker) lead() error {
	b.log.Info("leadership acquired")
	b.metrics.leader.Set(1)
	defer func() {
		b.metrics.leader.Set(0)
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
		if err := sw.run(); err != nil {
			b.log.Debug("sweep", "err", err)
		}
	}
}
