package counter

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
	"github.com/qbroker/qbroker/internal/zkutil"
)

// maxVersion is the highest data version a value node reaches: the write
// that finds its node at maxVersion moves the value to a new node
// (rollover) instead of writing it. It is far below the version's wrap
// (2^31-1, then negative numbers up to -1, which setData takes for "any
// version"), so no write ever takes a node near it. A variable so that
// tests can make rollovers frequent.
var maxVersion int32 = 1 << 30

// errStale says that the state an operation read is no longer the
// counter's: read again.
var errStale = errors.New("counter: changed")

// state is what an operation knows of the counter: its value node and
// that node's data version and value, or, with no value node yet, the
// counter node's data version (or that it does not exist).
type state struct {
	node    string // the value node's name; "" for none
	epoch   uint64 // node's epoch
	version int32  // node's data version; without a node, the counter node's
	value   int64
	absent  bool // no counter node at all
}

// nodeName returns the name of the value node of epoch: v-<epoch>-<nonce>,
// the nonce random, so a node made again after the counter's deletion
// never takes the name of one before.
func nodeName(epoch uint64) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("v-%020d-%016x", epoch, binary.BigEndian.Uint64(b[:]))
}

// parseName returns the epoch of a value node's name; ok false for a
// name that is not one.
func parseName(name string) (epoch uint64, ok bool) {
	rest, ok := strings.CutPrefix(name, "v-")
	if !ok {
		return 0, false
	}
	e, nonce, ok := strings.Cut(rest, "-")
	if !ok || len(e) != 20 || len(nonce) != 16 {
		return 0, false
	}
	if _, err := strconv.ParseUint(nonce, 16, 64); err != nil {
		return 0, false
	}
	epoch, err := strconv.ParseUint(e, 10, 64)
	return epoch, err == nil
}

func encode(v int64) []byte { return strconv.AppendInt(nil, v, 10) }

func (c *Counter) decode(node string, data []byte) (int64, error) {
	v, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil {
		return 0, errfmt.Errorf("counter: %s: data %q: %w", path.Join(c.path, node), zkutil.Printable(string(data)), ErrCorrupt)
	}
	return v, nil
}

// read returns the counter's state as the server the session is on has
// it: maybe stale, which a write or confirm then finds out.
func (c *Counter) read(hint string) (state, error) {
	if hint != "" {
		if st, err := c.readNode(hint); !errors.Is(err, zk.ErrNoNode) {
			return st, err
		}
	}
	for {
		kids, dir, err := c.conn.Children(c.path)
		if errors.Is(err, zk.ErrNoNode) {
			return state{absent: true}, nil
		}
		if err != nil {
			return state{}, fmt.Errorf("counter: children %s: %w", c.path, err)
		}
		name, found := "", false
		var top uint64
		for _, k := range kids {
			if e, ok := parseName(k); ok && (!found || e > top) {
				name, top, found = k, e, true
			}
		}
		if !found {
			return state{version: dir.Version}, nil
		}
		st, err := c.readNode(name)
		if errors.Is(err, zk.ErrNoNode) {
			continue // rolled over since the listing
		}
		return st, err
	}
}

func (c *Counter) readNode(name string) (state, error) {
	epoch, _ := parseName(name)
	data, st, err := c.conn.Get(path.Join(c.path, name))
	if err != nil {
		return state{}, fmt.Errorf("counter: get %s: %w", path.Join(c.path, name), err)
	}
	v, err := c.decode(name, data)
	if err != nil {
		return state{}, err
	}
	return state{node: name, epoch: epoch, version: st.Version, value: v}, nil
}

// confirm checks, in a transaction (a quorum write that changes nothing),
// that st is still the counter's state. It returns errStale when it is
// not.
func (c *Counter) confirm(st state) error {
	var ops []any
	switch {
	case st.node != "":
		ops = []any{&zk.CheckVersionRequest{Path: path.Join(c.path, st.node), Version: st.version}}
	case !st.absent:
		ops = []any{&zk.CheckVersionRequest{Path: c.path, Version: st.version}}
	default:
		// Absent: creating and deleting the node in one transaction
		// changes nothing, and succeeds only while it does not exist
		// (its parent missing too says the same).
		ops = []any{
			&zk.CreateRequest{Path: c.path, Acl: zkutil.ACLOr(c.opts.acl)},
			&zk.DeleteRequest{Path: c.path, Version: 0},
		}
	}
	res, err := c.conn.Multi(ops...)
	err = zkutil.MultiError(res, err)
	switch {
	case err == nil:
		return nil
	case st.absent && errors.Is(err, zk.ErrNoNode):
		return nil // no parent: no counter either
	case errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrNodeExists):
		return errStale
	default:
		return fmt.Errorf("counter: check %s: %w", c.path, err)
	}
}

// write makes next the counter's value if st is still its state; it
// returns the new state and whether the write was a rollover, or
// errStale. A write whose answer was lost returns an error wrapping
// ErrUnknownOutcome.
func (c *Counter) write(st state, next int64) (state, bool, error) {
	data := encode(next)
	acl := zkutil.ACLOr(c.opts.acl)
	switch {
	case st.absent:
		if err := zkutil.EnsurePath(c.conn, c.path, c.opts.acl); err != nil {
			return state{}, false, fmt.Errorf("counter: %w", err)
		}
		return state{}, false, errStale // read it again, then make the value node
	case st.node == "":
		// The first value node, in one transaction with a versioned write
		// of the counter node: of the writers that read the counter
		// without one, a single one makes it, and one that read long ago
		// makes none beside a later one.
		name := nodeName(0)
		res, err := c.conn.Multi(
			&zk.SetDataRequest{Path: c.path, Version: st.version},
			&zk.CreateRequest{Path: path.Join(c.path, name), Data: data, Acl: acl},
		)
		if err := c.writeErr("create", path.Join(c.path, name), zkutil.MultiError(res, err)); err != nil {
			return state{}, false, err
		}
		return state{node: name, version: 0, value: next}, false, nil
	case st.version >= maxVersion:
		// Rollover: the value moves to a new node, whose version starts
		// at 0, in one transaction with the versioned delete of the old.
		name := nodeName(st.epoch + 1)
		res, err := c.conn.Multi(
			&zk.DeleteRequest{Path: path.Join(c.path, st.node), Version: st.version},
			&zk.CreateRequest{Path: path.Join(c.path, name), Data: data, Acl: acl},
		)
		if err := c.writeErr("roll over", path.Join(c.path, st.node), zkutil.MultiError(res, err)); err != nil {
			return state{}, false, err
		}
		return state{node: name, epoch: st.epoch + 1, version: 0, value: next}, true, nil
	default:
		p := path.Join(c.path, st.node)
		stat, err := c.conn.Set(p, data, st.version)
		if err := c.writeErr("set", p, err); err != nil {
			return state{}, false, err
		}
		return state{node: st.node, epoch: st.epoch, version: stat.Version, value: next}, false, nil
	}
}

// writeErr classifies the error of a write of p: errStale when the
// counter changed, ErrUnknownOutcome when the answer was lost.
func (c *Counter) writeErr(op, p string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrNodeExists):
		return errStale
	case zkutil.IsUnavailable(err):
		return errfmt.Errorf("counter: %s %s: %w: %w", op, p, ErrUnknownOutcome, err)
	default:
		return fmt.Errorf("counter: %s %s: %w", op, p, err)
	}
}
