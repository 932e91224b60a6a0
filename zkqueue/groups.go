package zkqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Message groups (WithGroups).
//
// A message published with a Group (Attributes.Group) is delivered after
// every earlier message of its group has been acked (or dead-lettered,
// dropped or consumed at most once), and never while another message of
// its group is in flight; messages of different groups, and messages
// without a group, are delivered in parallel as before, by any process.
//
// A group has its own order, kept in ZooKeeper beside the queue:
//
//	<groups>/<g>                       the group (deleted when idle)
//	<groups>/<g>/e-<token>-0000000007  an entry: PERSISTENT_SEQUENTIAL
//	<groups>/<g>/inflight              a message of g is leased; data: its entry
//
// The publish transaction that creates a grouped message also creates its
// entry, so both exist or neither does, and the group's sequence counter
// orders the entries as the transactions committed: the group's publish
// order. Queue order agrees with it (a transaction commits into the tail
// segment or a later one, never an earlier). The entry cannot name the
// message (ZooKeeper picks both sequence numbers at the commit), so both
// carry a random token: the message's data holds it (tag 6), the entry's
// name holds it. Publishers of one group share no counter and no version
// check: sequential creates never conflict.
//
// The group's head is its entry of lowest sequence. A claim of a grouped
// message, once its data is read, lists the group (one getChildren with a
// watch) and goes on only if its token is the head's and no inflight node
// exists; the claim's transaction then creates inflight (NodeExists when
// another process won: the claim is passed over like a lost race).
// Ack, dead-letter and drop delete inflight and the entry with the lease;
// nack, lease expiry, release and unclaim delete inflight only, so the
// head stays the head and is redelivered first. Every change of a group's
// state is in the same transaction as the change of its message, so a
// group cannot be left blocked by a crash between two writes.
//
// A candidate that may not be claimed now (its group busy or another
// message ahead of it) is passed over for the rest of the snapshot
// (dispatch.go), which is walked to its end and then listed again: a
// blocked message costs its read once per snapshot, and its group's
// listing once until the group changes: the Queue remembers a blocked
// group until its watch fires (up to 10,000 groups, see maxBlockedGroups),
// so neither the group's other candidates nor later snapshots list it
// again. The watch wakes this
// process's waiting consumers when the group changes (an ack elsewhere),
// so a freed group's next message is claimed within a round trip or two,
// not at the next unrelated change of the queue. A take that does not
// wait returns ErrEmpty when every message left is blocked.
//
// At most once (Queue.Take, Dequeue): a grouped message is claimed only as
// its group's head with no lease in flight, and its delete and its entry's
// delete are one transaction: in group order, with nothing in flight to
// wait for.
//
// Purge reads the messages it deletes when the queue has groups, and
// deletes each grouped one with its entry. Redrive gives a dead letter a
// new entry, at the end of its group. A group whose last entry is deleted
// (ack, dead letter, purge) and that has nothing in flight is deleted
// right after, conditionally: a concurrent publish that finds it gone
// creates it again. A queue deletion removes the groups with the queue.
//
// A grouped message without an entry (none is, unless something besides
// this package wrote the nodes) is delivered without regard to its group
// rather than never; the claim syncs and lists the group once more
// before it decides so, since a listing may come from a server behind
// the one the message was read from.
//
// Every process consuming a queue must open it WithGroups (the broker
// always does); a grouped message taken by a process without it is
// delivered without regard to its group. Order holds across priority
// levels too: a group's order is its publish order, whatever the
// priorities.

// MaxGroup bounds a group key's length.
const MaxGroup = 128

// ErrBadGroup is returned for a group key outside its charset or length,
// or given to a queue without WithGroups.
var ErrBadGroup = errors.New("zkqueue: bad message group")

// CheckGroup accepts a group key of [A-Za-z0-9._-]{1,128}, not "." or "..":
// a node name as it is.
func CheckGroup(g string) error {
	if len(g) > MaxGroup {
		return fmt.Errorf("%w: %d bytes > %d", ErrBadGroup, len(g), MaxGroup)
	}
	if err := zkutil.CheckName(g); err != nil {
		return fmt.Errorf("%w: %v", ErrBadGroup, err)
	}
	return nil
}

// WithGroups enables message groups (Attributes.Group) with their state
// under dir (see groups.go). dir and the groups are created when first
// needed, even WithoutCreate (they lie inside the queue, which a deletion
// removes whole). Every process of the queue should use the same dir.
func WithGroups(dir string) Option {
	return func(o *options) { o.groupsDir = dir }
}

func (o *options) validateGroups() error {
	if o.groupsDir == "" {
		return nil
	}
	if o.groupsDir[0] != '/' || path.Clean(o.groupsDir) != o.groupsDir || o.groupsDir == "/" {
		return fmt.Errorf("zkqueue: bad groups path %q", o.groupsDir)
	}
	return nil
}

const (
	inflightName = "inflight"
	entryPrefix  = "e-"
	tokenLen     = 16 // hex digits
)

// errGroupBusy: a grouped candidate may not be claimed now (see above);
// the take passes it over.
var errGroupBusy = errors.New("zkqueue: message group busy")

// Bounds on what a Queue keeps of blocked groups.
//
// The blocked groups are remembered until their watches fire, never
// dropped before: a group listed again while its watch is armed would
// leave one more watch channel in the ZooKeeper client (go-zookeeper keeps
// one per call until the watch fires). So the cache is the set of blocked
// groups, up to maxBlockedGroups, and a pass lists only the groups whose
// state changed. A group found blocked beyond that bound is listed without
// a watch and its candidate passed over. A snapshot's waiters select over
// at most maxGroupWatches groups' watches (a select costs each wait their
// number). When some blocked groups are not among them, or were listed
// without a watch, the waiters also wake every groupPoll: the queue is
// listed again if one of the cached groups' watches fired or a group was
// listed without a watch (one listing per such group and pass), else they
// wait on. So a freed group is seen within groupPoll at worst.
const (
	maxBlockedGroups = 10000
	maxGroupWatches  = 1000
	groupPoll        = time.Second
)

// groups is a Queue's part for message groups (WithGroups): it makes the
// entries of grouped publishes, gates grouped claims, and remembers the
// blocked groups, whose watches join the dispatcher's snapshot. Its
// fields describe that snapshot's watches, so the dispatcher's lock
// (disp.mu) guards them. A Queue without groups has none, and a message
// without a group never reaches it.
type groups struct {
	*core
	disp *dispatcher

	// inUse: blocked groups or passed-over candidates are in the
	// snapshot; while it is false, the dispatcher does not call the part.
	inUse   bool
	blocked map[string]blockedGroup  // a blocked group's state, until its watch fires
	listing map[string]*groupListing // listings under way, by group
	// skipped: a candidate of the current snapshot was passed over, so
	// a take that does not wait does not wait for the snapshot's others.
	skipped bool
	// watched: the group watches among the snapshot's watches (at most
	// maxGroupWatches); poll: the groupPoll wake among them, if any;
	// unwatched: a group of the snapshot was listed without a watch.
	watched   int
	poll      <-chan zk.Event
	unwatched bool
	// maxBlocked is maxBlockedGroups (tests lower it); listed, when set,
	// sees every listing of a group and its watch (nil: listed without
	// a watch).
	maxBlocked int
	listed     func(g string, w <-chan zk.Event)
}

// blockedGroup is a group's state as its last listing found it, valid
// until watch fires: its head's token, and whether a message is in
// flight.
type blockedGroup struct {
	watch    <-chan zk.Event
	head     string
	inflight bool
}

// groupListing is one listing of a group, shared by the claims of a round
// that want it at once.
type groupListing struct {
	done     chan struct{}
	children []string
	watch    <-chan zk.Event
	err      error
}

// list lists group g with a watch, or waits for the listing of g
// under way and shares it: the candidates of one group in a round cost
// one listing. A listing a little older than the caller's read is as good
// as its own: a group's head only moves on (entries go with their
// messages, new ones come last), and the claim's transaction checks
// inflight anyway. The wait is bounded by the session, like any request.
func (gr *groups) list(g string) ([]string, <-chan zk.Event, error) {
	gr.disp.mu.Lock()
	if l, ok := gr.listing[g]; ok {
		gr.disp.mu.Unlock()
		<-l.done
		return l.children, l.watch, l.err
	}
	l := &groupListing{done: make(chan struct{})}
	if gr.listing == nil {
		gr.listing = map[string]*groupListing{}
	}
	gr.listing[g] = l
	watch := len(gr.blocked) < gr.maxBlockedLocked()
	gr.disp.mu.Unlock()
	l.children, l.watch, l.err = gr.children(g, watch)
	gr.disp.mu.Lock()
	delete(gr.listing, g)
	gr.disp.mu.Unlock()
	close(l.done)
	return l.children, l.watch, l.err
}

// children lists group g, with a watch when watch is set.
func (gr *groups) children(g string, watch bool) (children []string, w <-chan zk.Event, err error) {
	if watch {
		children, _, w, err = gr.zk.ChildrenW(gr.groupPath(g))
	} else {
		children, _, err = gr.zk.Children(gr.groupPath(g))
	}
	gr.disp.mu.Lock()
	listed := gr.listed
	gr.disp.mu.Unlock()
	if listed != nil && err == nil {
		listed(g, w)
	}
	return children, w, err
}

// maxBlockedLocked is the bound of the blocked groups' cache; disp.mu is held.
func (gr *groups) maxBlockedLocked() int {
	if gr.maxBlocked > 0 {
		return gr.maxBlocked
	}
	return maxBlockedGroups
}

// checkGroup checks a draft's group against the queue.
func (q *Queue) checkGroup(g string) error {
	if g == "" {
		return nil
	}
	if q.opt.groupsDir == "" {
		return fmt.Errorf("%w: the queue has no message groups", ErrBadGroup)
	}
	return CheckGroup(g)
}

// bytes is what a draft's group adds to its publish transaction.
func (gr *groups) bytes(g string) int {
	if g == "" {
		return 0
	}
	return len(gr.opt.groupsDir) + len(g) + len(entryPrefix) + tokenLen + 16 + opOverhead + 2*tokenLen
}

func (gr *groups) groupPath(g string) string { return gr.opt.groupsDir + "/" + g }

func newGroupToken() string {
	var b [tokenLen / 2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// withGroupTokens gives each grouped draft a fresh entry token; drafts
// without a group are returned as they are (no copy).
func withGroupTokens(drafts []Draft) []Draft {
	var out []Draft
	for i, d := range drafts {
		if d.Group == "" {
			continue
		}
		if out == nil {
			out = append([]Draft(nil), drafts...)
		}
		out[i].groupEntry = newGroupToken()
	}
	if out == nil {
		return drafts
	}
	return out
}

// groupToken returns the token of a message's groupEntry: the token itself
// or the entry's name.
func groupToken(entry string) string {
	if len(entry) == tokenLen {
		return entry
	}
	if strings.HasPrefix(entry, entryPrefix) && len(entry) > len(entryPrefix)+tokenLen {
		return entry[len(entryPrefix) : len(entryPrefix)+tokenLen]
	}
	return ""
}

// isEntryName reports whether entry is an entry's node name (set at a
// grouped claim), not a bare token.
func isEntryName(entry string) bool {
	return strings.HasPrefix(entry, entryPrefix) && len(entry) > len(entryPrefix)+tokenLen+1
}

// entrySeq parses an entry name's sequence number.
func entrySeq(name string) (int64, bool) {
	if !isEntryName(name) || name[len(entryPrefix)+tokenLen] != '-' {
		return 0, false
	}
	seq, err := strconv.ParseInt(name[len(entryPrefix)+tokenLen+1:], 10, 32)
	return seq, err == nil
}

// commit is producer.appendWith with the entries of r's grouped
// messages (r.attrs[i] for r.datas[i]) created in the same transaction,
// after r.extra: an *extraOpError still indexes r.extra. A group missing
// (deleted while idle) is created and the transaction tried again.
func (gr *groups) commit(ctx context.Context, p *producer, r appendReq) (res []zk.MultiResponse, paths []string, err error) {
	var gops []any
	var groups []string
	for _, a := range r.attrs {
		if a.Group == "" {
			continue
		}
		gops = append(gops, &zk.CreateRequest{
			Path:  gr.groupPath(a.Group) + "/" + entryPrefix + a.groupEntry + "-",
			Acl:   gr.opt.acl,
			Flags: zk.FlagSequence,
		})
		groups = append(groups, a.Group)
	}
	extra := r.extra
	r.extra = append(append([]any{}, extra...), gops...)
	for attempt := 0; ; attempt++ {
		res, paths, err := p.appendWith(ctx, r)
		var oe *extraOpError
		if !errors.As(err, &oe) || oe.Index < len(extra) {
			return res, paths, err
		}
		if !errors.Is(oe.Err, zk.ErrNoNode) || attempt >= 4 {
			return nil, nil, fmt.Errorf("group entry: %w", oe.Err)
		}
		if err := gr.ensure(groups[oe.Index-len(extra)]); err != nil {
			return nil, nil, err
		}
	}
}

// ensure creates group g (and the groups parent) if missing.
func (gr *groups) ensure(g string) error {
	_, err := gr.zk.Create(gr.groupPath(g), nil, 0, gr.opt.acl)
	if errors.Is(err, zk.ErrNoNode) {
		if _, err = gr.zk.Create(gr.opt.groupsDir, nil, 0, gr.opt.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", gr.opt.groupsDir, err)
		}
		_, err = gr.zk.Create(gr.groupPath(g), nil, 0, gr.opt.acl)
	}
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("create group %s: %w", g, err)
	}
	return nil
}

// gate decides whether grouped message m may be claimed now: it
// returns its group's head entry name when m is the head and nothing of
// the group is in flight, errGroupBusy when not. The entry is "" for a
// message to be delivered without regard to a group (the queue has no
// groups, or m's entry is missing: see groups.go).
func (gr *groups) gate(m Message) (entry string, err error) {
	if gr.opt.groupsDir == "" {
		return "", nil
	}
	g := m.Group
	token := groupToken(m.groupEntry)
	gr.disp.mu.Lock()
	if b, ok := gr.blocked[g]; ok {
		switch {
		case zkutil.Fired(b.watch):
			delete(gr.blocked, g)
		case b.inflight || b.head != token:
			gr.skipLocked(b.watch)
			gr.disp.mu.Unlock()
			return "", errGroupBusy
		}
		// m is the head another candidate was blocked behind: the
		// listing below tells.
	}
	gr.disp.mu.Unlock()
	children, w, err := gr.list(g)
	head, inflight, mine := groupHead(children, token)
	if err == nil && !mine || errors.Is(err, zk.ErrNoNode) {
		// m's entry is missing from a listing that may predate it
		// (shared, or from a server behind the one m was read from):
		// list again after a sync, which catches this server up.
		if _, err = gr.zk.Sync(gr.groupPath(g)); err == nil || errors.Is(err, zk.ErrNoNode) {
			children, w, err = gr.children(g, w != nil)
			head, inflight, mine = groupHead(children, token)
		}
	}
	switch {
	case err == nil && !mine, errors.Is(err, zk.ErrNoNode):
		// No entry even so: not a message published in its group's
		// order (see groups.go); delivered as it is rather than never.
		return "", nil
	case err != nil:
		return "", fmt.Errorf("children %s: %w", gr.groupPath(g), err)
	case !inflight && groupToken(head) == token:
		return head, nil
	}
	gr.disp.mu.Lock()
	if w == nil {
		// Listed without a watch: the cache is full (see
		// maxBlockedGroups).
		gr.skipLocked(nil)
		gr.disp.mu.Unlock()
		return "", errGroupBusy
	}
	if gr.blocked == nil {
		gr.blocked = map[string]blockedGroup{}
	}
	gr.blocked[g] = blockedGroup{watch: w, head: groupToken(head), inflight: inflight}
	gr.skipLocked(w)
	gr.disp.mu.Unlock()
	return "", errGroupBusy
}

// groupHead returns, from a group's children, its head entry, whether a
// message of it is in flight, and whether the entry of token is there.
func groupHead(children []string, token string) (head string, inflight, mine bool) {
	var headSeq int64
	for _, c := range children {
		if c == inflightName {
			inflight = true
			continue
		}
		seq, ok := entrySeq(c)
		if !ok {
			continue
		}
		if head == "" || seq < headSeq {
			head, headSeq = c, seq
		}
		if groupToken(c) == token {
			mine = true
		}
	}
	return head, inflight, mine
}

// skipLocked notes a candidate passed over, and adds its group's watch w
// to the snapshot's, so waiting consumers wake when the group changes; a
// group without a watch (nil), or one beyond maxGroupWatches, is looked at
// again after groupPoll instead.
func (gr *groups) skipLocked(w <-chan zk.Event) {
	gr.skipped, gr.inUse = true, true
	if gr.disp.watches == nil {
		return // a listing comes next anyway
	}
	if w == nil || gr.watched >= maxGroupWatches {
		gr.unwatched = gr.unwatched || w == nil
		gr.pollLocked()
		return
	}
	for _, x := range gr.disp.watches {
		if x == w {
			return
		}
	}
	gr.disp.watches = append(gr.disp.watches, w)
	gr.watched++
}

// pollLocked adds a wake after groupPoll to the snapshot's watches,
// once (see groupPollFiredLocked).
func (gr *groups) pollLocked() {
	if gr.poll != nil {
		return
	}
	ch := make(chan zk.Event)
	time.AfterFunc(groupPoll, func() { close(ch) })
	gr.poll = ch
	gr.disp.watches = append(gr.disp.watches, ch)
}

// pollFiredLocked is called when the snapshot's watch w fired. It
// reports whether that is a change to list the queue again for: any
// watch but the groupPoll wake, which is one only if a blocked group
// changed or was listed without a watch; else the wake is armed again.
func (gr *groups) pollFiredLocked(w <-chan zk.Event) bool {
	if w != gr.poll || gr.unwatched {
		return true
	}
	for _, b := range gr.blocked {
		if zkutil.Fired(b.watch) {
			return true
		}
	}
	ws := make([]<-chan zk.Event, 0, len(gr.disp.watches))
	for _, x := range gr.disp.watches {
		if x != w {
			ws = append(ws, x)
		}
	}
	gr.disp.watches, gr.poll = ws, nil // a new slice: waiters hold the old one
	gr.pollLocked()
	return false
}

// watchesLocked adds the watches of the groups known blocked to a
// new snapshot's: a candidate passed over while the listing was under way
// is left out of the snapshot (dispatch.go), and its group's change must
// still wake the consumers waiting. It forgets the groups whose watches
// fired.
func (gr *groups) watchesLocked(ws []<-chan zk.Event) []<-chan zk.Event {
	gr.watched, gr.poll, gr.unwatched = 0, nil, false
	for g, b := range gr.blocked {
		if zkutil.Fired(b.watch) {
			delete(gr.blocked, g)
		}
	}
	gr.inUse = len(gr.blocked) > 0
	if ws == nil {
		return nil
	}
	gr.disp.watches = ws
	for _, b := range gr.blocked {
		if gr.watched == maxGroupWatches {
			gr.pollLocked()
			break
		}
		gr.disp.watches = append(gr.disp.watches, b.watch)
		gr.watched++
	}
	return gr.disp.watches
}

// claimOps are the ops a grouped claim adds to its transaction: the
// inflight node for a lease, the entry's delete for an at-most-once take.
func (gr *groups) claimOps(g, entry string, lease bool) []any {
	if lease {
		return []any{&zk.CreateRequest{Path: gr.groupPath(g) + "/" + inflightName, Data: []byte(entry), Acl: gr.opt.acl}}
	}
	return []any{&zk.DeleteRequest{Path: gr.groupPath(g) + "/" + entry, Version: -1}}
}

// groupReleaseOps are the ops that settle a grouped message's lease:
// inflight's delete, and with done (ack, dead letter, drop) the entry's.
// None for a message claimed without its group.
func groupReleaseOps(dir string, m Message, done bool) []any {
	if dir == "" || m.Group == "" || !isEntryName(m.groupEntry) {
		return nil
	}
	g := dir + "/" + m.Group
	ops := []any{&zk.DeleteRequest{Path: g + "/" + inflightName, Version: -1}}
	if done {
		ops = append(ops, &zk.DeleteRequest{Path: g + "/" + m.groupEntry, Version: -1})
	}
	return ops
}

// dropIdleGroup deletes m's group if it is idle (no children): best
// effort, after its last entry went. A publish that finds it gone creates
// it again (groups.commit).
func dropIdleGroup(del func(string, int32) error, dir string, m Message) {
	if dir == "" || m.Group == "" || !isEntryName(m.groupEntry) {
		return
	}
	_ = del(dir+"/"+m.Group, -1) // NotEmpty: not idle
}

// purge deletes the grouped messages among paths (message nodes),
// each with its entry in one transaction, and returns the other paths and
// the number deleted. It reads the messages only when the queue has
// groups. A message claimed meanwhile is left to its claim.
func (gr *groups) purge(ctx context.Context, paths []string) (rest []string, deleted int, err error) {
	if gr.opt.groupsDir == "" || len(paths) == 0 {
		return paths, 0, nil
	}
	if ok, st, err := gr.zk.Exists(gr.opt.groupsDir); err == nil && (!ok || st.NumChildren == 0) {
		return paths, 0, nil // no groups: nothing to read
	}
	rs, err := gr.disp.reads.readPaths(paths)
	if err != nil {
		return nil, 0, err
	}
	type grouped struct {
		path    string
		version int32
		m       Message
	}
	byGroup := map[string][]grouped{}
	for i, r := range rs {
		if r.err != nil {
			continue // gone meanwhile
		}
		m, err := DecodeData(r.data)
		if err != nil || m.Group == "" {
			rest = append(rest, paths[i])
			continue
		}
		byGroup[m.Group] = append(byGroup[m.Group], grouped{paths[i], r.version, m})
	}
	for g, ms := range byGroup {
		if err := ctx.Err(); err != nil {
			return nil, deleted, err
		}
		children, _, err := gr.zk.Children(gr.groupPath(g))
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return nil, deleted, fmt.Errorf("children %s: %w", gr.groupPath(g), err)
		}
		entries := map[string]string{} // token -> entry
		for _, c := range children {
			if isEntryName(c) {
				entries[groupToken(c)] = c
			}
		}
		for _, x := range ms {
			ops := []any{&zk.DeleteRequest{Path: x.path, Version: x.version}}
			if e, ok := entries[groupToken(x.m.groupEntry)]; ok {
				ops = append(ops, &zk.DeleteRequest{Path: gr.groupPath(g) + "/" + e, Version: -1})
			}
			_, err := gr.multi(ctx, ops...)
			switch {
			case err == nil:
				deleted++
			case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
			default:
				return nil, deleted, fmt.Errorf("purge %s: %w", x.path, err)
			}
		}
		_ = gr.zk.Delete(gr.groupPath(g), -1) // idle now unless in flight or published meanwhile
	}
	return rest, deleted, nil
}

// redriveGroupOps gives a redriven grouped dead letter m a new entry, at
// the end of its group (its old entry went when it died), and sets m's
// token to it. None for a message without a group.
func (l *Leases) redriveGroupOps(m *Message) ([]any, error) {
	gr := l.items.groups
	if m.Group == "" || gr == nil {
		return nil, nil
	}
	token := groupToken(m.groupEntry)
	if token == "" {
		token = newGroupToken()
	}
	m.groupEntry = token
	if err := gr.ensure(m.Group); err != nil {
		return nil, err
	}
	return []any{&zk.CreateRequest{Path: gr.groupPath(m.Group) + "/" + entryPrefix + token + "-", Acl: gr.opt.acl, Flags: zk.FlagSequence}}, nil
}
