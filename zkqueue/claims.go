package zkqueue

import (
	"context"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"
)

// claims is how a claim reads its candidate and decides on it, for both
// kinds of claim: the at-most-once take (take, here) and the lease
// (Leases.claim). It keeps no state of its own: it reads through the
// memory of published messages and the group reads, and asks the
// optional features' gates (TTL, groups) only of a message that uses
// them.
type claims struct {
	*core
	recent *recent
	pubs   *publishes
	reads  *readGroup
	disp   *dispatcher
	groups *groups // nil without WithGroups
	ttl    *expiry // nil without a TTL
}

// take is the at-most-once claim: getData, then delete at the read
// version. Whoever deletes the node owns the message. If the delete's
// outcome is unknown (connection lost), the message is not returned: it
// may be lost, never delivered twice. A message that does not fit the
// caller's room (see fitClaimFunc) is not deleted.
func (c *claims) take(ctx context.Context, n Name, fit fitFunc) (Message, error) {
	p := itemPath(c.path, n)
	data, version, err := c.read(ctx, p, n)
	if err != nil {
		return Message{}, err
	}
	// Undecodable data is never delivered: the claim fails with
	// ErrBadData, and the node stays, skipped, until a purge
	// (baddata.go).
	m, err := decodeMessage(n, data, 1)
	if err != nil {
		return Message{}, err
	}
	if c.ttl != nil && c.ttl.expired(m, time.Now()) {
		return Message{}, c.ttl.expireClaimed(ctx, n, data, version)
	}
	var gops []any
	if m.Group != "" && c.groups != nil {
		entry, err := c.groups.gate(m)
		if err != nil {
			c.unread(n, data, version)
			return Message{}, err
		}
		if entry != "" {
			gops = c.groups.claimOps(m.Group, entry, false)
		}
	}
	if !fit.admits(m.wireSize()) {
		c.unread(n, data, version)
		return Message{}, fmt.Errorf("%s: %w", n.Raw, ErrNoRoom)
	}
	if _, err := c.write(ctx, append([]any{&zk.DeleteRequest{Path: p, Version: version}}, gops...)...); err != nil {
		return Message{}, fmt.Errorf("delete %s: %w", p, err)
	}
	if gops != nil {
		_ = c.zk.Delete(c.groups.groupPath(m.Group), -1) // idle now unless more wait
	}
	return m, nil
}

// takeNode is take for a packed queue (pack.go): it claims node n
// whole, a pack or a message of its own, and returns its messages. A
// plain message node (not a pack) goes through take, which knows the
// features' gates.
func (c *claims) takeNode(ctx context.Context, n Name, fit fitFunc) ([]Message, error) {
	p := itemPath(c.path, n)
	data, version, err := c.read(ctx, p, n)
	if err != nil {
		return nil, err
	}
	if !isPack(data) {
		c.unread(n, data, version)
		m, err := c.take(ctx, n, fit)
		if err != nil {
			return nil, err
		}
		return []Message{m}, nil
	}
	ms, _, err := decodeNode(n, data, 1)
	if err != nil {
		return nil, err
	}
	if !fit.admits(ms[0].wireSize()) {
		c.unread(n, data, version)
		return nil, fmt.Errorf("%s: %w", n.Raw, ErrNoRoom)
	}
	if _, err := c.write(ctx, &zk.DeleteRequest{Path: p, Version: version}); err != nil {
		return nil, fmt.Errorf("delete %s: %w", p, err)
	}
	return ms, nil
}

// takeAll is take without a Room.
func (c *claims) takeAll(ctx context.Context, n Name) (Message, error) {
	return c.take(ctx, n, nil)
}

// read returns the data and version of candidate n at p for its
// claim: remembered when this process published it, else read (group
// read, reads.go). A message with this process's publisher tag may be
// listed before its publish returned here: the claim waits for the
// publishes under way at the listing before it reads (publishes).
func (c *claims) read(ctx context.Context, p string, n Name) (data []byte, version int32, err error) {
	if data, ok := c.recent.take(n.Raw); ok {
		return data, 0, nil
	}
	if ownTag(n, c.opt.publisher) && c.pubs.settle(ctx, c.disp.listingPubs()) {
		if data, ok := c.recent.take(n.Raw); ok {
			return data, 0, nil
		}
	}
	r := c.reads.read(p)
	return r.data, r.version, r.err
}

// unread puts back what read took from the memory of published
// messages, for a candidate given back unclaimed. Data at version 0 is
// what the message was created with, whoever read it.
func (c *claims) unread(n Name, data []byte, version int32) {
	if version == 0 {
		c.recent.put(n, data)
	}
}
