package zkqueue

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/qbroker/qbroker/internal/zkutil"
)

// Registry keeps a process's consumer registrations (ConsumerGroup.
// Register) through session changes, for all the queues it consumes. A
// create and a delete are not enough for an EPHEMERAL node that must exist
// exactly while its consumer lives:
//
//   - a create or delete whose answer is lost with the connection may or
//     may not have happened;
//   - a session expiry deletes the session's ephemeral nodes while the
//     process and its consumers go on;
//   - a process restarted under the same process id finds its previous
//     process's registrations there until that session expires.
//
// So a registration has a name no one else uses (<process id>~<nonce>),
// it counts for this process only while the Registry keeps it, and Run
// reconciles: every kept registration until it exists under the current
// session, every closed one until it is gone, retrying with backoff while
// ZooKeeper is away and again under every new session. A registration
// under this process's id that the Registry does not know of (its
// previous process's) is not counted, and Run deletes it.
//
// Share one Registry among the ConsumerGroups of a process
// (ConsumerGroupConfig.Registry, OpenConfig.Registry): a group opened anew
// for a queue (its metadata changed) must know the registrations made
// through the old one. A Registry is safe for concurrent use.
type Registry struct {
	conn   *zk.Conn
	keeper *zkutil.Keeper
}

// RegistryConfig configures a Registry.
type RegistryConfig struct {
	// ACL of the registrations (see WithACL); default open.
	ACL []zk.ACL
	// Logger receives the replacements of an earlier session's
	// registrations and the retries (default: discarded).
	Logger *slog.Logger
}

// registryPoll is how often Run looks whether the session is back, a
// local read of the client's state.
const registryPoll = 100 * time.Millisecond

// NewRegistry returns a Registry of the registrations on conn. It makes no
// request. Without Run, a registration is made at once when ZooKeeper
// answers, and lasts until it is closed or the session ends.
func NewRegistry(conn *zk.Conn, cfg RegistryConfig) *Registry {
	k := zkutil.NewKeeper(cfg.Logger)
	k.Bind(conn, cfg.ACL)
	return &Registry{conn: conn, keeper: k}
}

// Wake makes Run reconcile now; a process that sees its session events may
// call it whenever the session is back, which Run otherwise notices
// within 100 ms. It never blocks.
func (r *Registry) Wake() { r.keeper.Wake() }

// Run keeps the registrations until ctx ends (see Registry); its caller
// owns the goroutine. It makes no request while nothing changes.
func (r *Registry) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.keeper.Run(ctx) }()
	defer wg.Wait()
	t := time.NewTicker(registryPoll)
	defer t.Stop()
	connected, sid := false, int64(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Back in session, the same or a new one (seen by its id when the
		// session changed between two looks): what failed meanwhile
		// (deletes of closed registrations, a new session's creates) is
		// retried now.
		now := r.conn.State() == zk.StateHasSession
		if now && (!connected || r.conn.SessionID() != sid) {
			sid = r.conn.SessionID()
			r.keeper.Wake()
		}
		connected = now
	}
}

// keep makes the registration p exist until drop; gone: its parent is
// missing (only known when ZooKeeper answered at once).
func (r *Registry) keep(p string) (e *zkutil.Kept, gone bool) {
	e = r.keeper.Keep(p, nil)
	return e, e.Gone()
}

// own reports whether this process's registration p counts: only while
// kept. One the Registry does not know of is deleted by Run.
func (r *Registry) own(p string) bool {
	known, wanted := r.keeper.Tracked(p)
	if !known {
		r.keeper.Stray(p)
	}
	return wanted
}
