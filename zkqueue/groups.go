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

// groupWaits is what a Queue knows of blocked groups: a blocked group's
// watch, until it fires.
type groupWaits struct {
	blocked map[string]blockedGroup  // guarded by Queue.mu
	listing map[string]*groupListing // listings under way, by group; guarded by Queue.mu
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

// listGroup lists group g with a watch, or waits for the listing of g
// under way and shares it: the candidates of one group in a round cost
// one listing. A listing a little older than the caller's read is as good
// as its own: a group's head only moves on (entries go with their
// messages, new ones come last), and the claim's transaction checks
// inflight anyway. The wait is bounded by the session, like any request.
func (s *Queue) listGroup(g string) ([]string, <-chan zk.Event, error) {
	s.mu.Lock()
	if l, ok := s.groups.listing[g]; ok {
		s.mu.Unlock()
		<-l.done
		return l.children, l.watch, l.err
	}
	l := &groupListing{done: make(chan struct{})}
	if s.groups.listing == nil {
		s.groups.listing = map[string]*groupListing{}
	}
	s.groups.listing[g] = l
	watch := len(s.groups.blocked) < s.maxBlockedLocked()
	s.mu.Unlock()
	l.children, l.watch, l.err = s.childrenOfGroup(g, watch)
	s.mu.Lock()
	delete(s.groups.listing, g)
	s.mu.Unlock()
	close(l.done)
	return l.children, l.watch, l.err
}

// childrenOfGroup lists group g, with a watch when watch is set.
func (s *Queue) childrenOfGroup(g string, watch bool) (children []string, w <-chan zk.Event, err error) {
	if watch {
		children, _, w, err = s.zk.ChildrenW(s.groupPath(g))
	} else {
		children, _, err = s.zk.Children(s.groupPath(g))
	}
	s.mu.Lock()
	listed := s.groups.listed
	s.mu.Unlock()
	if listed != nil && err == nil {
		listed(g, w)
	}
	return children, w, err
}

// maxBlockedLocked is the bound of the blocked groups' cache; mu is held.
func (s *Queue) maxBlockedLocked() int {
	if s.groups.maxBlocked > 0 {
		return s.groups.maxBlocked
	}
	return maxBlockedGroups
}

// checkGroup checks a draft's group against the queue.
func (s *Queue) checkGroup(g string) error {
	if g == "" {
		return nil
	}
	if s.opt.groupsDir == "" {
		return fmt.Errorf("%w: the queue has no message groups", ErrBadGroup)
	}
	return CheckGroup(g)
}

// groupBytes is what a draft's group adds to its publish transaction.
func (s *Queue) groupBytes(g string) int {
	if g == "" {
		return 0
	}
	return len(s.opt.groupsDir) + len(g) + len(entryPrefix) + tokenLen + 16 + opOverhead + 2*tokenLen
}

func (s *Queue) groupPath(g string) string { return s.opt.groupsDir + "/" + g }

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

// appendGrouped is appendMessages with the entries of grouped messages
// (attrs[i] for datas[i]) created in the same transaction, after extra:
// an *extraOpError still indexes extra. A group missing (deleted while
// idle) is created and the transaction tried again.
func (s *Queue) appendGrouped(ctx context.Context, levels []int, datas [][]byte, attrs []Attributes, extra ...any) ([]string, error) {
	_, paths, err := s.appendGroupedWith(ctx, nil, levels, datas, attrs, extra...)
	return paths, err
}

// appendGroupedWith is appendGrouped with the ops pre ahead, as
// appendWith: res are pre's responses.
func (s *Queue) appendGroupedWith(ctx context.Context, pre []any, levels []int, datas [][]byte, attrs []Attributes, extra ...any) (res []zk.MultiResponse, paths []string, err error) {
	var gops []any
	var groups []string
	for _, a := range attrs {
		if a.Group == "" || s.opt.groupsDir == "" {
			continue
		}
		gops = append(gops, &zk.CreateRequest{
			Path:  s.groupPath(a.Group) + "/" + entryPrefix + a.groupEntry + "-",
			Acl:   s.opt.acl,
			Flags: zk.FlagSequence,
		})
		groups = append(groups, a.Group)
	}
	if len(gops) == 0 {
		return s.appendWith(ctx, pre, levels, datas, extra...)
	}
	all := append(append([]any{}, extra...), gops...)
	for attempt := 0; ; attempt++ {
		res, paths, err := s.appendWith(ctx, pre, levels, datas, all...)
		var oe *extraOpError
		if !errors.As(err, &oe) || oe.Index < len(extra) {
			return res, paths, err
		}
		if !errors.Is(oe.Err, zk.ErrNoNode) || attempt >= 4 {
			return nil, nil, fmt.Errorf("group entry: %w", oe.Err)
		}
		if err := s.ensureGroup(groups[oe.Index-len(extra)]); err != nil {
			return nil, nil, err
		}
	}
}

// ensureGroup creates group g (and the groups parent) if missing.
func (s *Queue) ensureGroup(g string) error {
	_, err := s.zk.Create(s.groupPath(g), nil, 0, s.opt.acl)
	if errors.Is(err, zk.ErrNoNode) {
		if _, err = s.zk.Create(s.opt.groupsDir, nil, 0, s.opt.acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", s.opt.groupsDir, err)
		}
		_, err = s.zk.Create(s.groupPath(g), nil, 0, s.opt.acl)
	}
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("create group %s: %w", g, err)
	}
	return nil
}

// groupGate decides whether grouped message m may be claimed now: it
// returns its group's head entry name when m is the head and nothing of
// the group is in flight, errGroupBusy when not. The entry is "" for a
// message to be delivered without regard to a group (the queue has no
// groups, or m's entry is missing: see groups.go).
func (s *Queue) groupGate(m Message) (entry string, err error) {
	if s.opt.groupsDir == "" {
		return "", nil
	}
	g := m.Group
	token := groupToken(m.groupEntry)
	s.mu.Lock()
	if b, ok := s.groups.blocked[g]; ok {
		switch {
		case zkutil.Fired(b.watch):
			delete(s.groups.blocked, g)
		case b.inflight || b.head != token:
			s.skipLocked(b.watch)
			s.mu.Unlock()
			return "", errGroupBusy
		}
		// m is the head another candidate was blocked behind: the
		// listing below tells.
	}
	s.mu.Unlock()
	children, w, err := s.listGroup(g)
	head, inflight, mine := groupHead(children, token)
	if err == nil && !mine || errors.Is(err, zk.ErrNoNode) {
		// m's entry is missing from a listing that may predate it
		// (shared, or from a server behind the one m was read from):
		// list again after a sync, which catches this server up.
		if _, err = s.conn.Sync(s.groupPath(g)); err == nil || errors.Is(err, zk.ErrNoNode) {
			children, w, err = s.childrenOfGroup(g, w != nil)
			head, inflight, mine = groupHead(children, token)
		}
	}
	switch {
	case err == nil && !mine, errors.Is(err, zk.ErrNoNode):
		// No entry even so: not a message published in its group's
		// order (see groups.go); delivered as it is rather than never.
		return "", nil
	case err != nil:
		return "", fmt.Errorf("children %s: %w", s.groupPath(g), err)
	case !inflight && groupToken(head) == token:
		return head, nil
	}
	s.mu.Lock()
	if w == nil {
		// Listed without a watch: the cache is full (see
		// maxBlockedGroups).
		s.skipLocked(nil)
		s.mu.Unlock()
		return "", errGroupBusy
	}
	if s.groups.blocked == nil {
		s.groups.blocked = map[string]blockedGroup{}
	}
	s.groups.blocked[g] = blockedGroup{watch: w, head: groupToken(head), inflight: inflight}
	s.skipLocked(w)
	s.mu.Unlock()
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
func (s *Queue) skipLocked(w <-chan zk.Event) {
	s.groups.skipped = true
	if s.watches == nil {
		return // a listing comes next anyway
	}
	if w == nil || s.groups.watched >= maxGroupWatches {
		s.groups.unwatched = s.groups.unwatched || w == nil
		s.pollGroupsLocked()
		return
	}
	for _, x := range s.watches {
		if x == w {
			return
		}
	}
	s.watches = append(s.watches, w)
	s.groups.watched++
}

// pollGroupsLocked adds a wake after groupPoll to the snapshot's watches,
// once (see groupPollFiredLocked).
func (s *Queue) pollGroupsLocked() {
	if s.groups.poll != nil {
		return
	}
	ch := make(chan zk.Event)
	time.AfterFunc(groupPoll, func() { close(ch) })
	s.groups.poll = ch
	s.watches = append(s.watches, ch)
}

// groupPollFiredLocked is called when the snapshot's watch w fired. It
// reports whether that is a change to list the queue again for: any
// watch but the groupPoll wake, which is one only if a blocked group
// changed or was listed without a watch; else the wake is armed again.
func (s *Queue) groupPollFiredLocked(w <-chan zk.Event) bool {
	if w != s.groups.poll || s.groups.unwatched {
		return true
	}
	for _, b := range s.groups.blocked {
		if zkutil.Fired(b.watch) {
			return true
		}
	}
	ws := make([]<-chan zk.Event, 0, len(s.watches))
	for _, x := range s.watches {
		if x != w {
			ws = append(ws, x)
		}
	}
	s.watches, s.groups.poll = ws, nil // a new slice: waiters hold the old one
	s.pollGroupsLocked()
	return false
}

// groupWatchesLocked adds the watches of the groups known blocked to a
// new snapshot's: a candidate passed over while the listing was under way
// is left out of the snapshot (dispatch.go), and its group's change must
// still wake the consumers waiting. It forgets the groups whose watches
// fired.
func (s *Queue) groupWatchesLocked(ws []<-chan zk.Event) []<-chan zk.Event {
	s.groups.watched, s.groups.poll, s.groups.unwatched = 0, nil, false
	for g, b := range s.groups.blocked {
		if zkutil.Fired(b.watch) {
			delete(s.groups.blocked, g)
		}
	}
	if ws == nil {
		return nil
	}
	s.watches = ws
	for _, b := range s.groups.blocked {
		if s.groups.watched == maxGroupWatches {
			s.pollGroupsLocked()
			break
		}
		s.watches = append(s.watches, b.watch)
		s.groups.watched++
	}
	return s.watches
}

// groupClaimOps are the ops a grouped claim adds to its transaction: the
// inflight node for a lease, the entry's delete for an at-most-once take.
func (s *Queue) groupClaimOps(g, entry string, lease bool) []any {
	if lease {
		return []any{&zk.CreateRequest{Path: s.groupPath(g) + "/" + inflightName, Data: []byte(entry), Acl: s.opt.acl}}
	}
	return []any{&zk.DeleteRequest{Path: s.groupPath(g) + "/" + entry, Version: -1}}
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
// it again (appendGrouped).
func dropIdleGroup(del func(string, int32) error, dir string, m Message) {
	if dir == "" || m.Group == "" || !isEntryName(m.groupEntry) {
		return
	}
	_ = del(dir+"/"+m.Group, -1) // NotEmpty: not idle
}

// groupedLease reports whether lease token was named for a grouped
// message (newLeaseNameFor): the top bit of its nonce's first byte.
func groupedLease(token string) bool {
	i := strings.LastIndex(token, LeaseSep)
	return i >= 0 && i+1 < len(token) && token[i+1] >= '8'
}

// newLeaseNameFor names a lease of message m: a grouped message's nonce
// has its top bit set, a plain one's clear, so AckUnread, which does not
// read the lease, knows which need their group settled too.
func newLeaseNameFor(item string, m Message) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	if m.Group != "" && isEntryName(m.groupEntry) {
		b[0] |= 0x80
	} else {
		b[0] &^= 0x80
	}
	return item + LeaseSep + hex.EncodeToString(b[:])
}

// purgeGrouped deletes the grouped messages among paths (message nodes),
// each with its entry in one transaction, and returns the other paths and
// the number deleted. It reads the messages only when the queue has
// groups. A message claimed meanwhile is left to its claim.
func (s *Queue) purgeGrouped(ctx context.Context, paths []string) (rest []string, deleted int, err error) {
	if s.opt.groupsDir == "" || len(paths) == 0 {
		return paths, 0, nil
	}
	if ok, st, err := s.zk.Exists(s.opt.groupsDir); err == nil && (!ok || st.NumChildren == 0) {
		return paths, 0, nil // no groups: nothing to read
	}
	rs, err := s.readPaths(paths)
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
		children, _, err := s.zk.Children(s.groupPath(g))
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return nil, deleted, fmt.Errorf("children %s: %w", s.groupPath(g), err)
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
				ops = append(ops, &zk.DeleteRequest{Path: s.groupPath(g) + "/" + e, Version: -1})
			}
			_, err := s.multi(ctx, ops...)
			switch {
			case err == nil:
				deleted++
			case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
			default:
				return nil, deleted, fmt.Errorf("purge %s: %w", x.path, err)
			}
		}
		_ = s.zk.Delete(s.groupPath(g), -1) // idle now unless in flight or published meanwhile
	}
	return rest, deleted, nil
}

// redriveGroupOps gives a redriven grouped dead letter m a new entry, at
// the end of its group (its old entry went when it died), and sets m's
// token to it. None for a message without a group.
func (l *Leases) redriveGroupOps(m *Message) ([]any, error) {
	s := l.items
	if m.Group == "" || s.opt.groupsDir == "" {
		return nil, nil
	}
	token := groupToken(m.groupEntry)
	if token == "" {
		token = newGroupToken()
	}
	m.groupEntry = token
	if err := s.ensureGroup(m.Group); err != nil {
		return nil, err
	}
	return []any{&zk.CreateRequest{Path: s.groupPath(m.Group) + "/" + entryPrefix + token + "-", Acl: s.opt.acl, Flags: zk.FlagSequence}}, nil
}
