package lockdelay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/errfmt"
)

// Max is the longest delay accepted: Chubby's and Consul's bound too. A
// longer one would leave a name unusable for longer than any session
// lasts without its client.
const Max = time.Minute

// Prefix starts every marker's name: <dir>/delay-<holder>.
const Prefix = "delay-"

// Sentinel errors, wrapped with the operation and node; use errors.Is.
var (
	// ErrInvalid: a delay below 0 or above Max, or a holder name that
	// is not one path element.
	ErrInvalid = errors.New("lockdelay: invalid argument")
	// ErrHolderGone: Mark found the holder's node gone; no marker was
	// made.
	ErrHolderGone = errors.New("lockdelay: holder's node is gone")
)

// Validate returns ErrInvalid, naming the bound, for a delay below 0 or
// above Max. Zero means no delay.
func Validate(d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("%w: delay %v is negative", ErrInvalid, d)
	case d > Max:
		return fmt.Errorf("%w: delay %v is above the maximum of %v", ErrInvalid, d, Max)
	}
	return nil
}

// MarkerName returns the name of holder's marker.
func MarkerName(holder string) string { return Prefix + holder }

// HolderOf returns the holder's node name of a marker's name; false when
// name is not a marker's.
func HolderOf(name string) (string, bool) {
	h, ok := strings.CutPrefix(name, Prefix)
	return h, ok && h != ""
}

func checkHolder(holder string) error {
	if holder == "" || strings.Contains(holder, "/") || holder == "." || holder == ".." {
		return fmt.Errorf("%w: holder %q: want a node name", ErrInvalid, holder)
	}
	return nil
}

// encodeDelay and decodeDelay are a marker's data: the delay in
// milliseconds, as decimal text (readable with zkCli).
func encodeDelay(d time.Duration) []byte {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return []byte(strconv.FormatInt(int64(ms), 10))
}

// decodeDelay reads a marker's delay; data that does not parse, or a
// delay over Max, counts as Max: a marker errs on the safe side.
func decodeDelay(data []byte) time.Duration {
	ms, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil || ms < 0 || ms > int64(Max/time.Millisecond) {
		return Max
	}
	return time.Duration(ms) * time.Millisecond
}

// Mark records that the node dir/holder, which holds the name, is held
// with delay d: it creates the persistent marker dir/delay-<holder>, in
// one multi with a check that the holder's node exists, so a holder
// already gone leaves no marker (ErrHolderGone then). Call it once the
// holder's node holds and before telling the holder: from then until
// Release, the holder's loss keeps the name unavailable for d. A marker
// that exists already (a retry after a lost answer) is no error. Zero d
// does nothing.
//
// When Mark fails with the connection, the multi may have been applied:
// give up the holding with Release, which deletes both nodes, rather
// than with a plain delete of the holder's node.
func Mark(conn *zk.Conn, dir, holder string, d time.Duration, acl []zk.ACL) error {
	if err := Validate(d); err != nil {
		return err
	}
	if err := checkHolder(holder); err != nil {
		return err
	}
	if d == 0 {
		return nil
	}
	if len(acl) == 0 {
		acl = zk.WorldACL(zk.PermAll)
	}
	hp, mp := dir+"/"+holder, dir+"/"+MarkerName(holder)
	res, err := conn.Multi(
		&zk.CheckVersionRequest{Path: hp, Version: -1},
		&zk.CreateRequest{Path: mp, Data: encodeDelay(d), Acl: acl},
	)
	err = multiErr(res, err)
	switch {
	case err == nil, errors.Is(err, zk.ErrNodeExists):
		return nil
	case errors.Is(err, zk.ErrNoNode):
		return errfmt.Errorf("lockdelay: mark %s: %w", hp, ErrHolderGone)
	}
	return errfmt.Errorf("lockdelay: mark %s: %w", hp, err)
}

// multiErr returns a failed multi's error: the operation that failed it
// (the others report "runtime inconsistency", which the client does not
// name), else the call's.
func multiErr(res []zk.MultiResponse, err error) error {
	var other error
	for _, r := range res {
		switch {
		case r.Error == nil:
		case errors.Is(r.Error, zk.ErrNoNode), errors.Is(r.Error, zk.ErrNodeExists),
			errors.Is(r.Error, zk.ErrBadVersion), errors.Is(r.Error, zk.ErrNotEmpty), errors.Is(r.Error, zk.ErrNoAuth):
			return r.Error
		case other == nil:
			other = r.Error
		}
	}
	if err == nil {
		return other
	}
	return err
}

// Release deletes the holder's node dir/holder and its marker in one
// multi: an explicit release (Unlock, Resign) frees the name at once.
// Either node may be gone already (no marker: a holding without delay);
// Release returns nil once both are. Errors of ZooKeeper are wrapped.
func Release(conn *zk.Conn, dir, holder string) error {
	if err := checkHolder(holder); err != nil {
		return err
	}
	hp, mp := dir+"/"+holder, dir+"/"+MarkerName(holder)
	res, err := conn.Multi(&zk.DeleteRequest{Path: hp, Version: -1}, &zk.DeleteRequest{Path: mp, Version: -1})
	err = multiErr(res, err)
	if err == nil {
		return nil
	}
	if !errors.Is(err, zk.ErrNoNode) {
		return errfmt.Errorf("lockdelay: release %s: %w", hp, err)
	}
	// One of them is gone: delete the other alone, the holder first (a
	// marker whose holder lives blocks nobody).
	for _, p := range []string{hp, mp} {
		if err := conn.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			return errfmt.Errorf("lockdelay: release %s: %w", p, err)
		}
	}
	return nil
}

// Clear deletes holder's marker alone, if any: for a release by key
// (UnlockKey, ResignKey), which does not know whether the holder has a
// delay. Call it just before deleting the holder's node: a marker whose
// holder's node exists holds nothing, so the name is free as soon as the
// node goes.
func Clear(conn *zk.Conn, dir, holder string) error {
	if err := checkHolder(holder); err != nil {
		return err
	}
	mp := dir + "/" + MarkerName(holder)
	if err := conn.Delete(mp, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return errfmt.Errorf("lockdelay: clear %s: %w", mp, err)
	}
	return nil
}

// tracker runs the delays of the markers it meets: it notes a holder's
// loss in the marker, remembers on the local monotonic clock when it
// first saw the loss noted, and deletes the marker once the delay has
// passed since then.
type tracker struct {
	conn *zk.Conn
	seen map[string]time.Time // marker path -> first seen noted
}

func newTracker(conn *zk.Conn) *tracker {
	return &tracker{conn: conn, seen: map[string]time.Time{}}
}

// step handles the marker p, whose holder's node is gone. The first
// observer notes the loss: a write of the marker at version 0 (its data
// unchanged), so the marker's mtime is ZooKeeper's time of the first
// observation and its version tells every later observer that the delay
// runs. step returns how long the marker still holds, 0 once it is gone;
// deleted says that step deleted it.
func (t *tracker) step(p string) (left time.Duration, deleted bool, err error) {
	data, st, err := t.conn.Get(p)
	if errors.Is(err, zk.ErrNoNode) {
		delete(t.seen, p)
		return 0, false, nil
	}
	if err != nil {
		return 0, false, errfmt.Errorf("lockdelay: get %s: %w", p, err)
	}
	version := st.Version
	if version == 0 {
		nst, err := t.conn.Set(p, data, 0)
		switch {
		case err == nil:
			version = nst.Version
		case errors.Is(err, zk.ErrBadVersion):
			version = 1 // another observer noted it first: 0 -> 1, once
		case errors.Is(err, zk.ErrNoNode):
			delete(t.seen, p)
			return 0, false, nil
		default:
			return 0, false, errfmt.Errorf("lockdelay: note %s: %w", p, err)
		}
	}
	first, ok := t.seen[p]
	if !ok {
		// After the note: later than the first observation, so the
		// delay never ends early.
		first = time.Now()
		t.seen[p] = first
	}
	if left := decodeDelay(data) - time.Since(first); left > 0 {
		return left, false, nil
	}
	// Versioned once noted: the marker deleted is the one whose delay
	// ran. Several observers may try; one deletes, the others find it
	// gone.
	err = t.conn.Delete(p, version)
	switch {
	case err == nil, errors.Is(err, zk.ErrNoNode):
		delete(t.seen, p)
		return 0, err == nil, nil
	case errors.Is(err, zk.ErrBadVersion):
		return time.Millisecond, false, nil // written meanwhile: look again
	}
	return 0, false, errfmt.Errorf("lockdelay: delete %s: %w", p, err)
}

// pending returns the markers among children whose holder is not among
// children and that blocks accepts (nil accepts all).
func pending(children []string, blocks func(holder string) bool) []string {
	present := make(map[string]bool, len(children))
	for _, c := range children {
		present[c] = true
	}
	var out []string
	for _, c := range children {
		h, ok := HolderOf(c)
		if ok && !present[h] && (blocks == nil || blocks(h)) {
			out = append(out, c)
		}
	}
	return out
}

// Wait blocks until no marker under dir holds the name for the caller: a
// marker whose holder's node is gone holds it until its delay has passed
// since the loss was first observed; a marker whose holder's node exists
// holds nothing (the holder does, as the recipe orders). blocks says
// which holders' markers concern the caller (a reader of a read/write
// lock is not held off by a reader's marker); nil means all. A contender
// calls Wait once it holds in the recipe's order, before it Marks and
// tells its holder; it need not look again after Wait returns, since no
// marker can appear without a live holder before it.
//
// Wait notes the loss and deletes the marker when the delay is over (as
// do other contenders and a Sweeper, whichever comes first), watching the
// marker meanwhile, so a release by key wakes it at once. It returns
// whether it waited, and ctx's error when ctx ends first; errors of
// ZooKeeper are wrapped (zk.ErrNoNode when dir is missing).
func Wait(ctx context.Context, conn *zk.Conn, dir string, blocks func(holder string) bool) (waited bool, err error) {
	t := newTracker(conn)
	for {
		if err := ctx.Err(); err != nil {
			return waited, err
		}
		children, _, err := conn.Children(dir)
		if err != nil {
			return waited, errfmt.Errorf("lockdelay: children %s: %w", dir, err)
		}
		var next time.Duration
		var watch <-chan zk.Event
		for _, m := range pending(children, blocks) {
			p := dir + "/" + m
			left, _, err := t.step(p)
			if err != nil {
				return waited, err
			}
			if left == 0 {
				continue
			}
			// Woken by the first blocking marker's deletion (a release
			// by key, its delay ended elsewhere), or by the timer.
			if watch == nil {
				ok, _, w, err := conn.ExistsW(p)
				if err != nil {
					return waited, errfmt.Errorf("lockdelay: exists %s: %w", p, err)
				}
				if !ok {
					continue // gone since step read it
				}
				watch = w
			}
			if next == 0 || left < next {
				next = left
			}
		}
		if next == 0 {
			return waited, nil
		}
		waited = true
		tm := time.NewTimer(next)
		select {
		case <-tm.C:
		case <-watch: // deleted (released by key, or its delay ended elsewhere)
		case <-ctx.Done():
		}
		tm.Stop()
	}
}

// Sweeper deletes the markers whose delay has passed under a directory of
// names (a broker's locks/ or elections/: markers are at
// <dir>/<name>/delay-<holder>), so that no marker outlives its delay by
// much when nobody contends for the name. Each Pass notes the losses it
// finds and deletes the markers whose delay has passed since an earlier
// pass first saw the loss noted: a marker goes at most one pass interval
// after its delay. A Sweeper is used by one goroutine at a time; run one
// per directory, from one process (a leader).
type Sweeper struct {
	conn *zk.Conn
	dir  string
	sub  string // "" or "/<sub>": where a name's holders are
	t    *tracker
}

// NewSweeper returns a Sweeper of the names under dir.
func NewSweeper(conn *zk.Conn, dir string) *Sweeper {
	return &Sweeper{conn: conn, dir: dir, t: newTracker(conn)}
}

// NewSubSweeper returns a Sweeper of the names under dir whose holders
// are in a child sub of each name: markers at
// <dir>/<name>/<sub>/delay-<holder> (a broker's semaphores/, whose leases
// are in <name>/leases). sub is one path element.
func NewSubSweeper(conn *zk.Conn, dir, sub string) *Sweeper {
	return &Sweeper{conn: conn, dir: dir, sub: "/" + sub, t: newTracker(conn)}
}

// Pass looks at every name under dir once (a missing dir has none) and
// returns how many markers it deleted. A name's node without children is
// not listed.
func (s *Sweeper) Pass(ctx context.Context) (int, error) {
	names, _, err := s.conn.Children(s.dir)
	if errors.Is(err, zk.ErrNoNode) {
		clear(s.t.seen)
		return 0, nil
	}
	if err != nil {
		return 0, errfmt.Errorf("lockdelay: children %s: %w", s.dir, err)
	}
	live := make(map[string]time.Time, len(s.t.seen))
	deleted := 0
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		dir := s.dir + "/" + n + s.sub
		children, _, err := s.conn.Children(dir)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			return deleted, errfmt.Errorf("lockdelay: children %s: %w", dir, err)
		}
		for _, m := range pending(children, nil) {
			p := dir + "/" + m
			left, gone, err := s.t.step(p)
			if err != nil {
				return deleted, err
			}
			if gone {
				deleted++
			}
			if left == 0 {
				continue
			}
			live[p] = s.t.seen[p]
		}
	}
	s.t.seen = live // forget markers gone meanwhile
	return deleted, nil
}

// Blocked reports whether a marker among children, the names under a
// recipe's directory, may hold the name for the caller (see Wait for
// blocks): a marker whose holder is not among children. It does no I/O:
// a recipe asks it of the listing it made anyway and calls Wait only when
// it reports true.
func Blocked(children []string, blocks func(holder string) bool) bool {
	return len(pending(children, blocks)) > 0
}
