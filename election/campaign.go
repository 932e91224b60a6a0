package election

import (
	"context"
	"errors"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
	"github.com/qbroker/qbroker/lockdelay"
)

// prefix starts every candidate node's name: "n-" then ZooKeeper's
// sequence suffix (%010d).
const prefix = "n-"

// testHookWaiting, set by tests only, runs when the candidate key starts
// waiting for its predecessor pred to go.
var testHookWaiting func(key, pred string)

// Campaign takes part in the election with value as our node's data and
// blocks until we lead, then returns nil; Done, Token and Key describe
// the leadership until it ends (Resign, or lost: see Done).
//
// It creates an EPHEMERAL_SEQUENTIAL node <path>/n-<seq>; the lowest
// sequence leads. Every other candidate watches only the node just before
// its own (an exists watch) and looks again when that one changes, so a
// leader's departure wakes its successor alone.
//
// Candidate nodes of this session other than the one Campaign creates are
// orphans (a create whose answer was lost with the connection, a delete
// that failed) and Campaign deletes them: owned by a live session, they
// would otherwise stall the election.
//
// When ctx ends first Campaign deletes its node and returns ctx.Err(); on
// any other error it deletes its node too. When that delete fails (the
// connection is lost), Resign, Close or the next Campaign deletes it, and
// the session's end does anyway; so do the next Campaign and Close for a
// node whose create failed with the connection but may have been made.
// Errors of ZooKeeper are wrapped (zk.ErrNoNode when the election's node
// is missing). Campaign returns ErrCampaigning when a
// campaign of this session in this election is under way or leads,
// ErrNodeLost when our node vanished (the session expired while waiting),
// ErrClosed after Close.
func (e *Election) Campaign(ctx context.Context, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := e.begin(); err != nil {
		return err
	}
	key, err := e.create(value)
	if err != nil {
		e.mu.Lock()
		// The node may exist, its answer lost with the connection: the
		// next Campaign, or Close, looks for it.
		e.unsure = e.unsure || zkutil.IsUnavailable(err)
		e.idle()
		e.mu.Unlock()
		return errfmt.Errorf("election: campaign: create in %s: %w", e.path, err)
	}
	e.mu.Lock()
	e.key = key
	e.mu.Unlock()
	err = e.wait(ctx, key)
	if err == nil {
		err = e.lead(key)
	}
	if err != nil {
		e.drop(key)
		return err
	}
	return nil
}

// create makes our candidate node. When the election's node is gone (a
// Reaper deleted it while idle) and New may create it, create makes it
// again and retries: the failed create made no node.
func (e *Election) create(value []byte) (string, error) {
	data := zkutil.EncodeOwned(e.owner, value)
	for i := 0; ; i++ {
		key, err := e.conn.Create(e.path+"/"+prefix, data, zk.FlagEphemeral|zk.FlagSequence, e.acl)
		if !errors.Is(err, zk.ErrNoNode) || !e.mayCreate || i == maxRecreate {
			return key, err
		}
		if err := zkutil.EnsurePath(e.conn, e.path, e.acl); err != nil {
			return "", err
		}
	}
}

// maxRecreate bounds how often one Campaign makes the election's node
// again after finding it gone.
const maxRecreate = 8

// wait blocks until key is the lowest candidate.
func (e *Election) wait(ctx context.Context, key string) error {
	me := path.Base(key)
	mine, _ := parseSeq(me) // ZooKeeper named it
	first := true
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		children, _, err := e.conn.Children(e.path)
		if err != nil {
			return errfmt.Errorf("election: campaign: children %s: %w", e.path, err)
		}
		if !slices.Contains(children, me) {
			return errfmt.Errorf("election: campaign: %s: %w", key, ErrNodeLost)
		}
		if first {
			// Orphans of an earlier campaign are older than our node;
			// one look at the list created with it finds them all.
			if children, err = e.dropOrphans(children, me); err != nil {
				return err
			}
			e.mu.Lock()
			e.unsure = false
			e.mu.Unlock()
			first = false
		}
		pred, ok := predecessor(children, mine)
		if !ok && !lockdelay.Blocked(children, nil) {
			return nil
		}
		if !ok {
			// First in line, but a lost leader's lock-delay runs: wait
			// it out, then look again.
			if err := e.waitDelay(ctx, key); err != nil {
				return err
			}
			continue
		}
		p := e.path + "/" + pred
		exists, _, w, err := e.conn.ExistsW(p)
		if err != nil {
			return errfmt.Errorf("election: campaign: exists %s: %w", p, err)
		}
		if !exists {
			continue
		}
		if testHookWaiting != nil {
			testHookWaiting(key, pred)
		}
		select {
		case <-w:
			// Deleted, changed, or the watch ended (session expired:
			// our node is gone too, which the next list shows).
		case <-ctx.Done():
			return ctx.Err()
		case <-e.closed:
			return ErrClosed
		}
	}
}

// waitDelay waits, first in line, until no lost leader's lock-delay
// holds the election, or ctx ends, or Close.
func (e *Election) waitDelay(ctx context.Context, key string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-e.closed:
			cancel()
		case <-done:
		}
	}()
	waited, err := lockdelay.Wait(ctx, e.conn, e.path, nil)
	if waited {
		e.log.Debug("waited for a lost leader's lock-delay", "znode", key)
	}
	select {
	case <-e.closed:
		return ErrClosed
	default:
	}
	if err != nil {
		return errfmt.Errorf("election: campaign: %w", err)
	}
	return nil
}

// dropOrphans deletes this session's candidate nodes other than me (all
// of them when me is "") and returns children without them (names that
// are not candidates' stay).
func (e *Election) dropOrphans(children []string, me string) ([]string, error) {
	sid := e.conn.SessionID()
	out := children[:0:0]
	for _, c := range children {
		if c == me {
			out = append(out, c)
			continue
		}
		if _, ok := parseSeq(c); !ok {
			out = append(out, c) // not a candidate (a lock-delay marker): kept for the caller
			continue
		}
		p := e.path + "/" + c
		ok, st, err := e.conn.Exists(p)
		if err != nil {
			return nil, errfmt.Errorf("election: campaign: exists %s: %w", p, err)
		}
		if !ok {
			continue
		}
		if st.EphemeralOwner == sid {
			if err := e.deleteOrphan(p); err != nil {
				return nil, err
			}
			continue
		}
		out = append(out, c)
	}
	return out, nil
}

func (e *Election) deleteOrphan(p string) error {
	e.log.Info("removing an orphaned candidate node of this session", "znode", p)
	if err := e.remove(p); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return errfmt.Errorf("election: campaign: delete orphan %s: %w", p, err)
	}
	return nil
}

// drop deletes the node of a campaign that failed; when the delete fails
// too, Resign and Close retry it (and the next Campaign finds it an
// orphan).
func (e *Election) drop(key string) {
	err := e.remove(key)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		e.log.Debug("campaign's node left behind", "znode", key, "err", err)
		e.stale = append(e.stale, key)
	}
	e.idle()
}

// parseSeq returns the sequence number of a candidate node's name,
// "n-" then at least 10 digits (ZooKeeper's %010d; a minus sign after the
// counter wrapped), parsed as a number: never compared as strings.
func parseSeq(name string) (int32, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || len(rest) < 10 || rest[0] == '+' {
		return 0, false
	}
	n, err := strconv.ParseInt(rest, 10, 32)
	if err != nil {
		return 0, false
	}
	return int32(n), true
}

// predecessor returns the candidate just before the sequence mine; false
// when mine is the lowest. Names that do not parse are not candidates.
func predecessor(children []string, mine int32) (string, bool) {
	var pred string
	var best int32
	for _, c := range children {
		n, ok := parseSeq(c)
		if !ok || n >= mine {
			continue
		}
		if pred == "" || n > best {
			pred, best = c, n
		}
	}
	return pred, pred != ""
}

// lowest returns the candidate with the lowest sequence, the leader; ""
// without candidates.
func lowest(children []string) string {
	var first string
	var best int32
	for _, c := range children {
		n, ok := parseSeq(c)
		if ok && (first == "" || n < best) {
			first, best = c, n
		}
	}
	return first
}
