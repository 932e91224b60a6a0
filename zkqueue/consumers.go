package zkqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Consumer registrations and the share split.
//
// The processes consuming a queue each register their consumers as
// EPHEMERAL children of one directory (the queue's consumers/), named
// <process id>~<nonce>: the process id says whose consumer it is, the
// random nonce makes the name one no one else uses, so a process can
// tell its own registrations apart and retry a create or delete whose
// answer was lost. From the listing, every process computes the same
// sorted set of consuming processes; its rank in that set is its share of
// the queue (splitShare in dispatch.go): it takes first the messages it
// published (when its publishes carry its tag, WithPublisher), then those
// of no consuming process whose sequence number is its rank modulo their
// count.
//
// Registrations made before names had nonces were sequential nodes,
// <process id>-<10-digit sequence>; they are still read.

// Registration names.
const (
	// registrationSep separates the process id from the nonce. The nonce
	// is hex, so the last separator is the one: a process id may contain
	// it.
	registrationSep = '~'
	// nonceBytes is the nonce's length before hex encoding.
	nonceBytes = 8
	// legacySep and legacySeqLen: the sequential suffix ZooKeeper gave
	// the registrations of older processes, "-" and 10 digits.
	legacySep    = '-'
	legacySeqLen = 10
)

// DefaultRankTTL is how long one listing of the registrations serves
// Rank: a process joining or leaving shifts the shares within it.
const DefaultRankTTL = time.Second

// ParseRegistration returns the process id of a registration's node name:
// "<id>~<nonce>", or "<id>-<10-digit sequence>" as older processes named
// them. ok is false for any other name.
func ParseRegistration(name string) (processID string, ok bool) {
	if i := strings.LastIndexByte(name, registrationSep); i > 0 {
		return name[:i], true
	}
	if i := len(name) - legacySeqLen - 1; i > 0 && name[i] == legacySep {
		return name[:i], true
	}
	return "", false
}

// Share is a process's place among the processes consuming a queue: its
// rank of N, and the publisher tag (PublisherTag) of the process of each
// rank, when known (WithOwners).
type Share struct {
	Rank, N    int
	Publishers []string
}

// shareOf returns id's share among the sorted, distinct ids. A process
// absent from them (it has no registered consumer) takes the whole queue:
// rank 0 of 1.
func shareOf(ids []string, id string) Share {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	rank := slices.Index(ids, id)
	if rank < 0 {
		return Share{Rank: 0, N: 1}
	}
	tags := make([]string, len(ids))
	for i, x := range ids {
		tags[i] = PublisherTag(x)
	}
	return Share{Rank: rank, N: len(ids), Publishers: tags}
}

// ConsumerGroupConfig configures a ConsumerGroup. Zero fields take the
// defaults.
type ConsumerGroupConfig struct {
	// Registry keeps the registrations Register makes through session
	// changes (run it: Registry.Run) and tells this process's own from
	// its previous process's. Default: a Registry of the group's own,
	// which nothing runs: a registration then lasts until Close or the
	// end of its session.
	Registry *Registry
	// Own, when set, reports instead of the Registry whether this
	// process's registration at path p (its name carries this process's
	// id) counts: for a process that keeps its registrations itself.
	Own func(p string) bool
	// WithoutCreate: Register does not create the directory (see
	// WithoutCreate; Catalog.Open sets it).
	WithoutCreate bool
	// RankTTL is how long one listing serves Rank (default
	// DefaultRankTTL).
	RankTTL time.Duration
	// ACL of dir when Register creates it, and of the registrations when
	// the group has a Registry of its own (see WithACL); default open.
	ACL []zk.ACL
}

// ConsumerGroup is the set of consumers of one queue across processes:
// the registrations under one directory, the count of live consumers, and
// this process's rank among the consuming processes, the share split of
// the queue's dispatcher (use WithShare(g.Rank)).
//
// A ConsumerGroup is safe for concurrent use.
type ConsumerGroup struct {
	conn *zk.Conn
	dir  string
	id   string
	cfg  ConsumerGroupConfig
	reg  *Registry // cfg.Registry, or the group's own

	rankMu sync.Mutex // held while listing for Share: one listing serves all callers
	share  Share      // this process's share at read
	read   time.Time  // when the registrations were last listed for Share
}

// NewConsumerGroup returns the group whose registrations are the children
// of dir, seen from the process processID. It does not touch ZooKeeper.
func NewConsumerGroup(conn *zk.Conn, dir, processID string, cfg ConsumerGroupConfig) (*ConsumerGroup, error) {
	if conn == nil {
		return nil, errors.New("zkqueue: nil zk conn")
	}
	if dir == "" || dir[0] != '/' || path.Clean(dir) != dir || dir == "/" {
		return nil, fmt.Errorf("zkqueue: bad consumers path %q", dir)
	}
	if processID == "" || strings.ContainsRune(processID, '/') {
		return nil, fmt.Errorf("zkqueue: bad process id %q", processID)
	}
	if cfg.RankTTL <= 0 {
		cfg.RankTTL = DefaultRankTTL
	}
	cfg.ACL = zkutil.ACLOr(cfg.ACL)
	reg := cfg.Registry
	if reg == nil {
		reg = NewRegistry(conn, RegistryConfig{ACL: cfg.ACL})
	}
	return &ConsumerGroup{conn: conn, dir: dir, id: processID, cfg: cfg, reg: reg}, nil
}

// NewRegistrationPath returns the path of a new registration of this
// process: <dir>/<process id>~<random nonce>, a name no one else uses.
func (g *ConsumerGroup) NewRegistrationPath() string {
	var n [nonceBytes]byte
	_, _ = rand.Read(n[:])
	return g.dir + "/" + g.id + string(registrationSep) + hex.EncodeToString(n[:])
}

// Registration is one consumer registered by Register.
type Registration struct {
	g    *ConsumerGroup
	kept *zkutil.Kept
}

// Register registers a consumer of this process: an EPHEMERAL node named
// NewRegistrationPath, creating the directory when missing (unless
// ConsumerGroupConfig.WithoutCreate). It lasts until Close, through
// session expiries while the group's Registry runs (see Registry). It
// returns once the node exists or, ZooKeeper being away, once the Registry
// has it to create. Errors: the context's; zk.ErrNoNode (wrapped) when the
// directory is missing and the group may not create it (its queue was
// deleted).
func (g *ConsumerGroup) Register(ctx context.Context) (*Registration, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := g.NewRegistrationPath()
	e, gone := g.reg.keep(p)
	if gone && !g.cfg.WithoutCreate {
		g.reg.keeper.Drop(e)
		if err := zkutil.EnsurePath(g.conn, g.dir, g.cfg.ACL); err != nil {
			return nil, fmt.Errorf("zkqueue: register: %w", err)
		}
		e, gone = g.reg.keep(p)
	}
	if gone {
		g.reg.keeper.Drop(e)
		return nil, fmt.Errorf("zkqueue: register %s: %w", p, zk.ErrNoNode)
	}
	return &Registration{g: g, kept: e}, nil
}

// Path returns the registration's node.
func (r *Registration) Path() string { return r.kept.Path() }

// Close deletes the registration: it no longer counts, and its node is
// deleted at once when ZooKeeper answers, else by the Registry's Run when
// it does, or with its session. It returns nil.
func (r *Registration) Close() error {
	r.g.reg.keeper.Drop(r.kept)
	return nil
}

// own reports whether this process's registration at p counts.
func (g *ConsumerGroup) own(p string) bool {
	if g.cfg.Own != nil {
		return g.cfg.Own(p)
	}
	return g.reg.own(p)
}

// Consumers returns the process id of each live consumer registration, one
// per consumer (a process with three consumers is listed three times).
// zk.ErrNoNode: the directory does not exist.
func (g *ConsumerGroup) Consumers(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	children, _, err := g.conn.Children(g.dir)
	if err != nil {
		return nil, fmt.Errorf("zkqueue: children %s: %w", g.dir, err)
	}
	ids := make([]string, 0, len(children))
	for _, c := range children {
		id, ok := ParseRegistration(c)
		if !ok || (id == g.id && !g.own(g.dir+"/"+c)) {
			continue
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// Count returns the number of live consumers on all processes; 0 when the
// directory does not exist.
func (g *ConsumerGroup) Count(ctx context.Context) (int, error) {
	ids, err := g.Consumers(ctx)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	return len(ids), err
}

// Rank returns this process's rank among the n processes with live
// consumers, read at most every RankTTL; its signature is WithShare's. A
// process without a live consumer, or one that cannot list them, takes
// the whole queue (0 of 1).
func (g *ConsumerGroup) Rank() (rank, n int) {
	sh := g.Share()
	return sh.Rank, sh.N
}

// Share is Rank with the publisher tags of the consuming processes; its
// signature is WithOwners'.
func (g *ConsumerGroup) Share() Share {
	g.rankMu.Lock()
	defer g.rankMu.Unlock()
	if g.read.IsZero() || time.Since(g.read) >= g.cfg.RankTTL {
		g.share = Share{Rank: 0, N: 1}
		if ids, err := g.Consumers(context.Background()); err == nil {
			g.share = shareOf(ids, g.id)
		}
		g.read = time.Now()
	}
	return g.share
}
